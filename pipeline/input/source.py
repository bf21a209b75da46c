"""Input: resolve a Parquet file, folder, glob or ``s3://`` prefix into work units and batches.

The driver reads only footers (row-group sizes) and the id column (duplicate check);
document text is read by Ray tasks, one work unit at a time, cut into batches with
deterministic ids ``<file key>-<first row group>-<batch within the unit>``. A work unit is
one row group, or several consecutive small ones (until they hold a batch, or
UNIT_BYTES): a file of 2,000 one-row row groups is read by a few tasks, each parsing its
footer once, not by 2,000 tasks that each parse the whole footer again.

The file key is the file's identity: its path relative to the input root and a hash of its
Parquet footer (schema, row groups, sizes, statistics), so a different file that happens to
share a name never shares batch ids, while the same file read from another folder does.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline.batch import Batch
from docintel.pipeline.config import StorageConfig
from docintel.pipeline.errors import InputError
from docintel.pipeline.input.documents import (
    DOCUMENT_SUFFIXES,
    DocumentUnit,
    is_document,
    read_documents,
)
from docintel.pipeline.input.idcheck import find_duplicates, rows_per_read
from docintel.pipeline.schema import DOC_ID, TEXT, error_table
from docintel.pipeline.storage import check_bucket, display_uri, is_local, resolve_uri, s3_error

_GLOB_CHARS = "*?["
MAX_REPORTED_DUPLICATES = 5  # enough to find the pattern, short enough to read


@dataclass(frozen=True)
class InputFile:
    uri: str  # as the user would write it (for messages and the manifest)
    path: str  # path inside ``fs``
    size: int
    key: str  # short stable id used in batch ids
    rel: str = ""  # path relative to the input root ("/" separators): a document file's id
    document: bool = False  # a document file for the parse stage, not Parquet


# A work unit of merged small row groups closes at this many uncompressed bytes even if it
# holds fewer rows than a batch: a read task's memory stays bounded by the row groups'
# size, not by how many of them a writer chose to make.
UNIT_BYTES = 64 * 1024 * 1024
FOOTER_TAIL = 8  # a Parquet file ends with the footer's length (4 bytes LE) and b"PAR1"
STREAM_BUFFER_BYTES = 8 * 1024 * 1024  # read buffer when streaming a huge row group
STREAM_ROWS = 1024  # rows per decoded record batch when streaming a huge row group


@dataclass(frozen=True)
class WorkUnit:
    """Consecutive row groups of one file: read once, cut into ``len(batch_ids)`` batches."""

    file: InputFile
    row_groups: tuple[int, ...]
    n_rows: int
    batch_ids: tuple[str, ...]
    # A slice of one row group bigger than UNIT_BYTES: its rows start after ``skip_rows``
    # and are read by streaming the row group, never holding it whole.
    skip_rows: int = 0
    streamed: bool = False

    @property
    def where(self) -> str:
        first, last = self.row_groups[0], self.row_groups[-1]
        groups = f"row group {first}" if first == last else f"row groups {first}-{last}"
        if self.streamed:
            groups += f", rows {self.skip_rows}-{self.skip_rows + self.n_rows - 1}"
        return f"{self.file.uri} ({groups})"


def _file_key(relative: str) -> str:
    return hashlib.sha1(relative.encode()).hexdigest()[:10]


def _identity(fs: pafs.FileSystem, f: InputFile) -> str:
    """``f.key`` (its relative path) plus a hash of its raw Parquet footer: two reads of the
    file's tail on the driver."""
    with fs.open_input_file(f.path) as raw:
        size = raw.size()
        raw.seek(size - FOOTER_TAIL)
        length = int.from_bytes(raw.read(4), "little")
        raw.seek(max(size - FOOTER_TAIL - length, 0))
        footer = raw.read(length)
    return hashlib.sha1(f.key.encode() + footer).hexdigest()[:12]


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
        name = PurePosixPath(root).name
        return [InputFile(shown, root, info.size, _file_key(name), name, is_document(name))]
    entries = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    files, others = [], []
    listed = sorted((*_entry_path(e), e.size) for e in entries if e.type == pafs.FileType.File)
    for path, decoded, size in listed:
        rel = path[len(root) :].lstrip("/")
        if any(part.startswith((".", "_")) for part in rel.split("/")):
            continue  # hidden and _metadata-style files, as pyarrow.dataset skips them
        doc = is_document(rel)
        taken = _glob_regex(pattern).fullmatch(rel) if pattern else rel.endswith(_PARQUET) or doc
        if not taken:
            others.append(rel)
        elif not decoded:
            raise InputError(
                f"input file {rel} has a name that is not UTF-8 (shown with \\x escapes), "
                f"which cannot be opened: rename it to UTF-8. {_INGEST_HINT}"
            )
        else:
            files.append(InputFile(display_uri(fs, path), path, size, _file_key(rel), rel, doc))
    if not files:
        raise _nothing_to_read(uri, pattern, others)
    return _one_kind(uri, files)


def _one_kind(uri: str, files: list[InputFile]) -> list[InputFile]:
    """``files`` when they are all Parquet or all document files; a mix is refused."""
    docs = [f.rel for f in files if f.document]
    if not docs or len(docs) == len(files):
        return files
    tables = [f.rel for f in files if not f.document]
    raise InputError(
        f"input {uri!r} mixes Parquet files ({_some(tables)}) and document files "
        f"({_some(docs)}); a run reads one kind: give the folders, or a glob, separately"
    )


def _some(names: list[str]) -> str:
    more = f" and {len(names) - 3:,} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


_PARQUET = (".parquet", ".parq", ".pq")
_INGEST_HINT = (
    "`docintel ingest DIR FILE.parquet` reads a folder of documents into Parquet (a name "
    "that is not UTF-8 becomes %XX in its doc_id)."
)


def _entry_path(e: pafs.FileInfo) -> tuple[str, bool]:
    """The entry's path and whether it decoded. pyarrow raises on a name that is not
    UTF-8 (such a file cannot be opened through it); that name comes back as text with
    each undecodable byte as ``\\xNN``, to be named in a message."""
    try:
        return e.path, True
    except UnicodeDecodeError as err:
        return bytes(err.object).decode("utf-8", "backslashreplace"), False


def _nothing_to_read(uri: str, pattern: str | None, others: list[str]) -> InputError:
    kinds = ", ".join(sorted(DOCUMENT_SUFFIXES))
    what = f"files matching {pattern!r}" if pattern else f"Parquet files or documents ({kinds})"
    if not others:
        return InputError(f"input {uri!r} holds no {what}")
    shown = _some(others)
    return InputError(f"input {uri!r} holds no {what}, only other files ({shown}). {_INGEST_HINT}")


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
        ok.append(dataclasses.replace(f, key=_identity(fs, f)))
    if not ok and first is not None:
        raise first
    return ok, skipped


def plan(
    fs: pafs.FileSystem, files: list[InputFile], id_column: str, text_column: str, batch_size: int
) -> list[WorkUnit]:
    """Check every file's columns and cut its row groups into batches (footers only)."""
    return plan_sized(fs, files, id_column, text_column, batch_size)[0]


def plan_sized(
    fs: pafs.FileSystem,
    files: list[InputFile],
    id_column: str,
    text_column: str,
    batch_size: int,
    target_bytes: int = 0,
) -> tuple[list[WorkUnit], int]:
    """:func:`plan`; with ``target_bytes``, the batch size is instead sized so that a batch
    holds about that many bytes of text, from the footers' uncompressed sizes of the text
    column (the mean over every file: one batch size for the run, deterministic for the
    same input), within [batch_size, MAX_BATCH_DOCS]. Returns the units and the size."""
    # per file, per row group: (rows, bytes, text column bytes), small whatever the footer
    shapes = [(f, _row_groups(_checked(fs, f, id_column, text_column), text_column)) for f in files]
    if target_bytes:
        batch_size = _sized(shapes, target_bytes, batch_size)
    units = []
    for f, groups in shapes:
        units += _units(f, groups, batch_size)
    return units, batch_size


def _row_groups(md: pq.FileMetaData, text_column: str) -> list[tuple[int, int, int]]:
    col = md.schema.to_arrow_schema().get_field_index(text_column)
    out = []
    for rg in range(md.num_row_groups):
        meta = md.row_group(rg)
        out.append((meta.num_rows, meta.total_byte_size, meta.column(col).total_uncompressed_size))
    return out


# Upper bound of a batch sized by bytes, in documents: 16,384 one-sentence documents are
# ~0.33 s of a card's work per call, and the footers' sizes can underestimate the text
# (a dictionary-encoded column of repeated texts is smaller than the texts), so this cap,
# not the byte target, bounds a batch of short or repetitive documents.
MAX_BATCH_DOCS = 16_384


def _sized(
    shapes: list[tuple[InputFile, list[tuple[int, int, int]]]], target: int, low: int
) -> int:
    rows = sum(n for _, groups in shapes for n, _, _ in groups)
    text = sum(t for _, groups in shapes for _, _, t in groups)
    if not rows:
        return low
    return max(low, min(MAX_BATCH_DOCS, int(target / max(text / rows, 1.0))))


def _checked(
    fs: pafs.FileSystem, f: InputFile, id_column: str, text_column: str
) -> pq.FileMetaData:
    """The file's footer, after checking it has the id and text columns, ids typed."""
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
    return pf.metadata


def _slices(f: InputFile, rg: int, rows: int, size: int, batch_size: int) -> list[WorkUnit]:
    """A row group over UNIT_BYTES, cut into units of whole batches of about UNIT_BYTES,
    each read by streaming the row group (batch ids as if it were one unit)."""
    per_unit = max(1, int(UNIT_BYTES / max(size / rows * batch_size, 1)))
    k = -(-rows // batch_size)
    units = []
    for first in range(0, k, per_unit):
        last = min(first + per_unit, k)
        n = min(rows, last * batch_size) - first * batch_size
        ids = tuple(f"{f.key}-{rg:05d}-{b:05d}" for b in range(first, last))
        units.append(WorkUnit(f, (rg,), n, ids, skip_rows=first * batch_size, streamed=True))
    return units


def _units(f: InputFile, shape: list[tuple[int, int, int]], batch_size: int) -> list[WorkUnit]:
    """Row groups with at least a batch of rows are a unit each (cut in slices when over
    UNIT_BYTES); runs of smaller ones are merged until they hold a batch or UNIT_BYTES."""
    units: list[WorkUnit] = []
    groups: list[int] = []
    rows = size = 0
    last_rg = len(shape) - 1
    for rg, (num_rows, total_bytes, _) in enumerate(shape):
        if num_rows == 0:
            continue
        if total_bytes > UNIT_BYTES and num_rows > batch_size:
            if groups:  # what was merged so far is a unit of its own
                k = -(-rows // batch_size)
                ids = tuple(f"{f.key}-{groups[0]:05d}-{b:05d}" for b in range(k))
                units.append(WorkUnit(f, tuple(groups), rows, ids))
                groups, rows, size = [], 0, 0
            units += _slices(f, rg, num_rows, total_bytes, batch_size)
            continue
        groups.append(rg)
        rows += num_rows
        size += total_bytes
        if rows >= batch_size or size >= UNIT_BYTES or rg == last_rg:
            k = -(-rows // batch_size)
            ids = tuple(f"{f.key}-{groups[0]:05d}-{b:05d}" for b in range(k))
            units.append(WorkUnit(f, tuple(groups), rows, ids))
            groups, rows, size = [], 0, 0
    return units


def _check_id_batch(col: pa.Array, f: InputFile, row0: int, id_column: str, max_bytes: int) -> None:
    """No null ids, none longer than ``max_bytes`` (rows counted from the file's start)."""
    if col.null_count:
        first = row0 + pc.index(pc.is_null(col), True).as_py()
        raise InputError(
            f"input file {f.uri}: id column {id_column!r} has a null value at row {first}; "
            "every document needs an id"
        )
    lengths = pc.binary_length(col)
    longest = pc.max(lengths).as_py() or 0
    if longest > max_bytes:
        row = row0 + pc.index(pc.greater(lengths, max_bytes), True).as_py()
        raise InputError(
            f"input file {f.uri}: the id in column {id_column!r} at row {row} is {longest:,} "
            f"bytes long, over the limit of {max_bytes:,} ([input] max_id_bytes): ids are "
            "copied into every sentence row. Use a shorter id column (--id-column), or "
            "raise [input] max_id_bytes"
        )


def check_ids(
    fs: pafs.FileSystem,
    files: list[InputFile],
    id_column: str,
    max_id_bytes: int = 1024,
    total: int | None = None,
) -> int:
    """Refuse null, oversized or duplicate document ids before any work; return the
    document count.

    Streams the id columns in record batches; duplicates are found by hash partitions on
    local disk (pipeline/input/idcheck.py), so the driver's memory does not grow with the
    corpus. Duplicates are an error, never silently merged: every output row must name
    exactly one input document.
    """
    if total is None:  # the planner passes it; footers are read only when it does not
        total = sum(_open(fs, f).metadata.num_rows for f in files)

    def read_ids() -> Iterator[tuple[str, pa.Array]]:
        for f in files:
            row = 0
            batches = _open(fs, f).iter_batches(  # sized in bytes: pipeline/input/idcheck.py
                batch_size=rows_per_read(max_id_bytes), columns=[id_column]
            )
            for rb in batches:
                ids = pc.cast(rb.column(0), pa.string())
                _check_id_batch(ids, f, row, id_column, max_id_bytes)
                row += rb.num_rows
                yield f.uri, ids

    n, dups = find_duplicates(read_ids, total, MAX_REPORTED_DUPLICATES)
    if n:
        shown = "; ".join(f"{i!r} x{k} (first in {where})" for i, k, where in dups)
        raise InputError(
            f"{n} document id(s) appear more than once in column {id_column!r}: "
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


def _read_groups(
    fs: pafs.FileSystem, pf: pq.ParquetFile, unit: WorkUnit, id_column: str, text_column: str
) -> tuple[pa.Table, dict[str, str]]:
    """The unit's ids and texts, and ``{doc id: reason}`` for documents whose text pages are
    corrupt (their ids, read on the driver already, still name them). A merged unit falls
    back to one row group at a time, so one bad row group does not spoil its neighbours."""
    cols = [id_column, text_column]
    try:
        if unit.streamed:
            return _read_slice(fs, unit, cols), {}
        return pf.read_row_groups(list(unit.row_groups), columns=cols), {}
    except (pa.ArrowInvalid, OSError) as e:
        if isinstance(e, OSError) and not is_local(fs):
            raise  # storage trouble after the S3 retries: the executor retries the batch
        if unit.streamed:  # the slice's ids still name every document
            ids = _read_slice(fs, unit, [id_column])
            reason = f"{unit.where}: text column {text_column!r} could not be decoded ({e})"
            table = ids.append_column(text_column, pa.nulls(ids.num_rows, pa.string()))
            return table, dict.fromkeys(pc.cast(ids[id_column], pa.string()).to_pylist(), reason)
    parts, corrupt = [], {}
    for rg in unit.row_groups:
        try:
            parts.append(pf.read_row_group(rg, columns=cols))
            continue
        except (pa.ArrowInvalid, OSError) as e:
            if isinstance(e, OSError) and not is_local(fs):
                raise
            where = f"{unit.file.uri} (row group {rg})"
            reason = f"{where}: text column {text_column!r} could not be decoded ({e})"
        ids = pf.read_row_group(rg, columns=[id_column])
        parts.append(ids.append_column(text_column, pa.nulls(ids.num_rows, pa.string())))
        corrupt.update(dict.fromkeys(pc.cast(ids[id_column], pa.string()).to_pylist(), reason))
    return pa.concat_tables(parts, promote_options="permissive"), corrupt


def _read_slice(fs: pafs.FileSystem, unit: WorkUnit, cols: list[str]) -> pa.Table:
    """Rows ``skip_rows .. skip_rows + n_rows`` of one row group, streamed page by page:
    memory holds the slice and one record batch, never the whole row group. The rows
    before the slice are decoded and dropped (the price of bounded memory)."""
    with fs.open_input_file(unit.file.path) as raw:
        pf = pq.ParquetFile(raw, buffer_size=STREAM_BUFFER_BYTES, pre_buffer=False)
        kept: list[pa.RecordBatch] = []
        pos, start, stop = 0, unit.skip_rows, unit.skip_rows + unit.n_rows
        for rb in pf.iter_batches(STREAM_ROWS, row_groups=list(unit.row_groups), columns=cols):
            a, b = max(start, pos), min(stop, pos + rb.num_rows)
            if a < b:
                kept.append(rb.slice(a - pos, b - a))
            pos += rb.num_rows
            if pos >= stop:
                break
    return pa.Table.from_batches(kept, schema=pa.schema([pf.schema_arrow.field(c) for c in cols]))


def read_unit(
    fs: pafs.FileSystem,
    unit: WorkUnit | DocumentUnit,
    id_column: str,
    text_column: str,
    batch_size: int,
) -> list[Batch]:
    """Read one work unit and cut it into its batches (runs as a Ray task)."""
    if isinstance(unit, DocumentUnit):
        return read_documents(fs, unit)
    pf = _open(fs, unit.file)
    table, corrupt = _read_groups(fs, pf, unit, id_column, text_column)
    batches = []
    for k, batch_id in enumerate(unit.batch_ids):
        part = table.slice(k * batch_size, batch_size)
        ids = pc.cast(part.column(id_column), pa.string()).combine_chunks()
        text, errs = _decode_text(
            part.column(text_column), ids.to_pylist(), unit.where, batch_id, text_column
        )
        errs = [e for e in errs if e[DOC_ID] not in corrupt] + [
            _read_error(d, "CorruptData", corrupt[d], batch_id)
            for d in ids.to_pylist()
            if d in corrupt
        ]
        failed = {e[DOC_ID] for e in errs}
        docs = pa.table({DOC_ID: ids, TEXT: text})
        if failed:
            docs = docs.filter(pc.invert(pc.is_in(docs[DOC_ID], pa.array(sorted(failed)))))
        batches.append(Batch(batch_id=batch_id, doc_ids=ids, table=docs, errors=error_table(errs)))
    return batches
