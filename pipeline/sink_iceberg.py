"""Iceberg output (``[output] format = "iceberg"``): OUTPUT is a warehouse of three Apache
Iceberg tables, ``<namespace>.documents``, ``.sentences`` and ``.errors``, that every run
appends to, exactly once per batch, with the same resume as Parquet output.

Where things live (a local OUTPUT, no catalog configured)::

    OUTPUT/_catalog.db                      the embedded pyiceberg SQL catalog (SQLite)
    OUTPUT/<namespace>/<table>/{data,metadata}/   the tables (the warehouse is OUTPUT)
    OUTPUT/_runs/<run id>/_run.json         the run's state and plan key, written first
    OUTPUT/_runs/<run id>/staged/<table>/part-<batch id>.parquet   written, not committed
    OUTPUT/_runs/<run id>/_manifest.json    written last: the run is complete

With ``[output] catalog_uri`` (a REST catalog, or any pyiceberg catalog type) the tables
live where that catalog puts them; the run's own files stay under OUTPUT/_runs/. An
s3:// OUTPUT needs a configured catalog (SQLite cannot live on S3).

The protocol:

* A write task stages its batch as Parquet parts under ``staged/`` exactly as the Parquet
  sink writes a batch (:class:`~docintel.pipeline.sink.ParquetPartsSink`, documents part
  last, the batch's stats in its footer): a staged batch whose documents part exists is
  complete.
* The driver (:meth:`IcebergSink.written`, called as each batch is recorded) collects
  staged batches until they weigh about ``run.part_target_mb``, then commits the group:
  one append per table (errors, sentences, documents last), each a single data file of
  the group's rows, each snapshot's summary holding the run id, the model versions and
  the batch ids it adds (documents: every batch's counts too). Then the group's staged
  parts are deleted. :meth:`IcebergSink.finish` commits what is left.
* Exactly once: before each append the table's snapshots are read again, and batches that
  a snapshot of this run already holds are left out of it (a crash between two tables'
  appends, a commit whose answer was lost). A failed append is retried only after that
  re-read; pyiceberg itself retries optimistic-concurrency conflicts
  (CommitFailedException) on fresh metadata.
* Resume: the committed batch ids (and their counts) are read back from the documents
  table's snapshots of this run; staged batches that are complete but not committed are
  committed, not recomputed; only the missing batches run.

Reading one run's rows back (the nightly audit's report, changes and latest/ view):
:meth:`IcebergSink.run_data_files` lists the data files the run's snapshots added, found
by the run id in their summaries (pipeline/tables.py reads them as Arrow).

Why the run state is a file and not a snapshot property: a run must be resumable (and its
plan checked) before its first commit, and the plan key holds one record per input file,
too big to repeat in every snapshot summary. The snapshot summaries hold what must be
atomic with the data: which batches a commit added.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline.batch import Batch
from docintel.pipeline.config import Config
from docintel.pipeline.errors import OutputError, RunFailed, UsageError
from docintel.pipeline.schema import ERRORS_SCHEMA, documents_schema, sentences_schema
from docintel.pipeline.sink import (
    ICEBERG_MARKERS,
    MANIFEST,
    RUN_STATE,
    TABLES,
    BatchStats,
    Existing,
    ParquetPartsSink,
    RunSink,
    TaskMap,
    atomic_write,
    delete_parts,
    part_keys,
    part_path,
    read_batch_stats,
    read_json,
)
from docintel.pipeline.storage import display_uri, is_local

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

CATALOG_NAME = "docintel"  # also the PYICEBERG_CATALOG__DOCINTEL__* variables' name
CATALOG_DB, RUNS = ICEBERG_MARKERS  # the catalog's SQLite file; per-run state and staging
STAGED = "staged"
PARQUET_MARKERS = (MANIFEST, RUN_STATE, *TABLES)  # a Parquet run's output: not a warehouse
# snapshot summary keys
RUN_ID_KEY = "docintel.run-id"
BATCHES_KEY = "docintel.batches"  # JSON list of the batch ids the snapshot adds
STATS_KEY = "docintel.batch-stats"  # documents snapshots: each batch's counts
MODELS_KEY = "docintel.models"
COMMIT_ORDER = ("errors", "sentences", "documents")  # documents last: the batch's commit
COMMIT_ATTEMPTS = 5  # per table and group, each after re-reading the table's snapshots
RETRY_WAIT_S = 0.5  # doubled per attempt
# Parquet dictionaries of at most 64 KiB a column: labels, backends and model names fit; an
# embedding column overflows at once and falls back to plain encoding instead of wasting
# pyiceberg's default 2 MiB first (-25% on a sentences file with embeddings, 4.98 -> 3.76 MB
# for the demo corpus; docintel's Parquet parts skip dictionaries for floats altogether).
TABLE_PROPERTIES = {"write.parquet.dict-size-bytes": str(64 * 1024)}
_USERINFO = re.compile(r"//[^/\s@]*@")


def _redact(text: str) -> str:
    """An error text without userinfo (a URI from the environment may hold one)."""
    return _USERINFO.sub("//***@", text)[:300]


def _schema_difference(table: Any, want: pa.Schema) -> str | None:
    """The first column where an existing Iceberg table cannot take rows of ``want``."""
    from pyiceberg.catalog import Catalog

    have = table.schema()
    wanted = Catalog._convert_schema_if_needed(want)
    names = set()
    for f in wanted.fields:
        names.add(f.name)
        try:
            got = have.find_field(f.name)
        except ValueError:
            return f"column {f.name!r} is missing (docintel writes {f.field_type})"
        if str(got.field_type) != str(f.field_type):
            return f"column {f.name!r} is {got.field_type}, docintel writes {f.field_type}"
        if got.required and not f.required:
            return f"column {f.name!r} is required, docintel writes it with nulls"
    for f in have.fields:
        if f.name not in names and f.required:
            return f"column {f.name!r} is required, docintel does not write it"
    return None


@dataclass
class _Pending:
    stats: BatchStats
    nbytes: int  # its staged parts, all tables


@dataclass
class _Driver:
    """The driver's side of a run (never pickled into write tasks)."""

    catalog: Any = None
    models: dict[str, str] = field(default_factory=dict)
    done: dict[str, set[str]] = field(default_factory=lambda: {t: set() for t in TABLES})
    pending: list[_Pending] = field(default_factory=list)
    snapshots: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {t: [] for t in TABLES}
    )
    commits: int = 0  # table appends this invocation (the fault counts them)
    attempts: int = 0  # table append attempts this invocation (a fault counts them)
    lost_answers: int = 0  # appends that raised after landing, found by their batch ids
    groups: int = 0
    commit_seconds: float = 0.0  # reading staged parts, writing data files, committing


class IcebergSink(RunSink):
    """Batches staged by write tasks, committed to Iceberg tables by the driver in groups."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        root: str,
        cfg: Config,
        labels: tuple[str, ...],
        stages: tuple[str, ...] = (),
    ) -> None:
        self.fs, self.root = fs, root
        self.labels, self.stages = labels, stages
        self.embeddings = cfg.run.embeddings
        self.output = cfg.output
        self.storage = cfg.storage
        self.run_id = cfg.run.run_id
        self.target_bytes = int(cfg.run.part_target_mb * 2**20)
        self.lose_commit = cfg.faults.sink_commit_lost
        self.catalog_down = cfg.faults.sink_catalog_down
        self._d: _Driver | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_d": None}  # write tasks need no catalog

    # --- names -----------------------------------------------------------------------

    @property
    def uri(self) -> str:
        return display_uri(self.fs, self.root)

    @property
    def run_dir(self) -> str:
        return f"{self.root}/{RUNS}/{self.run_id}"

    @property
    def staging(self) -> ParquetPartsSink:
        root = f"{self.run_dir}/{STAGED}"
        return ParquetPartsSink(self.fs, root, self.labels, self.embeddings)

    def ident(self, table: str) -> tuple[str, str]:
        return (self.output.namespace, table)

    @property
    def catalog_name(self) -> str:
        if self.output.catalog_uri:
            return f"{self.output.catalog_type or 'rest'} catalog {self.output.catalog_uri}"
        return f"SQL catalog {self.uri}/{CATALOG_DB}"

    @property
    def d(self) -> _Driver:
        if self._d is None:
            self._d = _Driver()
        return self._d

    # --- the catalog -----------------------------------------------------------------

    def _properties(self) -> dict[str, str]:
        out = self.output
        if not out.catalog_uri:
            root = self.root  # absolute (resolve_output)
            return {"uri": f"sqlite:///{root}/{CATALOG_DB}", "warehouse": f"file://{root}"}
        props = {"type": out.catalog_type or "rest", "uri": out.catalog_uri}
        if props["type"] == "sql":
            props["warehouse"] = self.uri
        if self.storage.s3_endpoint:
            props["s3.endpoint"] = self.storage.s3_endpoint
        if self.storage.s3_region:
            props["s3.region"] = self.storage.s3_region
        return {**props, **out.catalog_properties}

    def catalog(self, create: bool) -> Catalog | None:
        """The run's catalog (one per driver process); None for an embedded catalog that
        does not exist yet when ``create`` is false (nothing to check, nothing written)."""
        if self.d.catalog is not None:
            return self.d.catalog
        embedded = not self.output.catalog_uri
        db = f"{self.root}/{CATALOG_DB}"
        if embedded and not create and self.fs.get_file_info(db).type != pafs.FileType.File:
            return None
        if embedded:
            self.fs.create_dir(self.root, recursive=True)  # an OS error: output.py's message
        try:
            if embedded:
                from pyiceberg.catalog.sql import SqlCatalog

                cat: Catalog = SqlCatalog(CATALOG_NAME, **self._properties())
            else:
                from pyiceberg.catalog import load_catalog

                cat = load_catalog(CATALOG_NAME, **self._properties())
            cat.list_namespaces()  # reached, and answering
        except Exception as e:  # a refused connection is an OSError too: name the catalog
            raise OutputError(
                f"Iceberg {self.catalog_name} cannot be used: {type(e).__name__}: "
                f"{_redact(str(e))}. Nothing was done: check [output] catalog_uri / "
                "catalog_type and that the catalog is running"
            ) from e
        self.d.catalog = cat
        return cat

    def _load(self, table: str) -> Table | None:
        from pyiceberg.exceptions import NoSuchTableError

        cat = self.catalog(create=True)
        assert cat is not None
        try:
            return cat.load_table(self.ident(table))
        except NoSuchTableError:
            return None

    def _expected(self) -> dict[str, pa.Schema]:
        """The tables' schemas as far as the driver knows them before any batch (user
        stages' own sentence columns come with the first batch)."""
        dim = 1 if self.embeddings else None  # Iceberg has list<float>, whatever the size
        return {
            "documents": documents_schema(list(self.labels)),
            "sentences": sentences_schema(dim, self.stages),
            "errors": ERRORS_SCHEMA,
        }

    def _check_tables(self) -> None:
        """Refuse (exit 2) existing tables this run's rows do not fit, naming the column."""
        cat = self.catalog(create=False)
        if cat is None:
            return
        from pyiceberg.exceptions import NoSuchTableError

        for name, schema in self._expected().items():
            try:
                table = cat.load_table(self.ident(name))
            except NoSuchTableError:
                continue
            diff = _schema_difference(table, schema)
            if diff is not None:
                raise UsageError(
                    f"Iceberg table {'.'.join(self.ident(name))} in {self.catalog_name} does "
                    f"not fit this run: {diff}. Nothing was done: write to another namespace "
                    "([output] namespace) or output, or run with the settings that made it"
                )

    # --- RunSink: driver -------------------------------------------------------------

    def open(self) -> Existing:
        self._refuse_foreign()
        self._check_tables()
        if not self.run_id:
            return Existing(None, None)
        manifest = read_json(self.fs, f"{self.run_dir}/{MANIFEST}")
        state = None if manifest is not None else read_json(self.fs, f"{self.run_dir}/{RUN_STATE}")
        if state is not None:
            self.d.models = dict((state.get("plan") or {}).get("models") or {})
        return Existing(manifest, state)

    def _refuse_foreign(self) -> None:
        if not is_local(self.fs) and not self.output.catalog_uri:
            raise UsageError(
                f"output {self.uri} with --format iceberg needs a catalog: the embedded SQLite "
                "catalog works on local outputs only. Set [output] catalog_uri (and "
                "catalog_type) to a REST or SQL catalog, or write to a local folder"
            )
        if self.fs.get_file_info(self.root).type == pafs.FileType.File:
            raise UsageError(f"output {self.uri} is a file; give a folder")
        found = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        if any(i.base_name in PARQUET_MARKERS for i in found):
            raise UsageError(
                f"output {self.uri} holds Parquet output of docintel (documents/, "
                "_manifest.json), not an Iceberg warehouse; choose another folder for "
                "--format iceberg"
            )

    def start(self, state: dict[str, Any]) -> None:
        self.run_id = state["run_id"]
        self._refuse_foreign()
        self.d.models = dict(state["plan"]["models"])
        atomic_write(self.fs, f"{self.run_dir}/{RUN_STATE}", json.dumps(state).encode())
        cat = self.catalog(create=True)
        assert cat is not None
        cat.create_namespace_if_not_exists(self.output.namespace)
        expected = self._expected()
        for name in ("documents", "errors"):  # sentences: with its first rows' schema
            self._table(name, expected[name])

    def resume(self) -> dict[str, BatchStats]:
        """This run's committed batches (from the tables' snapshots) and its staged,
        complete batches (from their footers: they are committed next, not recomputed).
        Staged parts of batches already committed (a crash before their deletion) go."""
        committed = self._read_committed()
        stale: list[str] = []
        for batch_id in part_keys(self.fs, self.staging.root, "documents"):
            if batch_id in committed:
                stale += [part_path(self.staging.root, t, batch_id) for t in TABLES]
                continue
            stats = read_batch_stats(self.fs, self.staging.root, batch_id)
            committed[batch_id] = stats
            self.d.pending.append(_Pending(stats, self._staged_bytes(batch_id)))
        delete_parts(self.fs, stale)
        return committed

    def _read_committed(self) -> dict[str, BatchStats]:
        """Every table's batch ids committed by this run (into ``done``), the documents
        table's with their counts, and this run's snapshots (for the manifest)."""
        d = self.d
        out: dict[str, BatchStats] = {}
        for name in TABLES:
            table = self._load(name)
            for snap in self._run_snapshots(table):
                props = snap.summary.additional_properties
                d.done[name].update(json.loads(props[BATCHES_KEY]))
                d.snapshots[name].append(_snapshot_record(snap))
                if name == "documents":
                    for batch_id, s in json.loads(props.get(STATS_KEY, "{}")).items():
                        out[batch_id] = BatchStats(**s)
        return out

    def _run_snapshots(self, table: Table | None) -> list[Any]:
        if table is None:
            return []
        return [
            s
            for s in table.metadata.snapshots
            if s.summary is not None
            and s.summary.additional_properties.get(RUN_ID_KEY) == self.run_id
            and BATCHES_KEY in s.summary.additional_properties
        ]

    def written(self, stats: BatchStats) -> None:
        """A write task staged a batch: commit a group once the staged batches reach the
        part target (0: every batch on its own)."""
        self.d.pending.append(_Pending(stats, self._staged_bytes(stats.batch_id)))
        while self._pending_bytes() >= max(self.target_bytes, 1):
            self._commit_group(self._take_group())

    def _staged_bytes(self, batch_id: str) -> int:
        paths = [part_path(self.staging.root, t, batch_id) for t in TABLES]
        return sum(i.size or 0 for i in self.fs.get_file_info(paths))

    def _pending_bytes(self) -> int:
        return sum(p.nbytes for p in self.d.pending)

    def _take_group(self) -> list[_Pending]:
        """The oldest staged batches up to the part target (at least one)."""
        group: list[_Pending] = []
        total = 0
        while self.d.pending:
            nxt = self.d.pending[0]
            if group and total + nxt.nbytes > self.target_bytes:
                break
            group.append(self.d.pending.pop(0))
            total += nxt.nbytes
        return group

    def finish(self, task_map: TaskMap) -> dict[str, Any]:  # noqa: ARG002
        """Commit the staged batches that are left, in groups up to the part target (on
        the driver: the catalog's client lives here; ``task_map`` is not needed)."""
        t0 = time.perf_counter()
        while self.d.pending:
            self._commit_group(self._take_group())
        return {
            "commit_groups": self.d.groups,
            "lost_commit_answers": self.d.lost_answers,
            "seconds": round(time.perf_counter() - t0, 3),
            "commit_seconds": round(self.d.commit_seconds, 3),  # every group, this invocation
        }

    # --- committing a group ----------------------------------------------------------

    def _commit_group(self, group: list[_Pending]) -> None:
        """Append the group's rows to each table (documents last), leaving out batches a
        snapshot of this run already holds; then delete its staged parts."""
        d = self.d
        t0 = time.perf_counter()
        ids = [p.stats.batch_id for p in group]
        for name in COMMIT_ORDER:
            todo = [b for b in ids if b not in d.done[name]]
            data = self._staged_rows(name, todo)
            if todo:
                self._table(name, data.schema)  # exists, even with no rows to add
            if data.num_rows:
                props = {
                    RUN_ID_KEY: self.run_id,
                    BATCHES_KEY: json.dumps(todo),
                    MODELS_KEY: json.dumps(d.models, sort_keys=True),
                }
                if name == "documents":
                    props[STATS_KEY] = json.dumps(
                        {p.stats.batch_id: _stats_record(p.stats) for p in group}
                    )
                self._append_once(name, data, props, todo)
            d.done[name].update(todo)
        d.groups += 1
        staged = [part_path(self.staging.root, t, b) for t in TABLES for b in ids]
        delete_parts(self.fs, staged)
        d.commit_seconds += time.perf_counter() - t0

    def _staged_rows(self, table: str, batch_ids: list[str]) -> pa.Table:
        parts = []
        for batch_id in batch_ids:
            with self.fs.open_input_file(part_path(self.staging.root, table, batch_id)) as f:
                parts.append(pq.read_table(f).replace_schema_metadata(None))
        if not parts:
            return pa.table({})
        return pa.concat_tables(parts)

    def _append_once(
        self, name: str, data: pa.Table, props: dict[str, str], todo: list[str]
    ) -> None:
        """One append of ``data``, exactly once: before every attempt the table's snapshots
        are read again, and an append that landed (its answer lost) is not repeated."""
        from pyiceberg.exceptions import CommitFailedException

        last: Exception | None = None
        for attempt in range(COMMIT_ATTEMPTS):
            if attempt:
                time.sleep(RETRY_WAIT_S * 2 ** (attempt - 1))
            table = self._table(name, data.schema)
            landed = self._landed(table, todo)
            if landed is not None:
                self.d.lost_answers += 1
                self.d.snapshots[name].append(_snapshot_record(landed))
                return
            try:
                self._unreachable()
                table.append(data, snapshot_properties=props)
                self._fault()
            except ValueError as e:  # the rows do not fit the table: no retry helps
                raise RunFailed(
                    f"Iceberg table {'.'.join(self.ident(name))} refused run "
                    f"{self.run_id!r}'s rows: {e}"
                ) from e
            except CommitFailedException as e:  # conflicts pyiceberg's own retries gave up on
                last = e
                continue
            except Exception as e:  # a lost answer, a dropped connection: re-read, then retry
                last = e
                continue
            snap = self._landed(table, todo)
            assert snap is not None, "an append that returned left no snapshot"
            self.d.snapshots[name].append(_snapshot_record(snap))
            return
        raise RunFailed(
            f"Iceberg table {'.'.join(self.ident(name))} in {self.catalog_name}: "
            f"{COMMIT_ATTEMPTS} commits failed, the last with {type(last).__name__}: "
            f"{_redact(str(last))}. What was committed stays; rerun with --run-id "
            f"{self.run_id} to resume"
        ) from last

    def _table(self, name: str, schema: pa.Schema) -> Table:
        """The table as the catalog has it now (created on its first commit, with the
        schema of the rows: a sentences table gets its embedding and user columns)."""
        table = self._load(name)
        if table is not None:
            return table
        cat = self.catalog(create=True)
        assert cat is not None
        return cat.create_table_if_not_exists(
            self.ident(name), schema=schema, properties=TABLE_PROPERTIES
        )

    def _landed(self, table: Table, todo: list[str]) -> Any:
        """The snapshot of this run that holds any of ``todo``, or None."""
        want = set(todo)
        for snap in self._run_snapshots(table):
            if want & set(json.loads(snap.summary.additional_properties[BATCHES_KEY])):
                return snap
        return None

    def _unreachable(self) -> None:
        """Tests ([faults] sink_catalog_down = N): from the N-th append attempt on, the
        catalog cannot be reached; nothing lands."""
        self.d.attempts += 1
        if self.catalog_down and self.d.attempts >= self.catalog_down:
            raise ConnectionError("injected fault ([faults] sink_catalog_down): no catalog")

    def _fault(self) -> None:
        """Tests ([faults] sink_commit_lost = N): the N-th append raises after landing."""
        self.d.commits += 1
        if self.lose_commit and self.d.commits == self.lose_commit:
            raise OSError(
                "injected fault ([faults] sink_commit_lost): the catalog committed, but "
                "its answer was lost"
            )

    # --- readers --------------------------------------------------------------------

    def run_data_files(self, table: str) -> list[tuple[str, Callable[[], Any]]]:
        """(path, opener) of each data file this run's snapshots added to ``table``, in
        commit order: exactly the run's rows (docintel appends each batch once and deletes
        nothing). The manifests read are those the run's snapshots wrote, never the whole
        table's (pipeline/tables.py's :class:`IcebergRun` reads through this)."""
        from pyiceberg.exceptions import NoSuchTableError
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

        cat = self.catalog(create=False)
        if cat is None:
            return []
        try:
            tbl = cat.load_table(self.ident(table))
        except NoSuchTableError:
            return []
        out = []
        for snap in self._run_snapshots(tbl):
            for m in snap.manifests(tbl.io):
                if m.added_snapshot_id != snap.snapshot_id or m.content != ManifestContent.DATA:
                    continue
                for e in m.fetch_manifest_entry(tbl.io, discard_deleted=True):
                    if e.status == ManifestEntryStatus.ADDED and e.snapshot_id == snap.snapshot_id:
                        path = e.data_file.file_path
                        out.append((path, functools.partial(_open_data_file, tbl.io, path)))
        return out

    # --- the end of a run ------------------------------------------------------------

    def table_files(self) -> dict[str, dict[str, int]]:
        """This run's data files and bytes per table (from its snapshots' summaries)."""
        return {
            t: {
                "files": sum(s["added_files"] for s in self.d.snapshots[t]),
                "bytes": sum(s["added_bytes"] for s in self.d.snapshots[t]),
            }
            for t in TABLES
        }

    def commit(self, manifest: dict[str, Any]) -> None:
        """The run's manifest, with the tables and this run's snapshot ids, written last
        under OUTPUT/_runs/<run id>/ (the Iceberg tables were committed batch by batch)."""
        manifest = {
            **manifest,
            "format": "iceberg",
            "iceberg": {
                "catalog": self.catalog_name,
                "namespace": self.output.namespace,
                "tables": {
                    t: {
                        "identifier": ".".join(self.ident(t)),
                        "snapshot_ids": [s["snapshot_id"] for s in self.d.snapshots[t]],
                    }
                    for t in TABLES
                },
            },
        }
        payload = json.dumps(manifest, indent=2, default=str).encode()
        atomic_write(self.fs, f"{self.run_dir}/{MANIFEST}", payload)
        with contextlib.suppress(OSError):
            self.fs.delete_dir(f"{self.run_dir}/{STAGED}")

    def abort(self) -> None:
        """Nothing to undo: staged batches and committed snapshots are what a resume with
        the same run id builds on."""

    def write(self, batch: Batch) -> BatchStats:
        """On a worker: stage the batch's three parts (documents last, stats in its
        footer) under OUTPUT/_runs/<run id>/staged/."""
        return self.staging.write(batch)


def _open_data_file(io: Any, path: str) -> Any:
    """A data file of a table, opened through the table's FileIO (any warehouse)."""
    return io.new_input(path).open(seekable=True)


def _stats_record(stats: BatchStats) -> dict[str, Any]:
    return {k: v for k, v in asdict(stats).items() if k != "seconds"}


def _snapshot_record(snap: Any) -> dict[str, Any]:
    props = snap.summary.additional_properties
    return {
        "snapshot_id": snap.snapshot_id,
        "added_files": int(props.get("added-data-files", 0)),
        "added_bytes": int(props.get("added-files-size", 0)),
    }
