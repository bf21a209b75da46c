"""The output sink of a run: one class owns how OUTPUT is stored, from open to commit.

:class:`RunSink` is shaped like Ray Data's ``Datasink`` (``on_write_start`` → ``write`` →
``on_write_complete`` / ``on_write_failed``), stretched to the needs of an exactly-once,
resumable run (DESIGN.md, "The output contract"):

    driver    open()              what OUTPUT holds: a committed manifest, an unfinished
                                  run's state, or nothing (read only)
              start(state) |      a new run claims the output (run state first), or a
              resume()            resumed one settles what a crash left and learns the
                                  committed batches' stats
    workers   write(batch)        inside a Ray write task: one batch, atomically
    driver    written(stats)      as each written batch is recorded (a sink that commits
                                  in groups commits here; Parquet parts: nothing)
              finish(task_map)    after the last write (compaction), on tasks the runner runs
              commit(manifest)    the manifest, last and atomically: the run is committed
              abort()             the run stops uncommitted: keep what a resume needs

``pipeline/output.py`` (:class:`~docintel.pipeline.output.RunOutput`) keeps the run-level
protocol (lease, error budget, counts, what the manifest says) and calls only this
interface, so a second table format is one more subclass (pipeline/sink_iceberg.py's
``IcebergSink``), chosen by ``sink_for`` in output.py (not here: the subclasses import this
module), with no change to the executor or the runner. The sink object
travels to every write task (the executor puts it in the object store once per run), so it
holds only small, picklable things: a filesystem, a root path, the labels, flags.

:class:`ParquetPartsSink` is today's format, and this is the only module that spells its
file names. Each batch writes ``errors/part-<batch id>.parquet``,
``sentences/part-<batch id>.parquet`` and, last, ``documents/part-<batch id>.parquet``: a
batch whose documents part exists is complete, and its counts ride in that part's footer.
Readers never see half a file: local files are written under a hidden temporary name
(readers skip hidden files) and renamed; on S3 each part is one atomic PUT.

Compaction (``finish``) lives here too, not in a module of its own, because it is the same
naming protocol: consecutive small batches are merged into groups of about
``run.part_target_mb`` (sum of the three tables' parts):

1. each group's ``errors`` and ``sentences`` parts are merged into
   ``<table>/part-merged-<group>.parquet``;
2. its ``documents`` parts are merged last, with every member batch's stats in the merged
   footer: the merged documents part is the group's commit point, as a batch's own
   documents part is the batch's;
3. then, once every group is merged, the member batches' own parts are deleted, in a
   second round of tasks: the task map checks the output's lease before each one (the
   runner's tasks also refuse to start past the claim's expiry), so a writer that lost
   its lease during the merges deletes nothing.

A crash anywhere leaves a state that :meth:`ParquetPartsSink.settle` (run by ``resume``)
turns back into exactly one copy of every batch: a merged documents part wins over its
members' own parts, which are deleted; merged errors or sentences parts without their
documents part are deleted (their members' own parts are all still there). The next
invocation merges what is left. Readers of a committed output never see both copies.
The trade-off: compaction reads and rewrites the small parts once at the end of the run,
on the cluster's I/O tasks, and holds one group in a task's memory (bounded by the
target). Batches whose parts are already at least half the target are left alone. Batch
ids are hex digits and dashes, so merged names never collide with a batch's own parts.
``pipeline/compact.py`` keeps the ``(fs, root)`` functions tools call (bench/compaction.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline.batch import Batch
from docintel.pipeline.config import Config, StorageConfig
from docintel.pipeline.errors import UsageError
from docintel.pipeline.schema import (
    CONTRACT_SENTENCE_COLUMNS,
    DOC_ID,
    EMBEDDING,
    N_TOKENS,
    PROBS,
    TRUNCATED,
    backend_column,
    documents_schema,
    label_count_column,
    model_column,
    sentences_schema,
)
from docintel.pipeline.storage import check_bucket, display_uri, is_local, resolve_uri

TABLES = ("documents", "sentences", "errors")
MANIFEST = "_manifest.json"  # the contract's commit marker, whatever the table format
RUN_STATE = "_run.json"  # written first: marks the folder as holding (part of) this run
ICEBERG_MARKERS = ("_catalog.db", "_runs")  # an Iceberg warehouse (pipeline/sink_iceberg.py)
COMPRESSION = "zstd"  # small files, fast to decode; every reader we target supports it

_T = TypeVar("_T")
_R = TypeVar("_R")


# --- what every sink shares: the output location, atomic files, the tables' rows ---------


def resolve_output(uri: str, storage: StorageConfig) -> tuple[pafs.FileSystem, str]:
    """The filesystem and root path of the output; on S3, the bucket must exist."""
    fs, root = resolve_uri(uri, storage, "output")
    check_bucket(fs, root, "output")
    return fs, root.rstrip("/") or "/"


def atomic_write(fs: pafs.FileSystem, path: str, data: pa.Table | bytes) -> None:
    """Make ``path`` appear whole or not at all.

    Locally: write a hidden sibling, then rename it into place. Object stores have no
    atomic rename (pyarrow's move there is copy + delete), but each PUT is atomic per
    object: encode in memory first, then upload the finished bytes straight to ``path``.
    """
    if not is_local(fs):
        payload = _encode(data)
        with fs.open_output_stream(path) as out:
            out.write(payload)
        return
    folder, _, name = path.rpartition("/")
    fs.create_dir(folder, recursive=True)
    tmp = f"{folder}/.{name}.{uuid.uuid4().hex[:12]}.tmp"  # unique per writer: no shared temp
    if isinstance(data, pa.Table):
        pq.write_table(data, tmp, filesystem=fs, **parquet_options(data.schema))
    else:
        with fs.open_output_stream(tmp) as out:
            out.write(data)
    fs.move(tmp, path)


def _floats(t: pa.DataType) -> bool:
    while pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return pa.types.is_floating(t)


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """zstd everywhere; dictionary encoding only for columns that repeat values (ids,
    labels, backends), not floats. A dictionary of 384-d embeddings never pays: Parquet
    builds it, overflows its page and falls back, and in a batch-sized file the attempt
    costs a third of the file (1.46 MB -> 0.92 MB for 640 sentences, bench/compaction.py)."""
    return {
        "compression": COMPRESSION,
        "use_dictionary": [f.name for f in schema if not _floats(f.type)],
    }


def _encode(data: pa.Table | bytes) -> bytes | pa.Buffer:
    if not isinstance(data, pa.Table):
        return data
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, **parquet_options(data.schema))
    return sink.getvalue()


def read_json(fs: pafs.FileSystem, path: str) -> dict[str, Any] | None:
    """A small JSON file (manifest, run state), or None when it does not exist."""
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode())


def write_manifest(fs: pafs.FileSystem, root: str, manifest: dict[str, Any]) -> None:
    """Commit the run: the manifest is written last, atomically."""
    atomic_write(fs, f"{root}/{MANIFEST}", json.dumps(manifest, indent=2, default=str).encode())


def read_manifest(fs: pafs.FileSystem, root: str) -> dict[str, Any] | None:
    """The committed run's manifest (readers: the report, the audit), or None."""
    return read_json(fs, f"{root}/{MANIFEST}")


def documents_table(batch: Batch, labels: list[str]) -> pa.Table:
    """Exactly one row per document of the batch, in input order."""
    n = batch.n_docs
    sents = batch.table
    idx = pc.index_in(sents[DOC_ID], value_set=batch.doc_ids).to_numpy(zero_copy_only=False)
    n_sent = np.bincount(idx, minlength=n).astype(np.int32)
    trunc = sents[TRUNCATED].to_numpy(zero_copy_only=False).astype(np.int64)
    n_trunc = np.bincount(idx, weights=trunc, minlength=n).astype(np.int32)
    k = len(labels)
    probs = sents[PROBS].combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, k)
    prob_sum = np.zeros((n, k), dtype=np.float64)
    np.add.at(prob_sum, idx, probs)
    best = probs.argmax(axis=1) if len(probs) else np.zeros(0, dtype=np.int64)
    counts = np.zeros((n, k), dtype=np.int32)
    np.add.at(counts, (idx, best), 1)
    has = n_sent > 0
    mean = np.divide(prob_sum, n_sent[:, None], out=np.zeros_like(prob_sum), where=has[:, None])
    top = mean.argmax(axis=1)
    failed = pc.is_in(batch.doc_ids, value_set=batch.errors[DOC_ID].combine_chunks())
    cols: dict[str, Any] = {
        DOC_ID: batch.doc_ids,
        "status": pc.if_else(failed, "error", "ok"),
        "n_sentences": n_sent,
        "n_truncated": n_trunc,
    }
    for j, lb in enumerate(labels):
        cols[label_count_column(lb)] = counts[:, j]
    cols["top_label"] = pa.array(
        [labels[t] if h else None for t, h in zip(top, has, strict=True)], pa.string()
    )
    cols["top_score"] = pa.array(
        np.where(has, mean[np.arange(n), top], np.nan), pa.float32(), mask=~has
    )
    cols["batch_id"] = pa.array([batch.batch_id] * n, pa.string())
    return pa.table(cols, schema=documents_schema(labels))


def sentences_table(batch: Batch, embeddings: bool) -> pa.Table:
    """The batch's sentence rows as written.

    The chain is whatever stages ran, in the order run_stage recorded their backends;
    columns the contract does not name were added by user-defined stages and are kept with
    their own types, in table order, so a new stage needs no change here."""
    t = batch.table.drop_columns([PROBS])
    if not embeddings and EMBEDDING in t.column_names:
        t = t.drop_columns([EMBEDDING])
    stages = list(batch.backends)
    extra = [f for f in t.schema if f.name not in CONTRACT_SENTENCE_COLUMNS]
    n = t.num_rows
    for stage in stages:
        backend = pa.array([batch.backends[stage]] * n, pa.string())
        t = t.append_column(backend_column(stage), backend)
    for stage in stages:
        t = t.append_column(model_column(stage), pa.array([batch.versions[stage]] * n, pa.string()))
    dim = t.schema.field(EMBEDDING).type.list_size if EMBEDDING in t.column_names else None
    schema = sentences_schema(dim, stages, extra)
    return t.select(schema.names).cast(schema)


@dataclass
class BatchStats:
    """What the driver learns about a written batch (small: no document data)."""

    batch_id: str
    documents: int
    sentences: int
    errors: int
    tokens: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    backends: dict[str, str] = field(default_factory=dict)


def batch_stats(batch: Batch, docs: pa.Table, sents: pa.Table) -> BatchStats:
    """The counts of a batch about to be written (any format: from its tables)."""
    return BatchStats(
        batch_id=batch.batch_id,
        documents=docs.num_rows,
        sentences=sents.num_rows,
        errors=pc.count_distinct(batch.errors[DOC_ID]).as_py(),
        tokens=int(pc.sum(sents[N_TOKENS]).as_py() or 0),
        backends=dict(batch.backends),
    )


# --- the interface ---------------------------------------------------------------------


class TaskMap(Protocol):
    """Runs ``fn`` on each item where the caller decides (the runner: Ray tasks, a bounded
    window in flight, under the output's lease; tests and tools: this process) and yields
    the results in any order. ``fn`` is a picklable bound method of a sink and idempotent:
    a task may run it twice. It is how ``finish`` spreads work without importing Ray."""

    def __call__(self, fn: Callable[[_T], _R], items: Sequence[_T], /) -> Iterator[_R]: ...


def in_process(fn: Callable[[_T], _R], items: Sequence[_T], /) -> Iterator[_R]:
    """A :class:`TaskMap` that runs every item here, one after the other."""
    return map(fn, items)


@dataclass(frozen=True)
class Existing:
    """What OUTPUT holds before a run touches it (:meth:`RunSink.open`)."""

    manifest: dict[str, Any] | None  # a committed run
    state: dict[str, Any] | None  # an unfinished run's record (run id, input, started)


class RunSink(ABC):
    """One run's output storage. Implementations own every name, file and commit point;
    the caller (RunOutput) holds the lease and decides, from :meth:`open`, between start,
    resume and "already complete". Instances are pickled into write tasks: keep them small.
    """

    @abstractmethod
    def open(self) -> Existing:
        """Look at OUTPUT without changing it: a committed manifest, else an unfinished
        run's state, else neither. Refuses (UsageError) an OUTPUT no run may write, so the
        caller refuses before it takes the lease; :meth:`start` checks again under it."""

    @abstractmethod
    def start(self, state: dict[str, Any]) -> None:
        """A new run claims OUTPUT: refuse one that holds tables but no run, then persist
        ``state`` before any batch (so a crash leaves a resumable run, not debris)."""

    @abstractmethod
    def resume(self) -> dict[str, BatchStats]:
        """This run resumes: settle what a crash left (exactly one copy of every batch),
        then the stats of every committed batch, by batch id, read once from storage."""

    @abstractmethod
    def write(self, batch: Batch) -> BatchStats:
        """On a worker: write one finished batch so that it is committed whole or not at
        all (idempotent: a retried task rewrites the same batch), and return its stats."""

    def written(self, stats: BatchStats) -> None:  # noqa: B027 (optional hook)
        """On the driver, as a written batch is recorded (its stats): a sink that commits
        batches in groups commits here. By default nothing: a batch is committed by its
        own write."""

    @abstractmethod
    def finish(self, task_map: TaskMap) -> dict[str, Any]:
        """After the last write, before the commit: reorganise what was written (compact
        small files) on ``task_map``; what it did, for the manifest's ``parts``."""

    @abstractmethod
    def table_files(self) -> dict[str, dict[str, int]]:
        """Files and bytes per table as the output holds them now (for the manifest)."""

    @abstractmethod
    def commit(self, manifest: dict[str, Any]) -> None:
        """Write ``manifest`` last and atomically: from then on the run is committed."""

    @abstractmethod
    def abort(self) -> None:
        """The run stops uncommitted (failure, Ctrl-C): leave everything a resume with the
        same run id needs, and drop only what no resume can use."""


def parquet_sink(fs: pafs.FileSystem, root: str, cfg: Config, labels: Sequence[str]) -> RunSink:
    """The Parquet-parts sink of a run with ``cfg`` (output.py's ``sink_for`` chooses)."""
    return ParquetPartsSink(
        fs, root, tuple(labels), cfg.run.embeddings, int(cfg.run.part_target_mb * 2**20)
    )


# --- Parquet parts: the one place that spells the file names -----------------------------

PART = "part-"  # <table>/part-<batch id or group>.parquet
SUFFIX = ".parquet"
MERGED = "merged-"  # part-merged-<group>.parquet
# A batch's counts and backends ride in its documents part's footer (Parquet key-value
# metadata), so a resumed run learns an earlier invocation's batches from footers alone;
# a merged documents part's footer holds every member batch's.
STATS_KEY = b"docintel.batch_stats"
BATCHES_KEY = b"docintel.merged_batches"
MERGE_ORDER = ("errors", "sentences", "documents")  # documents last: the commit point
S3_DELETE_BATCH = 1000  # keys per DeleteObjects request (S3's limit)


def part_path(root: str, table: str, key: str) -> str:
    """The part of ``table`` holding batch (or merged group) ``key``."""
    return f"{root}/{table}/{PART}{key}{SUFFIX}"


def _part_key(name: str) -> str | None:
    """The batch id or group of a part's file name; None for anything else (hidden
    temporaries, files a user dropped there)."""
    if name.startswith(PART) and name.endswith(SUFFIX):
        return name[len(PART) : -len(SUFFIX)]
    return None


def _parts(fs: pafs.FileSystem, root: str, table: str) -> list[tuple[str, pafs.FileInfo]]:
    """(key, file info) of every part of ``table``, one listing."""
    sel = pafs.FileSelector(f"{root}/{table}", allow_not_found=True)
    found = []
    for info in fs.get_file_info(sel):
        key = _part_key(info.base_name)
        if key is not None and info.type == pafs.FileType.File:
            found.append((key, info))
    return found


def part_keys(fs: pafs.FileSystem, root: str, table: str) -> list[str]:
    """The batch ids (or merged groups) of one table's parts, sorted (one listing)."""
    return sorted(key for key, _ in _parts(fs, root, table))


def part_files(fs: pafs.FileSystem, root: str, table: str) -> list[str]:
    """The data files of one table of a Parquet-parts output, sorted (for readers)."""
    return sorted(info.path for _, info in _parts(fs, root, table))


def stats_metadata(stats: BatchStats) -> dict[bytes, bytes]:
    keep = {k: v for k, v in asdict(stats).items() if k != "seconds"}
    return {STATS_KEY: json.dumps(keep).encode()}


def _footer(fs: pafs.FileSystem, path: str) -> dict[bytes, bytes]:
    with fs.open_input_file(path) as f:
        return pq.ParquetFile(f).schema_arrow.metadata or {}


def read_batch_stats(fs: pafs.FileSystem, root: str, batch_id: str) -> BatchStats:
    """The stats of a committed batch, from its documents part's footer only."""
    return BatchStats(**json.loads(_footer(fs, part_path(root, "documents", batch_id))[STATS_KEY]))


def merged_stats(fs: pafs.FileSystem, path: str) -> list[BatchStats]:
    """The stats of every batch in a merged documents part, from its footer."""
    return [BatchStats(**s) for s in json.loads(_footer(fs, path)[BATCHES_KEY])]


@dataclass(frozen=True)
class Group:
    """Consecutive small batches merged into one part per table."""

    batch_ids: tuple[str, ...]
    nbytes: int  # of the member parts, all tables

    @property
    def name(self) -> str:
        digest = hashlib.blake2b(",".join(self.batch_ids).encode(), digest_size=8)
        return f"{MERGED}{digest.hexdigest()}"


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    """One HEAD on S3 (pyarrow's get_file_info may list a prefix instead)."""
    if is_local(fs):
        return fs.get_file_info(path).type == pafs.FileType.File
    from botocore.exceptions import ClientError

    bucket, _, key = path.partition("/")
    try:
        fs.boto3_client().head_object(Bucket=bucket, Key=key)  # type: ignore[attr-defined]
    except ClientError as e:
        if str(e.response.get("Error", {}).get("Code")) in {"404", "NoSuchKey", "NotFound"}:
            return False
        raise
    return True


def delete_parts(fs: pafs.FileSystem, paths: list[str]) -> None:
    """Delete files that may already be gone. On S3 through boto3's batch delete (1,000
    keys a request): pyarrow's delete_file checks each key first and leaves folder markers
    behind."""
    if is_local(fs):
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(path)
        return
    client = fs.boto3_client()  # type: ignore[attr-defined]
    by_bucket: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        bucket, _, key = path.partition("/")
        by_bucket[bucket].append(key)
    for bucket, keys in by_bucket.items():
        for i in range(0, len(keys), S3_DELETE_BATCH):
            chunk = [{"Key": k} for k in keys[i : i + S3_DELETE_BATCH]]
            answer = client.delete_objects(Bucket=bucket, Delete={"Objects": chunk, "Quiet": True})
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise OSError(
                    f"S3 refused to delete {len(answer['Errors'])} part(s) in {bucket}, "
                    f"first {first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )


def _read(fs: pafs.FileSystem, path: str) -> pa.Table:
    with fs.open_input_file(path) as f:
        return pq.read_table(f)


def _group_runs(sizes: dict[str, int], target_bytes: int) -> list[Group]:
    """Consecutive batches (in id order) below half the target, packed up to it."""
    groups: list[Group] = []
    members: list[str] = []
    total = 0

    def close() -> None:
        nonlocal members, total
        if len(members) > 1:
            groups.append(Group(tuple(members), total))
        members, total = [], 0

    for batch_id in sorted(sizes):
        n = sizes[batch_id]
        if n >= target_bytes // 2:  # big enough on its own
            continue
        if total + n > target_bytes:
            close()
        members.append(batch_id)
        total += n
    close()
    return groups


@dataclass(frozen=True)
class ParquetPartsSink(RunSink):
    """Plain Parquet files, one part per batch and table, merged at the end of the run."""

    fs: pafs.FileSystem
    root: str
    labels: tuple[str, ...] = ()
    embeddings: bool = True
    part_target_bytes: int = 0  # 0: never merge

    @property
    def uri(self) -> str:
        return display_uri(self.fs, self.root)

    def open(self) -> Existing:
        manifest = read_manifest(self.fs, self.root)
        state = None if manifest is not None else read_json(self.fs, f"{self.root}/{RUN_STATE}")
        if manifest is None and state is None:
            self._refuse_foreign()  # a file, or tables of no run
        return Existing(manifest, state)

    def _refuse_foreign(self) -> None:
        """Tables without a run state are not a run of ours: never write among them."""
        fs, root = self.fs, self.root
        if fs.get_file_info(root).type == pafs.FileType.File:
            raise UsageError(f"output {self.uri} is a file; give a folder or s3:// prefix")
        existing = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        if any(i.base_name in ICEBERG_MARKERS for i in existing):
            raise UsageError(
                f"output {self.uri} is an Iceberg warehouse of docintel (_catalog.db, "
                "_runs/); write to it with --format iceberg, or choose an empty output folder"
            )
        if any(i.base_name in TABLES for i in existing):
            raise UsageError(
                f"output {self.uri} already holds docintel tables but no run "
                "state; choose an empty output folder"
            )

    def start(self, state: dict[str, Any]) -> None:
        self._refuse_foreign()  # again: open() looked before the caller took the lease
        atomic_write(self.fs, f"{self.root}/{RUN_STATE}", json.dumps(state).encode())

    def resume(self) -> dict[str, BatchStats]:
        committed = self.settle()  # first: it settles what a crash left
        for key, _ in _parts(self.fs, self.root, "documents"):
            if not key.startswith(MERGED):
                committed[key] = read_batch_stats(self.fs, self.root, key)
        return committed

    def settle(self) -> dict[str, BatchStats]:
        """Finish or undo what a crash during compaction left; the merged batches' stats.

        Members' own parts beside a merged documents part are deleted (the merged copy is
        complete); merged errors/sentences parts without their documents part are deleted
        (their members' parts were never deleted)."""
        merged: dict[str, BatchStats] = {}
        groups = set()
        for key, info in _parts(self.fs, self.root, "documents"):
            if key.startswith(MERGED):
                groups.add(key)
                merged.update((s.batch_id, s) for s in merged_stats(self.fs, info.path))
        stale = [
            info.path
            for table in TABLES
            for key, info in _parts(self.fs, self.root, table)
            if (key.startswith(MERGED) and key not in groups) or key in merged
        ]
        delete_parts(self.fs, stale)
        return merged

    def write(self, batch: Batch) -> BatchStats:
        """The batch's three parts, documents last (its commit point, stats in its footer)."""
        t0 = time.perf_counter()
        docs = documents_table(batch, list(self.labels))
        sents = sentences_table(batch, self.embeddings)
        stats = batch_stats(batch, docs, sents)
        atomic_write(self.fs, part_path(self.root, "errors", batch.batch_id), batch.errors)
        atomic_write(self.fs, part_path(self.root, "sentences", batch.batch_id), sents)
        meta = {**(docs.schema.metadata or {}), **stats_metadata(stats)}
        docs = docs.replace_schema_metadata(meta)
        atomic_write(self.fs, part_path(self.root, "documents", batch.batch_id), docs)
        stats.seconds = {**batch.seconds, "write": time.perf_counter() - t0}
        return stats

    def finish(self, task_map: TaskMap) -> dict[str, Any]:
        """Merge every group, then (a second round, each task submitted under a fresh check
        of the lease) delete the members' own parts."""
        t0 = time.perf_counter()
        groups = self.plan_groups()
        for _ in task_map(self.write_merged, groups):
            pass
        removed = sum(task_map(self.delete_members, groups))
        return {
            "merged_groups": len(groups),
            "merged_batches": sum(len(g.batch_ids) for g in groups),
            "parts_removed": removed,
            "seconds": round(time.perf_counter() - t0, 3),
        }

    def plan_groups(self) -> list[Group]:
        """Consecutive committed batches, small ones only, grouped up to the target."""
        if self.part_target_bytes <= 0:
            return []
        size: dict[str, int] = defaultdict(int)
        committed = set()
        for table in TABLES:
            for key, info in _parts(self.fs, self.root, table):
                if key.startswith(MERGED):
                    continue
                size[key] += info.size or 0
                if table == "documents":
                    committed.add(key)
        return _group_runs({b: size[b] for b in committed}, self.part_target_bytes)

    def merge_group(self, group: Group) -> int:
        """Merge one group's parts (documents last), then delete its members' own parts;
        the number of parts deleted (tools: one group in this process)."""
        self.write_merged(group)
        return self.delete_members(group)

    def write_merged(self, group: Group) -> str:
        """Merge one group's parts into its merged parts, documents last (the group's commit
        point); the group's name. Idempotent: a group whose merged documents part exists
        (a retried task) is not written again. Deletes nothing."""
        fs, root = self.fs, self.root
        stats: list[dict] = []
        done = _exists(fs, part_path(root, "documents", group.name))
        for table in () if done else MERGE_ORDER:
            tables = []
            for batch_id in group.batch_ids:
                t = _read(fs, part_path(root, table, batch_id))
                if table == "documents":
                    stats.append(json.loads((t.schema.metadata or {})[STATS_KEY]))
                tables.append(t.replace_schema_metadata(None))
            out = pa.concat_tables(tables)
            if table == "documents":
                out = out.replace_schema_metadata({BATCHES_KEY: json.dumps(stats).encode()})
            atomic_write(fs, part_path(root, table, group.name), out)
        return group.name

    def delete_members(self, group: Group) -> int:
        """Delete the members' own parts of a group whose merged documents part exists (else
        nothing: without it they are the only copy); the number of parts deleted.
        Idempotent: a part already deleted is skipped."""
        if not _exists(self.fs, part_path(self.root, "documents", group.name)):
            raise OSError(
                f"group {group.name} of {self.uri} has no merged documents part: its members' "
                "own parts are kept (a resume merges them again)"
            )
        members = [part_path(self.root, t, b) for t in TABLES for b in group.batch_ids]
        delete_parts(self.fs, members)
        return len(members)

    def table_files(self) -> dict[str, dict[str, int]]:
        out = {}
        for table in TABLES:
            parts = [info for _, info in _parts(self.fs, self.root, table)]
            out[table] = {"files": len(parts), "bytes": sum(i.size or 0 for i in parts)}
        return out

    def commit(self, manifest: dict[str, Any]) -> None:
        write_manifest(self.fs, self.root, manifest)

    def abort(self) -> None:
        """Nothing to undo: every part is atomic, a batch counts once its documents part
        exists, and a half-merged group is settled by the next ``resume``. Hidden
        temporaries of killed writers are left alone: a write task of this run may still
        be running, and readers skip them."""


def write_batch(
    fs: pafs.FileSystem, root: str, batch: Batch, labels: list[str], embeddings: bool
) -> BatchStats:
    """Write one batch's parts outside a run (tools, tests): the run's own code."""
    return ParquetPartsSink(fs, root, tuple(labels), embeddings).write(batch)
