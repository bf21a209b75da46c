"""What a table format is to the rest of docintel: :class:`TableFormat`.

A format owns four things, and nothing outside its module knows them:

* its **sink** (:class:`~docintel.pipeline.output.sink.RunSink`): how a run writes
  OUTPUT, exactly once, from open to commit;
* its **reader** (:class:`~docintel.pipeline.output.tables.RunTables`): one
  committed run's tables as Arrow, for the audit's report, changes and ``latest/`` view,
  and for ``docintel search`` / ``docintel index``;
* its **marker files** and its **detection** (:meth:`TableFormat.holds`): what in OUTPUT
  says "this format's output is here", so that a run never writes one format among
  another's files, and a reader opens an output in the format that wrote it.

The run (pipeline/output/protocol.py), the audit (pipeline/audit/tables.py) and search
(pipeline/search/source.py) ask the registry (``docintel.pipeline.formats``) and these
methods; they never branch on a format's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

import pyarrow.fs as pafs

from docintel.pipeline.config import Config
from docintel.pipeline.output.sink import RunSink
from docintel.pipeline.output.tables import RunTables

RUNS = "_runs"  # a warehouse format's per-run files: OUTPUT/_runs/<run id>/


class TableFormat(ABC):
    """One table format (see the module docstring). Instances are stateless singletons."""

    name: ClassVar[str]  # [output] format, --format
    what: ClassVar[str]  # how a message names an output of this format
    # A warehouse: every run appends to the same tables in OUTPUT and keeps its own files
    # (run state, manifest, staged batches) under OUTPUT/_runs/<run id>/. Otherwise one
    # run per folder, its run state and manifest at the folder's top.
    warehouse: ClassVar[bool] = False

    @abstractmethod
    def holds(self, fs: pafs.FileSystem, root: str, names: set[str]) -> bool:
        """Does the output ``root`` (whose top-level entries are ``names``) hold this
        format's output?"""

    # The sink class a run writes this format with (constructed as below)
    sink_class: ClassVar[Callable[..., RunSink]]

    def sink(
        self,
        fs: pafs.FileSystem,
        root: str,
        cfg: Config,
        labels: Sequence[str],
        stages: Sequence[str] = (),
    ) -> RunSink:
        """The sink a run with ``cfg`` writes the output ``root`` with."""
        return self.sink_class(fs, root, cfg, labels, stages)

    @abstractmethod
    def run_tables(
        self, fs: pafs.FileSystem, root: str, cfg: Config, run_id: str | None
    ) -> RunTables:
        """The tables of the run ``run_id`` in the output ``root``; ``None``: the run the
        output holds (a warehouse: its latest committed run). InputError (exit 2) when a
        warehouse holds no committed run."""

    def run_home(self, root: str, run_id: str) -> str:
        """Where the run ``run_id`` of the output ``root`` keeps its state and manifest."""
        return f"{root}/{RUNS}/{run_id}" if self.warehouse else root

    def check_output(
        self,
        fs: pafs.FileSystem,
        root: str,
        cfg: Config,
        labels: Sequence[str],
        stages: Sequence[str],
    ) -> None:
        """Refuse (exit 2) what a run into ``root`` would refuse, before anything is staged
        (the nightly audit asks before its night's work): a warehouse that cannot be
        reached, tables the rows do not fit."""
        if self.warehouse:
            self.sink(fs, root, cfg.with_overrides({"run.run_id": ""}), labels, stages).open()
