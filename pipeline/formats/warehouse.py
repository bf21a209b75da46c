"""What every warehouse format shares (Iceberg, Delta Lake): OUTPUT holds three tables,
``documents``, ``sentences`` and ``errors``, that every run appends to, exactly once per
batch, with the same resume as Parquet output. A format module adds only how it talks to
its tables (:class:`WarehouseSink`'s hooks: load, create, append with commit metadata,
list a run's commits and the data files they added).

Where a run's own files live::

    OUTPUT/_runs/<run id>/_run.json         the run's state and plan key, written first
    OUTPUT/_runs/<run id>/staged/<table>/part-<batch id>.parquet   written, not committed
    OUTPUT/_runs/<run id>/_manifest.json    written last: the run is complete

The protocol:

* A write task stages its batch as Parquet parts under ``staged/`` exactly as the Parquet
  sink writes a batch (:class:`~docintel.pipeline.formats.parquet.ParquetPartsSink`,
  documents part last, the batch's stats in its footer): a staged batch whose documents
  part exists is complete.
* The driver (:meth:`WarehouseSink.written`, called as each batch is recorded) collects
  staged batches until they weigh about ``run.part_target_mb``, then commits the group:
  one append per table (errors, sentences, documents last), each a single data file of
  the group's rows, each commit's metadata holding the run id, the model versions and the
  batch ids it adds (documents: every batch's counts too). Then the group's staged parts
  are deleted. :meth:`WarehouseSink.finish` commits what is left.
* Exactly once: before each append the table's commits are read again, and batches that a
  commit of this run already holds are left out of it (a crash between two tables'
  appends, a commit whose answer was lost). A failed append is retried only after that
  re-read.
* Resume: the committed batch ids (and their counts) are read back from the documents
  table's commits of this run; staged batches that are complete but not committed are
  committed, not recomputed; only the missing batches run.

Reading one run's rows back: :class:`WarehouseRun` reads the data files the run's commits
added, found by the run id in their metadata.

Why the run state is a file and not commit metadata: a run must be resumable (and its
plan checked) before its first commit, and the plan key holds one record per input file,
too big to repeat in every commit. The commit metadata holds what must be atomic with the
data: which batches a commit added.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline.batch import Batch
from docintel.pipeline.config import Config
from docintel.pipeline.errors import InputError, RunFailed, UsageError
from docintel.pipeline.formats.base import RUNS
from docintel.pipeline.formats.parquet import (
    ParquetPartsSink,
    part_keys,
    part_path,
    read_batch_stats,
)
from docintel.pipeline.output.sink import (
    MANIFEST,
    RUN_STATE,
    TABLES,
    BatchStats,
    Existing,
    RunSink,
    TaskMap,
    atomic_write,
    delete_parts,
    read_json,
)
from docintel.pipeline.output.tables import Part, RunTables
from docintel.pipeline.schema import (
    ENTITIES,
    ERRORS_SCHEMA,
    documents_schema,
    head_fields,
    sentences_schema,
)
from docintel.pipeline.storage import display_uri

STAGED = "staged"
# commit metadata keys
RUN_ID_KEY = "docintel.run-id"
BATCHES_KEY = "docintel.batches"  # JSON list of the batch ids the commit adds
STATS_KEY = "docintel.batch-stats"  # documents commits: each batch's counts
MODELS_KEY = "docintel.models"
COMMIT_ORDER = ("errors", "sentences", "documents")  # documents last: the batch's commit
COMMIT_ATTEMPTS = 5  # per table and group, each after re-reading the table's commits
RETRY_WAIT_S = 0.5  # doubled per attempt
_USERINFO = re.compile(r"//[^/\s@]*@")

Opener = Callable[[], Any]  # a seekable pyarrow file, used as a context manager


def redact(text: str) -> str:
    """An error text without userinfo (a URI from the environment may hold one)."""
    return _USERINFO.sub("//***@", text)[:300]


@dataclass(frozen=True)
class Commit:
    """One commit of a table (an Iceberg snapshot, a Delta version) and its metadata."""

    id: int
    props: dict[str, str]
    added_files: int = 0
    added_bytes: int = 0

    @property
    def batches(self) -> list[str]:
        return list(json.loads(self.props[BATCHES_KEY]))


@dataclass
class _Pending:
    stats: BatchStats
    nbytes: int  # its staged parts, all tables


@dataclass
class _Driver:
    """The driver's side of a run (never pickled into write tasks)."""

    client: Any = None  # the format's connection (a catalog), once opened
    models: dict[str, str] = field(default_factory=dict)
    done: dict[str, set[str]] = field(default_factory=lambda: {t: set() for t in TABLES})
    pending: list[_Pending] = field(default_factory=list)
    commits: dict[str, list[Commit]] = field(default_factory=lambda: {t: [] for t in TABLES})
    appends: int = 0  # table appends this invocation (a fault counts them)
    attempts: int = 0  # table append attempts this invocation (a fault counts them)
    lost_answers: int = 0  # appends that raised after landing, found by their batch ids
    groups: int = 0
    commit_seconds: float = 0.0  # reading staged parts, writing data files, committing


class WarehouseSink(RunSink):
    """Batches staged by write tasks, committed to a format's tables by the driver in
    groups. Subclasses implement the hooks under "the format's tables"."""

    format_name = ""  # the manifest's "format"

    def __init__(
        self,
        fs: pafs.FileSystem,
        root: str,
        cfg: Config,
        labels: Sequence[str],
        stages: Sequence[str] = (),
    ) -> None:
        self.fs, self.root = fs, root
        self.labels, self.stages = tuple(labels), tuple(stages)
        self.heads = tuple(cfg.classify.heads)  # the extra heads' names (their columns)
        self.embeddings = cfg.run.embeddings
        self.output = cfg.output
        self.storage = cfg.storage
        self.run_id = cfg.run.run_id
        self.target_bytes = int(cfg.run.part_target_mb * 2**20)
        self.lose_commit = cfg.faults.sink_commit_lost
        self.store_down = cfg.faults.sink_catalog_down
        self._d: _Driver | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_d": None}  # write tasks need no connection

    # --- the format's tables (hooks) ---------------------------------------------------

    @property
    @abstractmethod
    def where(self) -> str:
        """The tables' home, for messages ("SQL catalog OUTPUT/_catalog.db")."""

    @abstractmethod
    def table_name(self, table: str) -> str:
        """``table`` as a message names it."""

    @abstractmethod
    def _check_location(self) -> None:
        """Refuse (UsageError) an OUTPUT this format cannot keep its tables in."""

    @abstractmethod
    def _check_tables(self) -> None:
        """Refuse (UsageError) existing tables this run's rows do not fit."""

    @abstractmethod
    def _prepare(self) -> None:
        """A new run: the tables' home exists (a namespace), and the tables that get their
        schema before any row (documents, errors)."""

    @abstractmethod
    def _ensure_table(self, table: str, schema: pa.Schema) -> None:
        """``table`` exists (created with ``schema`` on its first commit)."""

    @abstractmethod
    def _run_commits(self, table: str) -> list[Commit]:
        """This run's commits of ``table`` that added batches, in commit order."""

    @abstractmethod
    def _append(self, table: str, data: pa.Table, props: dict[str, str]) -> None:
        """One append of ``data`` with ``props`` as its commit metadata. ValueError: the
        rows do not fit the table (no retry helps); anything else is retried."""

    @abstractmethod
    def _data_files(self, table: str, commits: list[Commit]) -> list[tuple[str, Opener]]:
        """(path, opener) of each data file ``commits`` added to ``table``."""

    @abstractmethod
    def _manifest_section(self) -> dict[str, Any]:
        """What the manifest says of the tables (identifiers, this run's commits)."""

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

    @property
    def d(self) -> _Driver:
        if self._d is None:
            self._d = _Driver()
        return self._d

    def expected_schemas(self) -> dict[str, pa.Schema]:
        """The tables' schemas as far as the driver knows them before any batch (user
        stages' own sentence columns come with the first batch)."""
        dim = 1 if self.embeddings else None  # no fixed-size lists: list<float>, any size
        return {
            "documents": documents_schema(list(self.labels), ENTITIES in self.stages, self.heads),
            "sentences": sentences_schema(dim, self.stages, head_fields(self.heads)),
            "errors": ERRORS_SCHEMA,
        }

    # --- RunSink: driver -------------------------------------------------------------

    def open(self) -> Existing:
        self._check_location()
        if self.fs.get_file_info(self.root).type == pafs.FileType.File:
            raise UsageError(f"output {self.uri} is a file; give a folder")
        self._check_tables()
        if not self.run_id:
            return Existing(None, None)
        manifest = read_json(self.fs, f"{self.run_dir}/{MANIFEST}")
        state = None if manifest is not None else read_json(self.fs, f"{self.run_dir}/{RUN_STATE}")
        if state is not None:
            self.d.models = dict((state.get("plan") or {}).get("models") or {})
        return Existing(manifest, state)

    def completed(self) -> Iterator[dict[str, Any]]:
        """Every completed run's manifest (one small file each, read as asked)."""
        sel = pafs.FileSelector(f"{self.root}/{RUNS}", allow_not_found=True)
        for info in self.fs.get_file_info(sel):
            manifest = read_json(self.fs, f"{info.path}/{MANIFEST}")
            if info.type == pafs.FileType.Directory and manifest is not None:
                yield manifest

    def start(self, state: dict[str, Any]) -> None:
        self.run_id = state["run_id"]
        self._check_location()
        self.d.models = dict(state["plan"]["models"])
        atomic_write(self.fs, f"{self.run_dir}/{RUN_STATE}", json.dumps(state).encode())
        self._prepare()

    def resume(self) -> dict[str, BatchStats]:
        """This run's committed batches (from the tables' commits) and its staged,
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
        table's with their counts, and this run's commits (for the manifest)."""
        d = self.d
        out: dict[str, BatchStats] = {}
        for name in TABLES:
            for commit in self._run_commits(name):
                d.done[name].update(commit.batches)
                d.commits[name].append(commit)
                if name == "documents":
                    for batch_id, s in json.loads(commit.props.get(STATS_KEY, "{}")).items():
                        out[batch_id] = BatchStats(**s)
        return out

    def is_run_commit(self, props: dict[str, str]) -> bool:
        """Commit metadata ``props`` is this run's, and adds batches."""
        return props.get(RUN_ID_KEY) == self.run_id and BATCHES_KEY in props

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
        the driver: the tables' client lives here; ``task_map`` is not needed)."""
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
        commit of this run already holds; then delete its staged parts."""
        d = self.d
        t0 = time.perf_counter()
        ids = [p.stats.batch_id for p in group]
        for name in COMMIT_ORDER:
            todo = [b for b in ids if b not in d.done[name]]
            data = self._staged_rows(name, todo)
            if todo:
                self._ensure_table(name, data.schema)  # exists, even with no rows to add
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
        """One append of ``data``, exactly once: before every attempt the table's commits
        are read again, and an append that landed (its answer lost) is not repeated."""
        last: Exception | None = None
        for attempt in range(COMMIT_ATTEMPTS):
            if attempt:
                time.sleep(RETRY_WAIT_S * 2 ** (attempt - 1))
            landed = self._landed(name, todo)
            if landed is not None:
                self.d.lost_answers += 1
                self.d.commits[name].append(landed)
                return
            try:
                self._unreachable()
                self._append(name, data, props)
                self._fault()
            except ValueError as e:  # the rows do not fit the table: no retry helps
                raise RunFailed(
                    f"{self.table_name(name)} refused run {self.run_id!r}'s rows: {e}"
                ) from e
            except Exception as e:  # a conflict, a lost answer, a dropped connection
                last = e
                continue
            commit = self._landed(name, todo)
            assert commit is not None, "an append that returned left no commit"
            self.d.commits[name].append(commit)
            return
        raise RunFailed(
            f"{self.table_name(name)} in {self.where}: {COMMIT_ATTEMPTS} commits failed, the "
            f"last with {type(last).__name__}: {redact(str(last))}. What was committed "
            f"stays; rerun with --run-id {self.run_id} to resume"
        ) from last

    def _landed(self, name: str, todo: list[str]) -> Commit | None:
        """The commit of this run that holds any of ``todo``, or None."""
        want = set(todo)
        return next((c for c in self._run_commits(name) if want & set(c.batches)), None)

    def _unreachable(self) -> None:
        """Tests ([faults] sink_catalog_down = N): from the N-th append attempt on, the
        tables cannot be reached; nothing lands."""
        self.d.attempts += 1
        if self.store_down and self.d.attempts >= self.store_down:
            raise ConnectionError("injected fault ([faults] sink_catalog_down): no catalog")

    def _fault(self) -> None:
        """Tests ([faults] sink_commit_lost = N): the N-th append raises after landing."""
        self.d.appends += 1
        if self.lose_commit and self.d.appends == self.lose_commit:
            raise OSError(
                "injected fault ([faults] sink_commit_lost): the catalog committed, but "
                "its answer was lost"
            )

    # --- readers and the end of a run --------------------------------------------------

    def run_data_files(self, table: str) -> list[tuple[str, Opener]]:
        """(path, opener) of each data file this run's commits added to ``table``, in
        commit order: exactly the run's rows (docintel appends each batch once and deletes
        nothing)."""
        return self._data_files(table, self._run_commits(table))

    def write_empty(self, schemas: dict[str, pa.Schema]) -> None:
        """Every table exists (documents and errors do since the run started; sentences
        gets the contract's schema instead of its first rows')."""
        for table in TABLES:
            self._ensure_table(table, schemas[table])

    def table_files(self) -> dict[str, dict[str, int]]:
        """This run's data files and bytes per table (from its commits)."""
        return {
            t: {
                "files": sum(c.added_files for c in self.d.commits[t]),
                "bytes": sum(c.added_bytes for c in self.d.commits[t]),
            }
            for t in TABLES
        }

    def commit(self, manifest: dict[str, Any]) -> None:
        """The run's manifest, with the tables and this run's commits, written last under
        OUTPUT/_runs/<run id>/ (the tables were committed group by group)."""
        manifest = {**manifest, "format": self.format_name, **self._manifest_section()}
        payload = json.dumps(manifest, indent=2, default=str).encode()
        atomic_write(self.fs, f"{self.run_dir}/{MANIFEST}", payload)
        with contextlib.suppress(OSError):
            self.fs.delete_dir(f"{self.run_dir}/{STAGED}")

    def abort(self) -> None:
        """Nothing to undo: staged batches and committed tables are what a resume with the
        same run id builds on."""

    def write(self, batch: Batch) -> BatchStats:
        """On a worker: stage the batch's three parts (documents last, stats in its
        footer) under OUTPUT/_runs/<run id>/staged/."""
        return self.staging.write(batch)


def _stats_record(stats: BatchStats) -> dict[str, Any]:
    return {k: v for k, v in asdict(stats).items() if k != "seconds"}


class WarehouseRun(RunTables):
    """The rows one run appended to a warehouse's tables, and its manifest."""

    def __init__(self, sink: WarehouseSink) -> None:
        self.sink = sink
        self.fs, self.run_id = sink.fs, sink.run_id
        self.root, self.home = sink.root, sink.run_dir
        self.uri = f"{sink.run_id} in the tables of {sink.where}"
        self.manifest_uri = display_uri(sink.fs, f"{sink.run_dir}/{MANIFEST}")

    def manifest(self) -> dict[str, Any] | None:
        return read_json(self.fs, f"{self.sink.run_dir}/{MANIFEST}")

    def parts(self, table: str) -> list[Part]:
        return [
            Part(key=path.rsplit("/", 1)[1].removesuffix(".parquet"), uri=path, opener=opener)
            for path, opener in self.sink.run_data_files(table)
        ]


def latest_run(sink: WarehouseSink, what: str) -> str:
    """The run id of the warehouse's latest committed run (by its manifest's
    ``finished``); InputError (exit 2) when it has none."""
    runs = [(str(m.get("finished") or ""), str(m["run_id"])) for m in sink.completed()]
    if not runs:
        raise InputError(
            f"{sink.uri} is {what} with no committed run "
            f"(no {RUNS}/<run id>/{MANIFEST}): finish (or resume) a run first"
        )
    return max(runs)[1]
