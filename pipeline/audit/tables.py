"""Where each night's run writes, and its tables as Arrow (for the report, the changes and
``latest/``), in either output format.

* ``[output] format = "parquet"`` (the default): the night's run is the Parquet run folder
  ``OUTPUT/run_date=D/`` (documents/, sentences/, errors/, ``_manifest.json``).
* ``[output] format = "iceberg"``: the audit root is one Iceberg warehouse (the embedded
  catalog ``OUTPUT/_catalog.db``, or the configured ``[output] catalog_uri``); each night's
  run appends its snapshots to the tables ``<namespace>.documents/sentences/errors`` with
  the run id ``audit-D`` in their summaries, and keeps its state and manifest under
  ``OUTPUT/_runs/audit-D/``. ``OUTPUT/run_date=D/`` then holds the night's report only.

A night that already ran is read where its manifest is, whatever the format configured
now, so an audit root that switched format still reads its earlier nights.
"""

from __future__ import annotations

from collections.abc import Callable

from docintel.pipeline import registry
from docintel.pipeline.audit.state import AuditLayout
from docintel.pipeline.config import Config
from docintel.pipeline.sink import MANIFEST, RUN_STATE
from docintel.pipeline.sink_iceberg import IcebergSink
from docintel.pipeline.tables import IcebergRun, ParquetRun, RunTables

NightTables = Callable[[str], RunTables]  # a night's date -> its run's tables


def run_id_of(day: str) -> str:
    """The run id of the night ``day``'s run (its resume key, and its Iceberg snapshots')."""
    return f"audit-{day}"


def iceberg(cfg: Config) -> bool:
    return cfg.output.format == "iceberg"


def run_output(cfg: Config, lay: AuditLayout, day: str) -> str:
    """The output the night's run writes to: its partition, or the audit root's warehouse."""
    return lay.uri(lay.root if iceberg(cfg) else lay.partition(day))


def run_started(cfg: Config, lay: AuditLayout, day: str) -> str | None:
    """The run state of the night's run when one was started (either format), else None."""
    sink = IcebergSink(lay.fs, lay.root, cfg.with_overrides({"run.run_id": run_id_of(day)}), ())
    for path in (f"{lay.partition(day)}/{RUN_STATE}", f"{sink.run_dir}/{RUN_STATE}"):
        if lay.exists(path):
            return path
    return None


def night_tables(cfg: Config, lay: AuditLayout) -> NightTables:
    """A night's run as tables: Parquet when its partition holds the manifest, Iceberg when
    the warehouse does; a night with neither (nothing committed) in ``cfg``'s format."""

    def night(day: str) -> RunTables:
        parquet = ParquetRun(lay.fs, lay.partition(day))
        ice = IcebergRun(lay.fs, lay.root, cfg, run_id_of(day))
        if lay.exists(f"{parquet.root}/{MANIFEST}"):
            return parquet
        if lay.exists(f"{ice.sink.run_dir}/{MANIFEST}"):
            return ice
        return ice if iceberg(cfg) else parquet

    return night


def check_iceberg_output(cfg: Config, lay: AuditLayout, labels: list[str]) -> None:
    """With Iceberg output, refuse (exit 2) what the night's run would refuse, before the
    audit stages anything: an s3:// audit root without a catalog, a catalog that cannot be
    reached, tables the night's rows do not fit."""
    if iceberg(cfg):
        stages = tuple(spec.name for spec in registry.chain(cfg))
        cfg = cfg.with_overrides({"run.run_id": ""})
        IcebergSink(lay.fs, lay.root, cfg, tuple(labels), stages).open()
