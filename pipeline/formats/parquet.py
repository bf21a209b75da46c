"""Parquet parts, the default table format (``[output] format`` unset): one run per
folder, ``<table>/part-<batch id>.parquet`` and ``_manifest.json``.

This is the only module that spells its
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
``pipeline/output/compact.py`` keeps the ``(fs, root)`` functions tools call (bench/compaction.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline.batch import Batch
from docintel.pipeline.config import Config
from docintel.pipeline.errors import UsageError
from docintel.pipeline.formats.base import TableFormat
from docintel.pipeline.output.sink import (
    MANIFEST,
    RUN_STATE,
    TABLES,
    BatchStats,
    Existing,
    RunSink,
    TaskMap,
    atomic_write,
    batch_stats,
    delete_parts,
    documents_table,
    read_json,
    read_manifest,
    sentences_table,
    write_manifest,
)
from docintel.pipeline.output.tables import Part, RunTables
from docintel.pipeline.storage import display_uri, is_local


def parquet_sink(
    fs: pafs.FileSystem,
    root: str,
    cfg: Config,
    labels: Sequence[str],
    stages: Sequence[str] = (),  # noqa: ARG001 (parts take any sentence columns)
) -> RunSink:
    """The Parquet-parts sink of a run with ``cfg``."""
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
EMPTY = f"{MERGED}empty"  # the parts of a run of 0 documents (no batch id looks like it)


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

    def write_empty(self, schemas: dict[str, pa.Schema]) -> None:
        """One empty part per table, named as a merged group of no batch (documents last,
        its footer listing no batch): a resume settles it as any merged group."""
        for table in MERGE_ORDER:
            empty = schemas[table].empty_table()
            if table == "documents":
                empty = empty.replace_schema_metadata({BATCHES_KEY: b"[]"})
            atomic_write(self.fs, part_path(self.root, table, EMPTY), empty)

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


# --- reading a run back, and telling a Parquet output ------------------------------------


class ParquetRun(RunTables):
    """A run folder of Parquet output (one run per folder)."""

    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        self.fs, self.root = fs, root.rstrip("/") or "/"
        self.home = self.root
        self.uri = display_uri(fs, self.root)
        self.manifest_uri = f"{self.uri}/{MANIFEST}"

    def manifest(self) -> dict[str, Any] | None:
        return read_json(self.fs, f"{self.root}/{MANIFEST}")

    def parts(self, table: str) -> list[Part]:
        return [
            Part(
                key=path.rsplit("/", 1)[1][len(PART) : -len(SUFFIX)],
                uri=display_uri(self.fs, path),
                opener=functools.partial(self.fs.open_input_file, path),
            )
            for path in part_files(self.fs, self.root, table)  # hidden temporaries skipped
        ]


class ParquetFormat(TableFormat):
    """Parquet parts, one run per folder (the default)."""

    name = "parquet"
    what = "Parquet output of docintel (documents/, _manifest.json)"
    markers = (MANIFEST, RUN_STATE, *TABLES)
    sink_class = staticmethod(parquet_sink)  # Parquet parts take any sentence columns

    def holds(self, fs: pafs.FileSystem, root: str, names: set[str]) -> bool:  # noqa: ARG002
        return bool(names & set(self.markers))

    def run_tables(
        self,
        fs: pafs.FileSystem,
        root: str,
        cfg: Config,  # noqa: ARG002
        run_id: str | None,  # noqa: ARG002 (one run per folder)
    ) -> RunTables:
        return ParquetRun(fs, root)


PARQUET = ParquetFormat()
