"""Input: resolve a Parquet file, folder, glob or ``s3://`` prefix into work units and batches.

The driver reads only footers (row-group sizes) and the id column (duplicate check);
document text is read by Ray tasks, one row group at a time, cut into batches with
deterministic ids ``<file key>-<row group>-<batch within row group>``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.batch import Batch
from pipeline.config import StorageConfig
from pipeline.errors import InputError
from pipeline.schema import DOC_ID, TEXT, error_table
from pipeline.storage import check_bucket, display_uri, is_local, resolve_uri, s3_error

_GLOB_CHARS = "*?["
MAX_REPORTED_DUPLICATES = 5  # enough to find the pattern, short enough to read


@dataclass(frozen=True)
class InputFile:
    uri: str  # as the user would write it (for messages and the manifest)
    path: str  # path inside ``fs``
    size: int
    key: str  # short stable id used in batch ids


@dataclass(frozen=True)
class WorkUnit:
    """One row group of one file: read once, cut into ``len(batch_ids)`` batches."""

    file: InputFile
    row_group: int
    n_rows: int
    batch_ids: tuple[str, ...]


def _file_key(relative: str) -> str:
    return hashlib.sha1(relative.encode()).hexdigest()[:10]


def resolve_input(uri: str, storage: StorageConfig) -> tuple[pafs.FileSystem, list[InputFile]]:
    """The filesystem and the sorted Parquet files that ``uri`` names (local or S3)."""
    pattern = None
    base = uri
    if any(ch in uri for ch in _GLOB_CHARS):
        cut = min(uri.index(ch) for ch in _GLOB_CHARS if ch in uri)
        base = uri[: uri.rfind("/", 0, cut) + 1] or "."
        pattern = uri[len(base) :]
    fs, root = resolve_uri(base, storage, "input")
    root = root.rstrip("/") or "/"
    try:
        return fs, _list_input(fs, root, uri, pattern)
    except OSError as e:
        if is_local(fs):
            raise
        raise s3_error(e, display_uri(fs, root)) from e


def _list_input(fs: pafs.FileSystem, root: str, uri: str, pattern: str | None) -> list[InputFile]:
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        check_bucket(fs, root, "input")
        raise InputError(f"input {uri!r} does not exist")
    if info.type == pafs.FileType.File and pattern is None:
        shown = uri if is_local(fs) else display_uri(fs, root)
        return [InputFile(shown, root, info.size, _file_key(PurePosixPath(root).name))]
    entries = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    files = []
    for e in sorted(entries, key=lambda e: e.path):
        if e.type != pafs.FileType.File:
            continue
        rel = e.path[len(root) :].lstrip("/")
        if any(part.startswith((".", "_")) for part in rel.split("/")):
            continue  # hidden and _metadata-style files, as pyarrow.dataset skips them
        if pattern is not None:
            if not _glob_regex(pattern).fullmatch(rel):
                continue
        elif not rel.endswith((".parquet", ".parq", ".pq")):
            continue
        files.append(InputFile(display_uri(fs, e.path), e.path, e.size, _file_key(rel)))
    if not files:
        what = f"files matching {pattern!r}" if pattern else "Parquet files (*.parquet)"
        raise InputError(f"input {uri!r} holds no {what}")
    return files


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Shell-style glob over a relative path: ``*``/``?`` stay within one folder level,
    ``**/`` spans any number of levels."""
    out = []
    for part in re.split(r"(\*\*/|\*\*|\*|\?|\[[^\]]*\])", pattern):
        if part == "**/":
            out.append("(?:.*/)?")
        elif part == "**":
            out.append(".*")
        elif part == "*":
            out.append("[^/]*")
        elif part == "?":
            out.append("[^/]")
        elif part.startswith("[") and part.endswith("]") and len(part) > 2:
            out.append(fnmatch.translate(part)[4:-3])  # fnmatch's own class syntax
        else:
            out.append(re.escape(part))
    return re.compile("".join(out))


def _open(fs: pafs.FileSystem, f: InputFile) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(fs.open_input_file(f.path))
    except OSError as e:
        if not is_local(fs):
            raise s3_error(e, f.uri) from e  # access, network: not the file's fault
        raise _not_parquet(f, e) from e
    except pa.ArrowInvalid as e:
        raise _not_parquet(f, e) from e


class UnreadableFile(InputError):
    """An input file that is not readable Parquet; a run over several files skips it."""


def _not_parquet(f: InputFile, e: Exception) -> UnreadableFile:
    return UnreadableFile(
        f"input file {f.uri} is not a readable Parquet file ({e}); remove it from the "
        "input or convert it (`docintel ingest` turns .txt/.md files into Parquet)"
    )


def split_readable(
    fs: pafs.FileSystem, files: list[InputFile]
) -> tuple[list[InputFile], list[dict[str, str]]]:
    """The files whose Parquet footer reads, and ``{uri, reason}`` for the others.

    One corrupt file among many should not stop a nightly run: it is reported by name,
    counted, and the run is marked partial. If no file is readable, that is an error.
    """
    ok: list[InputFile] = []
    skipped: list[dict[str, str]] = []
    first: UnreadableFile | None = None
    for f in files:
        try:
            _open(fs, f)
        except UnreadableFile as e:
            skipped.append({"uri": f.uri, "reason": str(e)})
            first = first or e
            continue
        ok.append(f)
    if not ok and first is not None:
        raise first
    return ok, skipped


def plan(
    fs: pafs.FileSystem, files: list[InputFile], id_column: str, text_column: str, batch_size: int
) -> list[WorkUnit]:
    """Check every file's columns and cut its row groups into batches (footers only)."""
    units = []
    for f in files:
        pf = _open(fs, f)
        names = pf.schema_arrow.names
        for col, flag in ((id_column, "--id-column"), (text_column, "--text-column")):
            if col not in names:
                raise InputError(
                    f"input file {f.uri} has no column {col!r} (set it with {flag}); its "
                    f"columns are: {', '.join(names)}"
                )
        id_type = pf.schema_arrow.field(id_column).type
        if not (
            pa.types.is_string(id_type)
            or pa.types.is_large_string(id_type)
            or pa.types.is_integer(id_type)
            or pa.types.is_dictionary(id_type)
        ):
            raise InputError(
                f"input file {f.uri}: id column {id_column!r} has type {id_type}; "
                "expected strings or integers"
            )
        for rg in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(rg).num_rows
            if n == 0:
                continue
            k = -(-n // batch_size)
            ids = tuple(f"{f.key}-{rg:05d}-{b:05d}" for b in range(k))
            units.append(WorkUnit(f, rg, n, ids))
    return units


def check_ids(fs: pafs.FileSystem, files: list[InputFile], id_column: str) -> int:
    """Refuse null or duplicate document ids before any work; return the document count.

    Reads only the id column. Duplicates are an error, never silently merged: every
    output row must name exactly one input document.
    """
    seen: Counter[str] = Counter()
    where: dict[str, str] = {}
    total = 0
    for f in files:
        pf = _open(fs, f)
        col = pf.read(columns=[id_column]).column(0)
        nulls = col.null_count
        if nulls:
            first = pc.index(pc.is_null(col), True).as_py()
            raise InputError(
                f"input file {f.uri}: id column {id_column!r} has {nulls} null "
                f"value(s), first at row {first}; every document needs an id"
            )
        ids = pc.cast(col, pa.string()).to_pylist()
        seen.update(ids)
        for i in ids:
            where.setdefault(i, f.uri)
        total += len(ids)
    dups = [(i, n) for i, n in seen.items() if n > 1]
    if dups:
        shown = "; ".join(
            f"{i!r} x{n} (first in {where[i]})" for i, n in dups[:MAX_REPORTED_DUPLICATES]
        )
        raise InputError(
            f"{len(dups)} document id(s) appear more than once in column {id_column!r}: "
            f"{shown}. docintel writes one row per document id; deduplicate the input or "
            "choose a unique id column with --id-column"
        )
    return total


def _read_error(doc: str, error_type: str, message: str, batch_id: str) -> dict[str, str]:
    return {
        DOC_ID: doc,
        "stage": "read",
        "error_type": error_type,
        "message": message,
        "batch_id": batch_id,
    }


def _decode_text(
    col: pa.ChunkedArray, ids: list[str], where: str, batch_id: str, text_column: str
) -> tuple[pa.Array, list[dict]]:
    """The text column as strings; documents whose text cannot be a string become errors."""
    col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return col.cast(pa.string()), []
    if pa.types.is_null(t):
        return pa.nulls(len(col), pa.string()), []
    errors = []
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        out: list[str | None] = []
        for doc, raw in zip(ids, col.to_pylist(), strict=True):
            try:
                out.append(None if raw is None else raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                out.append(None)
                message = (
                    f"{where}: text of document {doc!r} is not UTF-8 ({e.reason} at byte {e.start})"
                )
                errors.append(_read_error(doc, "UnicodeDecodeError", message, batch_id))
        return pa.array(out, pa.string()), errors
    message = f"{where}: column {text_column!r} has type {t}; expected string text"
    errors = [_read_error(doc, "TypeError", message, batch_id) for doc in ids]
    return pa.nulls(len(col), pa.string()), errors


def read_unit(
    fs: pafs.FileSystem, unit: WorkUnit, id_column: str, text_column: str, batch_size: int
) -> list[Batch]:
    """Read one row group and cut it into its batches (runs as a Ray task)."""
    pf = _open(fs, unit.file)
    try:
        table = pf.read_row_group(unit.row_group, columns=[id_column, text_column])
        unreadable = None
    except (pa.ArrowInvalid, OSError) as e:
        if isinstance(e, OSError) and not is_local(fs):
            raise  # storage trouble after the S3 retries: the executor retries the batch
        # corrupt text pages: the ids (already read on the driver) still name every document
        table = pf.read_row_group(unit.row_group, columns=[id_column])
        table = table.append_column(text_column, pa.nulls(table.num_rows, pa.string()))
        unreadable = f"text column {text_column!r} could not be decoded ({e})"
    where = f"{unit.file.uri} (row group {unit.row_group})"
    batches = []
    for k, batch_id in enumerate(unit.batch_ids):
        part = table.slice(k * batch_size, batch_size)
        ids = pc.cast(part.column(id_column), pa.string()).combine_chunks()
        text, errs = _decode_text(
            part.column(text_column), ids.to_pylist(), where, batch_id, text_column
        )
        if unreadable:
            errs = [
                _read_error(d, "CorruptData", f"{where}: {unreadable}", batch_id)
                for d in ids.to_pylist()
            ]
        failed = {e[DOC_ID] for e in errs}
        docs = pa.table({DOC_ID: ids, TEXT: text})
        if failed:
            docs = docs.filter(pc.invert(pc.is_in(docs[DOC_ID], pa.array(sorted(failed)))))
        batches.append(Batch(batch_id=batch_id, doc_ids=ids, table=docs, errors=error_table(errs)))
    return batches
