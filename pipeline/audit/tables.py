"""Where each night's run writes, and its tables as Arrow (for the report, the changes and
``latest/``), in any output format (pipeline/formats/).

* A format with one run per folder (Parquet, the default): the night's run is the run
  folder ``OUTPUT/run_date=D/`` (documents/, sentences/, errors/, ``_manifest.json``).
* A warehouse format (Iceberg, Delta Lake): the audit root is one warehouse; each night's
  run appends to its tables with the run id ``audit-D`` in its commits, and keeps its
  state and manifest under ``OUTPUT/_runs/audit-D/``. ``OUTPUT/run_date=D/`` then holds
  the night's report only.

A night that already ran is read where its manifest is, whatever the format configured
now, so an audit root that switched format still reads its earlier nights.
"""

from __future__ import annotations

from collections.abc import Callable

from docintel.pipeline import formats, registry
from docintel.pipeline.audit.state import AuditLayout
from docintel.pipeline.config import Config
from docintel.pipeline.formats import TableFormat
from docintel.pipeline.output.sink import MANIFEST, RUN_STATE, read_json
from docintel.pipeline.output.tables import RunTables

NightTables = Callable[[str], RunTables]  # a night's date -> its run's tables


def run_id_of(day: str) -> str:
    """The run id of the night ``day``'s run (its resume key, and its commits')."""
    return f"audit-{day}"


def _output(fmt: TableFormat, lay: AuditLayout, day: str) -> str:
    """Where a night's run of format ``fmt`` writes: the audit root (a warehouse) or the
    night's partition."""
    return lay.root if fmt.warehouse else lay.partition(day)


def run_output(cfg: Config, lay: AuditLayout, day: str) -> str:
    """The output the night's run writes to: its partition, or the audit root's warehouse."""
    return lay.uri(_output(formats.get(cfg.output.format), lay, day))


def run_started(cfg: Config, lay: AuditLayout, day: str) -> str | None:  # noqa: ARG001
    """The run state of the night's run when one was started (any format), else None."""
    for fmt in formats.FORMATS:
        path = f"{fmt.run_home(_output(fmt, lay, day), run_id_of(day))}/{RUN_STATE}"
        if lay.exists(path):
            return path
    return None


def night_tables(cfg: Config, lay: AuditLayout) -> NightTables:
    """A night's run as tables, in the format its manifest names (found where a run of
    each format keeps it); a night with none (nothing committed) in ``cfg``'s format."""

    def night(day: str) -> RunTables:
        run_id = run_id_of(day)
        chosen = formats.get(cfg.output.format)
        homes = {fmt.run_home(_output(fmt, lay, day), run_id) for fmt in formats.FORMATS}
        for home in sorted(homes):
            manifest = read_json(lay.fs, f"{home}/{MANIFEST}")
            if manifest is not None:
                chosen = formats.of_manifest(manifest)
                break
        return chosen.run_tables(lay.fs, _output(chosen, lay, day), cfg, run_id)

    return night


def check_output(cfg: Config, lay: AuditLayout, labels: list[str]) -> None:
    """Refuse (exit 2) what the night's run would refuse, before the audit stages
    anything: with a warehouse format, an s3:// audit root it cannot use, a catalog that
    cannot be reached, tables the night's rows do not fit."""
    fmt = formats.get(cfg.output.format)
    stages = [spec.name for spec in registry.chain(cfg)]
    fmt.check_output(lay.fs, lay.root, cfg, labels, stages)
