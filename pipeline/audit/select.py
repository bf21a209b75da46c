"""Selecting a night's documents: which source files to read, which of their documents are
new, changed or unchanged (BLAKE2b-128 of each text against the doc index), the staging
input the night's run reads, the index as it will be once the night completes, and the
selection record (``_selection.json``) that marks the staging complete."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline.audit.state import (
    CONTENT_HASH,
    HASH_BYTES,
    INDEX_SCHEMA,
    PROCESSED_DATE,
    SOURCE_FILE,
    AuditLayout,
    read_index,
    write_json,
)
from docintel.pipeline.config import Config
from docintel.pipeline.errors import InputError, RunFailed
from docintel.pipeline.input.source import InputFile, resolve_input
from docintel.pipeline.output.sink import atomic_write
from docintel.pipeline.schema import DOC_ID
from docintel.pipeline.storage import is_local, s3_error

# Rows hashed per step while streaming a source file: bounds memory on huge files
# (a record batch of long documents is still only this many texts).
READ_BATCH_ROWS = 4096
# Staging row groups: the run reads one row group per task and cuts it into batches, so
# a row group holds several batches (fewer, larger reads) but stays bounded in bytes.
STAGING_BATCHES_PER_ROW_GROUP = 8
STAGING_ROW_GROUP_BYTES = 64 * 1024 * 1024
MAX_REPORTED = 5  # duplicate ids named in a message: enough to find the pattern
# Staged files, one per source file read (k: its position tonight). They are the night's
# run's *input*, not output parts: the run's source reads any visible .parquet file, and
# nothing else looks for these names, so they are spelled here and not by the sink.
STAGED_FILE = "input-{k:05d}.parquet"

# Per-document hash input: a type tag, so a null, an empty string and binary text with
# the same bytes differ (the pipeline treats them differently).
_NULL, _STR, _BYTES, _OTHER = b"\x00", b"s", b"b", b"o"


@dataclass
class _Counts:
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    reprocessed: int = 0

    def add(self, other: _Counts) -> None:
        for name in ("new", "changed", "unchanged", "reprocessed"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True)
class _Night:
    """How tonight's source files are read and staged."""

    src_fs: pafs.FileSystem
    out_fs: pafs.FileSystem
    id_col: str
    text_col: str
    day: str
    models_changed: bool
    rows_per_group: int


def select_documents(
    cfg: Config,
    lay: AuditLayout,
    day: str,
    source: str,
    state: dict[str, Any] | None,
    models: dict[str, str],
    resolved: tuple[pafs.FileSystem, list[InputFile]] | None = None,
) -> dict[str, Any]:
    """Decide the night's documents, write their staging input and the pending index.
    ``resolved``: the source's filesystem and Parquet files, when already listed.

    Returns the selection record, written last as the staging folder's marker.
    """
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    id_col, text_col = cfg.input.id_column, cfg.input.text_column
    src_fs, files = resolved or resolve_input(source, cfg.storage)
    seen = _file_stamps(src_fs, files)
    previous_models = state["models"] if state else None
    models_changed = previous_models is not None and previous_models != models
    old_files: dict[str, Any] = state["files"] if state else {}
    unread = _unchanged_files(files, seen, old_files, models_changed)
    unread_paths = {f.path for f in unread}
    old = read_index(lay) if state else INDEX_SCHEMA.empty_table()

    opened, skipped = _read_ids(src_fs, [f for f in files if f.path not in unread_paths], id_col)
    if skipped and not opened and not unread:
        raise skipped[0][1]
    joined = _checked_join(opened, old, unread_paths, id_col)
    rows_per_group = cfg.run.fixed_batch_size() * STAGING_BATCHES_PER_ROW_GROUP
    night = _Night(src_fs, lay.fs, id_col, text_col, day, models_changed, rows_per_group)
    counts, tonight, read_ok = _stage_files(night, lay.staging(day), opened, joined, skipped)

    skipped_paths = {f.path for f, _ in skipped}
    index, removed, kept_unread = _next_index(old, tonight, unread_paths, skipped_paths)
    counts.unchanged += kept_unread
    next_files = {f.path: seen[f.path] for f in unread + read_ok}
    next_files.update({p: old_files[p] for p in skipped_paths if p in old_files})
    head = {"date": day, "source": source, "started": started,
            "columns": {"id": id_col, "text": text_col}, "models": models,
            "previous_models": previous_models, "models_changed": models_changed}  # fmt: skip
    return record_selection(lay, day, index, head, counts, removed, next_files, skipped)


def record_selection(
    lay: AuditLayout,
    day: str,
    index: pa.Table,
    head: dict[str, Any],
    counts: _Counts,
    removed: int,
    next_files: dict[str, Any],
    skipped: list[tuple[InputFile, Exception]],
) -> dict[str, Any]:
    """The selection record (``head``: what the night read and with which models; then
    the counts, the files as seen and the skipped ones), written after the pending index:
    the staging folder is complete. Parquet and document sources share it."""
    selection = {
        **head,
        "counts": _counts_record(counts, removed),
        "selected": counts.new + counts.changed + counts.reprocessed,
        "files": dict(sorted(next_files.items())),
        "skipped_files": [{"uri": f.uri, "reason": str(e)} for f, e in skipped],
    }
    _write_selection(lay, day, index, selection)
    return selection


def _unchanged_files(
    files: list[InputFile],
    seen: dict[str, dict[str, Any]],
    old_files: dict[str, Any],
    models_changed: bool,
) -> list[InputFile]:
    """The files not read tonight: (size, mtime) as the last audit saw them, same models."""
    return [
        f
        for f in files
        if not models_changed
        and seen[f.path]["mtime_ns"] is not None
        and old_files.get(f.path) == seen[f.path]
    ]


def _counts_record(counts: _Counts, removed: int) -> dict[str, int]:
    return {
        "new": counts.new,
        "changed": counts.changed,
        "removed": removed,
        "unchanged": counts.unchanged,
        "reprocessed": counts.reprocessed,
    }


def _write_selection(
    lay: AuditLayout, day: str, index: pa.Table, selection: dict[str, Any]
) -> None:
    """The pending index, then ``_selection.json``: the staging folder is complete."""
    atomic_write(lay.fs, lay.pending_index(day), index)
    write_json(lay, lay.selection(day), selection)


def _file_stamps(fs: pafs.FileSystem, files: list[InputFile]) -> dict[str, dict[str, Any]]:
    """{path: {size, mtime_ns}} as the storage reports them now (one stat per file)."""
    try:
        infos = fs.get_file_info([f.path for f in files])
    except OSError as e:
        if is_local(fs):
            raise
        raise s3_error(e, files[0].uri) from e
    return {
        f.path: {"size": info.size, "mtime_ns": info.mtime_ns}
        for f, info in zip(files, infos, strict=True)
    }


# --- ids: read, checked, joined with the index ---------------------------------------------


class _Unreadable(InputError):
    """A source file that is not readable Parquet: skipped tonight, retried tomorrow."""


def _unreadable(f: InputFile, e: Exception) -> _Unreadable:
    return _Unreadable(
        f"source file {f.uri} could not be read as Parquet ({e}); the audit skips it "
        "tonight and reads it again next time. Fix or remove it"
    )


def _ids_table(ids: pa.Array | list[str], k: int) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            DOC_ID: pa.array(ids, pa.string()) if isinstance(ids, list) else ids,
            "file": pa.array(np.full(n, k, dtype=np.int32)),
            "row": pa.array(np.arange(n, dtype=np.int64)),
        }
    )


def _read_ids(
    fs: pafs.FileSystem, files: list[InputFile], id_col: str
) -> tuple[list[tuple[InputFile, pa.Table]], list[tuple[InputFile, _Unreadable]]]:
    """Each readable file with its (doc_id, file, row) table; unreadable files apart.

    Reads footers and the id column only (as ``docintel run`` checks ids), so the join
    with the index and the duplicate checks happen before any text is read or staged.
    A file that is not readable Parquet is reported by name and skipped, not fatal.
    """
    opened: list[tuple[InputFile, pa.Table]] = []
    skipped: list[tuple[InputFile, _Unreadable]] = []
    for f in files:
        try:
            with fs.open_input_file(f.path) as raw:
                pf = pq.ParquetFile(raw)
                names = pf.schema_arrow.names
                col = pf.read(columns=[id_col]).column(0) if id_col in names else None
        except (OSError, pa.ArrowInvalid) as e:
            if isinstance(e, OSError) and not is_local(fs):
                raise s3_error(e, f.uri) from e  # access, network: not the file's fault
            skipped.append((f, _unreadable(f, e)))
            continue
        if col is None:
            raise InputError(
                f"source file {f.uri} has no column {id_col!r} (set [input] id_column); its "
                f"columns are: {', '.join(names)}"
            )
        typ = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
        if not (
            pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_integer(typ)
        ):
            raise InputError(
                f"source file {f.uri}: id column {id_col!r} has type {col.type}; "
                "expected strings or integers"
            )
        if col.null_count:
            first = pc.index(pc.is_null(col), True).as_py()
            raise InputError(
                f"source file {f.uri}: id column {id_col!r} has {col.null_count} null "
                f"value(s), first at row {first}; every document needs an id"
            )
        opened.append((f, _ids_table(pc.cast(col, pa.string()).combine_chunks(), len(opened))))
    return opened, skipped


def _checked_join(
    opened: list[tuple[InputFile, pa.Table]],
    old: pa.Table,
    unread_paths: set[str],
    id_col: str,
) -> pa.Table:
    """The ids read tonight, checked for duplicates and joined with the index."""
    ids = pa.concat_tables([t for _, t in opened]) if opened else _ids_table([], -1)
    _check_duplicates(ids, opened, id_col)
    joined = _join_index(ids, old)
    _check_moved_from_unread(joined, opened, unread_paths, id_col)
    return joined


def _check_duplicates(ids: pa.Table, opened: list[tuple[InputFile, pa.Table]], id_col: str) -> None:
    """Refuse ids that appear twice among the files read tonight, naming their files."""
    counts = ids.group_by(DOC_ID).aggregate([("row", "count")])
    dups = counts.filter(pc.greater(counts["row_count"], 1))
    if dups.num_rows == 0:
        return
    shown = []
    for doc in dups[DOC_ID].slice(0, MAX_REPORTED).to_pylist():
        where = ids.filter(pc.equal(ids[DOC_ID], doc))["file"].to_pylist()
        names = ", ".join(dict.fromkeys(opened[i][0].uri for i in where))
        shown.append(f"{doc!r} x{len(where)} in {names}")
    raise InputError(
        f"{dups.num_rows} document id(s) appear more than once in column {id_col!r} of the "
        f"audit source: {'; '.join(shown)}. Every document needs one id; deduplicate the "
        "source or set [input] id_column to a unique column"
    )


def _join_index(ids: pa.Table, old: pa.Table) -> pa.Table:
    """Each id to read with its index row (nulls when new), sorted by file and row.

    One hash join over the whole night, instead of one lookup per batch against an index
    that may hold millions of ids.
    """
    joined = ids.join(old, keys=DOC_ID, join_type="left outer")
    return joined.sort_by([("file", "ascending"), ("row", "ascending")])


def _check_moved_from_unread(
    joined: pa.Table,
    opened: list[tuple[InputFile, pa.Table]],
    unread_paths: set[str],
    id_col: str,
) -> None:
    """An id read tonight that the index places in an unchanged (unread) file is a duplicate:
    that file still holds it."""
    if not unread_paths:
        return
    clash = joined.filter(
        pc.is_in(joined[SOURCE_FILE], value_set=pa.array(sorted(unread_paths), pa.string()))
    )
    if clash.num_rows == 0:
        return
    shown = [
        f"{r[DOC_ID]!r} in {opened[r['file']][0].uri} and {r[SOURCE_FILE]}"
        for r in clash.slice(0, MAX_REPORTED).to_pylist()
    ]
    raise InputError(
        f"{clash.num_rows} document id(s) in column {id_col!r} appear in more than one "
        f"source file: {'; '.join(shown)}. Every document needs one id; deduplicate the "
        "source or set [input] id_column to a unique column"
    )


# --- staging: texts hashed, selected rows written ------------------------------------------


def _hashes(col: pa.Array) -> pa.Array:
    """BLAKE2b-128 of each text, tagged by kind (null / string / bytes / other)."""
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    out = []
    for v in col.to_pylist():
        if v is None:
            payload = _NULL
        elif isinstance(v, str):
            payload = _STR + v.encode("utf-8", "surrogatepass")
        elif isinstance(v, bytes):
            payload = _BYTES + v
        else:
            payload = _OTHER + repr(v).encode()
        out.append(hashlib.blake2b(payload, digest_size=HASH_BYTES).digest())
    return pa.array(out, pa.binary(HASH_BYTES))


class _StagingWriter:
    """Selected rows of one source file, written in row groups of a useful size."""

    def __init__(
        self, fs: pafs.FileSystem, path: str, schema: pa.Schema, rows_per_group: int
    ) -> None:
        self.fs, self.path, self.schema = fs, path, schema
        self.rows_per_group = rows_per_group
        self.buffer: list[pa.RecordBatch] = []
        self.rows = self.bytes = 0
        self.writer: pq.ParquetWriter | None = None
        self.stream: Any = None

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.buffer.append(batch)
        self.rows += batch.num_rows
        self.bytes += batch.nbytes
        if self.rows >= self.rows_per_group or self.bytes >= STAGING_ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self.buffer:
            return
        if self.writer is None:
            self.stream = self.fs.open_output_stream(self.path)
            self.writer = pq.ParquetWriter(self.stream, self.schema, compression="zstd")
        table = pa.Table.from_batches(self.buffer, self.schema)
        self.writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self.buffer, self.rows, self.bytes = [], 0, 0

    def close(self) -> None:
        self._flush()
        if self.writer is not None:
            self.writer.close()
            self.stream.close()

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.stream.close()
            self.fs.delete_file(self.path)


def _stage_files(
    night: _Night,
    staging: str,
    opened: list[tuple[InputFile, pa.Table]],
    joined: pa.Table,
    skipped: list[tuple[InputFile, _Unreadable]],
) -> tuple[_Counts, pa.Table, list[InputFile]]:
    """Stage every file read tonight into ``staging`` (emptied first): the counts, the
    index rows of the files read, and those files. A file that turns out unreadable is
    appended to ``skipped``."""
    night.out_fs.delete_dir_contents(staging, missing_dir_ok=True)
    if is_local(night.out_fs):
        night.out_fs.create_dir(staging, recursive=True)
    counts = _Counts()
    chunks: list[pa.Table] = []
    read_ok: list[InputFile] = []
    offsets = np.searchsorted(joined["file"].to_numpy(), np.arange(len(opened) + 1))
    for k, (f, _) in enumerate(opened):
        expected = joined.slice(offsets[k], offsets[k + 1] - offsets[k])
        target = f"{staging}/{STAGED_FILE.format(k=k)}"
        try:
            chunk, file_counts = _stage_file(night, target, f, expected)
        except _Unreadable as e:
            skipped.append((f, e))
            continue
        chunks.append(chunk)
        read_ok.append(f)
        counts.add(file_counts)
    read = pa.concat_tables(chunks) if chunks else INDEX_SCHEMA.empty_table()
    return counts, read, read_ok


def _changed_while_reading(f: InputFile) -> RunFailed:
    return RunFailed(
        f"source file {f.uri} changed while the audit was reading it; run the audit "
        "again (nothing was committed)"
    )


def _stage_file(
    night: _Night, target: str, f: InputFile, expected: pa.Table
) -> tuple[pa.Table, _Counts]:
    """Stream one source file: hash each text, stage the selected rows, return index rows.

    ``expected`` is the file's ids joined with the index, in row order.
    """
    counts = _Counts()
    parts: list[pa.Table] = []
    today = pa.scalar(dt.date.fromisoformat(night.day), pa.date32())
    writer: _StagingWriter | None = None
    try:
        with night.src_fs.open_input_file(f.path) as raw:
            pf = pq.ParquetFile(raw)
            schema = _staging_schema(pf, f, night.id_col, night.text_col)
            writer = _StagingWriter(night.out_fs, target, schema, night.rows_per_group)
            rows = _stage_batches(night, pf, f, expected, today, writer, parts, counts)
        if rows != expected.num_rows:
            raise _changed_while_reading(f)
        writer.close()
    except (pa.ArrowInvalid, OSError) as e:
        if writer is not None:
            writer.abort()
        if isinstance(e, OSError) and not is_local(night.src_fs):
            raise s3_error(e, f.uri) from e
        raise _unreadable(f, e) from e
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    table = pa.concat_tables(parts) if parts else INDEX_SCHEMA.empty_table()
    return table, counts


def _staging_schema(pf: pq.ParquetFile, f: InputFile, id_col: str, text_col: str) -> pa.Schema:
    """The staged columns (id, text) as the source file types them."""
    names = pf.schema_arrow.names
    if text_col not in names:
        raise InputError(
            f"source file {f.uri} has no column {text_col!r} (set [input] "
            f"text_column); its columns are: {', '.join(names)}"
        )
    return pa.schema([pf.schema_arrow.field(id_col), pf.schema_arrow.field(text_col)])


def _stage_batches(
    night: _Night,
    pf: pq.ParquetFile,
    f: InputFile,
    expected: pa.Table,
    today: pa.Scalar,
    writer: _StagingWriter,
    parts: list[pa.Table],
    counts: _Counts,
) -> int:
    """Classify and stage ``pf`` batch by batch (index rows into ``parts``); rows read."""
    row = 0
    columns = [night.id_col, night.text_col]
    for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS, columns=columns):
        n = batch.num_rows
        want = expected.slice(row, n)
        ids = pc.cast(batch.column(0), pa.string())
        if n != want.num_rows or not ids.equals(want[DOC_ID].combine_chunks()):
            raise _changed_while_reading(f)
        selected, part = _classify_batch(
            batch, ids, want, f.path, today, night.models_changed, counts
        )
        writer.add(batch.filter(selected))
        parts.append(part)
        row += n
    return row


def _classify_batch(
    batch: pa.RecordBatch,
    ids: pa.Array,
    want: pa.Table,
    path: str,
    today: pa.Scalar,
    models_changed: bool,
    counts: _Counts,
) -> tuple[pa.Array, pa.Table]:
    """New / changed / unchanged per document of ``batch``: the rows to stage (mask) and
    their index rows; adds to ``counts``."""
    n = batch.num_rows
    hashes = _hashes(batch.column(1))
    old_hash = want[CONTENT_HASH].combine_chunks()
    is_new = pc.is_null(old_hash)
    changed = pc.fill_null(pc.not_equal(old_hash, hashes), False)
    same = n - (pc.sum(is_new).as_py() or 0) - (pc.sum(changed).as_py() or 0)
    counts.new += pc.sum(is_new).as_py() or 0
    counts.changed += pc.sum(changed).as_py() or 0
    if models_changed:  # every document again, with the new models
        counts.reprocessed += same
        selected = pa.array(np.ones(n, dtype=bool))
    else:
        counts.unchanged += same
        selected = pc.or_(is_new, changed)
    part = pa.table(
        {
            DOC_ID: ids,
            CONTENT_HASH: hashes,
            PROCESSED_DATE: pc.if_else(selected, today, want[PROCESSED_DATE].combine_chunks()),
            SOURCE_FILE: pa.array([path] * n, pa.string()),
        },
        schema=INDEX_SCHEMA,
    )
    return selected, part


# --- the index after tonight ---------------------------------------------------------------


def _next_index(
    old: pa.Table, read: pa.Table, unread_paths: set[str], skipped_paths: set[str]
) -> tuple[pa.Table, int, int]:
    """The index after tonight, the number of removed documents, and unread documents.

    Rows of unread (unchanged) files stay as they are. Rows of files skipped as unreadable
    stay too (their documents are unknown tonight) unless their id turned up elsewhere.
    Rows of files read tonight or gone from the source are replaced by tonight's rows;
    their ids not seen tonight are the removed documents.
    """
    src = old[SOURCE_FILE]
    in_unread = pc.is_in(src, value_set=pa.array(sorted(unread_paths), pa.string()))
    in_skipped = pc.is_in(src, value_set=pa.array(sorted(skipped_paths), pa.string()))
    seen = pc.is_in(old[DOC_ID], value_set=read[DOC_ID])
    keep_unread = old.filter(in_unread)
    keep_skipped = old.filter(pc.and_(in_skipped, pc.invert(seen)))
    others = pc.invert(pc.or_(in_unread, in_skipped))
    removed = pc.sum(pc.and_(others, pc.invert(seen))).as_py() or 0
    index = pa.concat_tables([keep_unread, keep_skipped, read]).sort_by(DOC_ID)
    return index, removed, keep_unread.num_rows


def waiting_since(cfg: Config, source: str, state: dict[str, Any] | None) -> tuple[int, int]:
    """Source files new or changed (size, mtime) since ``state`` recorded them, and the
    documents they hold (footers only: the new or changed ones are among these)."""
    fs, files = resolve_input(source, cfg.storage)
    seen = _file_stamps(fs, files)
    old = state.get("files", {}) if state else {}
    changed = [f for f in files if old.get(f.path) != seen[f.path]]
    docs = 0
    for f in changed:
        if f.document:  # one document per file (and its attachments, if an e-mail)
            docs += 1
            continue
        try:
            with fs.open_input_file(f.path) as raw:
                docs += pq.ParquetFile(raw).metadata.num_rows
        except (OSError, pa.ArrowInvalid):
            continue  # unreadable: the next audit reports it
    return len(changed), docs
