"""Output parts that data lakes like: small batch parts merged at the end of a run.

Each batch writes one part per table (``documents``, ``sentences``, ``errors``), so a
corpus of small documents in batches of 128 would leave millions of tiny files. When every
batch is written, and before the manifest, the run merges runs of consecutive small
batches into groups of about ``run.part_target_mb`` (sum of the three tables' parts):

1. each group's ``errors`` and ``sentences`` parts are merged into
   ``<table>/part-merged-<group>.parquet``;
2. its ``documents`` parts are merged last, with every member batch's stats in the merged
   footer: the merged documents part is the group's commit point, as a batch's own
   documents part is the batch's;
3. then the member batches' own parts are deleted.

A crash anywhere leaves a state that :func:`recover` (run when a run is resumed) turns back
into exactly one copy of every batch: a merged documents part wins over its members' own
parts, which are deleted; merged errors or sentences parts without their documents part are
deleted (their members' own parts are all still there). The next invocation merges what is
left. Readers of a committed output (a manifest exists) never see both copies.

The trade-off: compaction reads and rewrites the small parts once at the end of the run
(about the size of the small parts in I/O, on the cluster's I/O tasks), and a group is
held in one task's memory (bounded by the target: Arrow tables of at most about
``part_target_mb`` of Parquet, decoded). Batches whose parts are already at least half the
target are left alone. Batch ids are hex digits and dashes, so ``part-merged-`` names
never collide with a batch's own parts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline.sink import STATS_KEY, TABLES, BatchStats, atomic_write, part_path
from docintel.pipeline.storage import is_local

MERGED = "merged-"  # part-merged-<group>.parquet
BATCHES_KEY = b"docintel.merged_batches"  # in a merged documents part: its batches' stats
MERGE_ORDER = ("errors", "sentences", "documents")  # documents last: the commit point
S3_DELETE_BATCH = 1000  # keys per DeleteObjects request (S3's limit)


@dataclass(frozen=True)
class Group:
    batch_ids: tuple[str, ...]
    nbytes: int  # of the member parts, all tables

    @property
    def name(self) -> str:
        digest = hashlib.blake2b(",".join(self.batch_ids).encode(), digest_size=8)
        return f"{MERGED}{digest.hexdigest()}"


def _parts(fs: pafs.FileSystem, root: str, table: str) -> list[pafs.FileInfo]:
    sel = pafs.FileSelector(f"{root}/{table}", allow_not_found=True)
    return [
        i
        for i in fs.get_file_info(sel)
        if i.base_name.startswith("part-") and i.base_name.endswith(".parquet")
    ]


def _key(info: pafs.FileInfo) -> str:
    return info.base_name[len("part-") : -len(".parquet")]


def plan_groups(fs: pafs.FileSystem, root: str, target_bytes: int) -> list[Group]:
    """Consecutive committed batches, small ones only, grouped up to ``target_bytes``."""
    if target_bytes <= 0:
        return []
    size: dict[str, int] = defaultdict(int)
    committed = set()
    for table in TABLES:
        for info in _parts(fs, root, table):
            key = _key(info)
            if key.startswith(MERGED):
                continue
            size[key] += info.size or 0
            if table == "documents":
                committed.add(key)
    groups: list[Group] = []
    members: list[str] = []
    total = 0

    def close() -> None:
        nonlocal members, total
        if len(members) > 1:
            groups.append(Group(tuple(members), total))
        members, total = [], 0

    for batch_id in sorted(committed):
        n = size[batch_id]
        if n >= target_bytes // 2:  # big enough on its own
            continue
        if total + n > target_bytes:
            close()
        members.append(batch_id)
        total += n
    close()
    return groups


def _exists(fs: pafs.FileSystem, path: str) -> bool:
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


def merge_group(fs: pafs.FileSystem, root: str, group: Group) -> tuple[int, list[BatchStats]]:
    """Merge one group's parts (documents last), then delete its members' own parts.

    Idempotent: a merged part already written is not written again, and a member's part
    already deleted is skipped. Returns the number of parts deleted and the members'
    stats (from the merged documents part's footer)."""
    stats: list[dict] = []
    # the commit point already passed (a retried task): only the deletes are left
    done = _exists(fs, part_path(root, "documents", group.name))
    for table in () if done else MERGE_ORDER:
        merged = part_path(root, table, group.name)
        tables = []
        for batch_id in group.batch_ids:
            t = _read(fs, part_path(root, table, batch_id))
            if table == "documents":
                stats.append(json.loads((t.schema.metadata or {})[STATS_KEY]))
            tables.append(t.replace_schema_metadata(None))
        out = pa.concat_tables(tables)
        if table == "documents":
            out = out.replace_schema_metadata({BATCHES_KEY: json.dumps(stats).encode()})
        atomic_write(fs, merged, out)
    members = [part_path(root, t, b) for t in TABLES for b in group.batch_ids]
    delete_parts(fs, members)
    return len(members), merged_stats(fs, part_path(root, "documents", group.name))


def merged_stats(fs: pafs.FileSystem, path: str) -> list[BatchStats]:
    """The stats of every batch in a merged documents part, from its footer."""
    with fs.open_input_file(path) as f:
        meta = pq.ParquetFile(f).schema_arrow.metadata or {}
    return [BatchStats(**s) for s in json.loads(meta[BATCHES_KEY])]


def recover(fs: pafs.FileSystem, root: str) -> dict[str, BatchStats]:
    """Finish or undo what a crash during compaction left; the merged batches' stats.

    Members' own parts beside a merged documents part are deleted (the merged copy is
    complete); merged errors/sentences parts without their documents part are deleted
    (their members' parts were never deleted)."""
    merged: dict[str, BatchStats] = {}
    groups = set()
    for info in _parts(fs, root, "documents"):
        key = _key(info)
        if key.startswith(MERGED):
            groups.add(key)
            for s in merged_stats(fs, info.path):
                merged[s.batch_id] = s
    stale = [
        info.path
        for table in TABLES
        for info in _parts(fs, root, table)
        if (_key(info).startswith(MERGED) and _key(info) not in groups) or _key(info) in merged
    ]
    delete_parts(fs, stale)
    return merged


def part_counts(fs: pafs.FileSystem, root: str) -> dict[str, dict[str, int]]:
    """Files and bytes per table (for the manifest)."""
    out = {}
    for table in TABLES:
        parts = _parts(fs, root, table)
        out[table] = {"files": len(parts), "bytes": sum(i.size or 0 for i in parts)}
    return out
