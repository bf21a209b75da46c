"""`docintel ingest`: a folder of text files becomes a documents Parquet file.

Secure by default: nothing outside FOLDER is read, binary and oversized files are
reported instead of ingested, an undecodable file name never aborts the run, memory stays
bounded whatever the corpus size, and OUTPUT appears only once it is complete.

Encodings: a byte-order mark decides (UTF-8, UTF-16 or UTF-32; the mark is dropped); a
file that is valid UTF-8 is read as UTF-8; any other is decoded with the encoding
charset-normalizer detects (or the one given, ``encoding=``), except that text which reads
as Western European cp1252 (few, isolated non-ASCII bytes, all Latin letters or common
symbols such as £ € «) is read as cp1252 when the detector's guess is a codec of another
script or an old DOS/Mac code page (it read a Latin-1 "£" as shift_jis "｣"). The
``encoding`` column records the encoding per file and the ``decoding`` column how it was
chosen: ``exact`` (UTF-8, or a byte-order mark), ``given``, ``guessed`` (detected) or
``lossy`` (bytes it does not map became U+FFFD). Every guessed file is named in
``IngestResult.guessed`` and every lossy one in ``IngestResult.lossy``.

doc_id escaping (reversible, see ``doc_id_for`` / ``doc_id_to_path``): the path relative
to FOLDER is decoded with ``os.fsdecode`` (surrogateescape), each byte that is not valid
UTF-8 is written as ``%XX`` (two upper-case hex digits) and a literal ``%`` as ``%25``;
everything else is kept as is, with ``/`` between folders. ``b"caf\\xe9.txt"`` becomes
``"caf%E9.txt"``, ``"100%.txt"`` becomes ``"100%25.txt"``.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from docintel.pipeline.errors import InputError, OutputError, RunFailed
from docintel.pipeline.input.documents import DOCUMENT_SUFFIXES
from docintel.pipeline.input.encoding import BOMS, detect_encoding
from docintel.pipeline.schema import DOC_ID, PAGE_STARTS, SOURCE_FORMAT, TEXT, TITLE

# Row groups are the unit a run reads (docintel.pipeline.input.source): a few thousand documents
# make useful work units and keep several per big corpus. The byte bound caps the buffered
# text when files are large, so memory is one row group plus one file, not the corpus
# (peak: a few times ROW_GROUP_BYTES, for the Python strings, their Arrow copy and the
# encoded pages, plus the current file; measured ~340 MiB at these defaults, flat in the
# corpus size).
ROW_GROUP_DOCS = 10_000
ROW_GROUP_BYTES = 64 * 1024 * 1024
# Larger files are skipped and reported, never loaded: a text document this big is almost
# always a log, a dump or a mistake, and one file must not decide the process's memory.
MAX_FILE_BYTES = 64 * 1024 * 1024
# Binary sniffing: a NUL byte in the first SNIFF_BYTES means binary (text has none; UTF-16
# without a byte-order mark counts as binary: convert it to UTF-8). A file that is not valid
# UTF-8 is binary when more than BINARY_FRACTION of its bytes are undecodable or control
# characters; below that it is text with a few bad bytes, ingested with U+FFFD replacement
# characters and counted.
SNIFF_BYTES = 8 * 1024
BINARY_FRACTION = 0.30

ENCODING = "encoding"  # the column: the encoding each file was decoded with
DECODING = "decoding"  # the column: how that encoding was chosen, one of these four
EXACT = "exact"  # valid UTF-8, or the encoding its byte-order mark declares
GIVEN = "given"  # the encoding given (--encoding), every byte mapped
GUESSED = "guessed"  # detected (charset-normalizer, or the cp1252 rule), every byte mapped
LOSSY = "lossy"  # bytes its encoding does not map became U+FFFD
PARSED = "parsed"  # the ``decoding`` of a document read by its parser (no text encoding)
SCHEMA = pa.schema(
    [
        (DOC_ID, pa.string()),
        (TEXT, pa.string()),
        (ENCODING, pa.string()),
        (DECODING, pa.string()),
        (SOURCE_FORMAT, pa.string()),
        (TITLE, pa.string()),
        (PAGE_STARTS, pa.list_(pa.int64())),  # PDF: each page's first character in text
    ]
)
# The files ingest takes when no --pattern is given: every type `docintel run` reads. With
# these, every other file is listed as skipped (with --pattern, only what matches counts).
DEFAULT_PATTERNS = tuple(f"*{suffix}" for suffix in DOCUMENT_SUFFIXES)
NOT_A_DOCUMENT = f"not a document type docintel reads ({', '.join(DOCUMENT_SUFFIXES)})"
UTF8 = "utf-8"
# Undecodable bytes (lone surrogates from surrogateescape) and control characters other
# than the whitespace, backspace and escape that real text files carry.
_NOT_TEXT = re.compile("[\udc80-\udcff\x00-\x07\x0e-\x1a\x1c-\x1f\x7f]")
_ESCAPED = re.compile("[%\udc80-\udcff]")
_UTF8_BEYOND_ASCII = re.compile("[^\x00-\x7f\udc80-\udcff]")  # a valid multi-byte character
_BAD_BYTE = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8 (surrogateescape)
_PERCENT = re.compile("%([0-9A-Fa-f]{2})")
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # the file itself must not be a symlink (race)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in must not hang the open


@dataclass(frozen=True)
class Skipped:
    """A file (or folder) that was not ingested: its escaped relative path and why."""

    doc_id: str
    reason: str


@dataclass
class IngestResult:
    """What ``ingest_folder`` wrote and what it left out."""

    output: Path
    documents: int = 0  # rows written
    replaced: int = 0  # of those, files whose undecodable bytes became U+FFFD
    skipped: list[Skipped] = field(default_factory=list)
    lossy: list[str] = field(default_factory=list)  # the doc_ids of those files
    encodings: dict[str, int] = field(default_factory=dict)  # files per encoding, not UTF-8
    # (doc_id, encoding) of every file whose encoding was detected, not known: no byte-order
    # mark, not UTF-8, no encoding given (decoded lossily too: also in ``lossy``)
    guessed: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class _Candidate:
    parts: tuple[str, ...]  # relative path, fsdecoded (surrogateescape); the sort key
    real: str  # its real path, inside FOLDER


def _escape(s: str) -> str:
    def sub(m: re.Match[str]) -> str:
        c = m.group()
        return "%25" if c == "%" else f"%{ord(c) - 0xDC00:02X}"

    return _ESCAPED.sub(sub, s)


def doc_id_for(relative: bytes | str) -> str:
    """The doc_id of a path relative to FOLDER (bytes, or str from os.fsdecode)."""
    return _escape(os.fsdecode(relative).replace(os.sep, "/"))


def doc_id_to_path(doc_id: str) -> bytes:
    """The relative path (bytes, ``/``-separated) a doc_id was made from: the inverse."""
    out, pos = bytearray(), 0
    for m in _PERCENT.finditer(doc_id):
        out += doc_id[pos : m.start()].encode("utf-8") + bytes([int(m.group(1), 16)])
        pos = m.end()
    return bytes(out + doc_id[pos:].encode("utf-8"))


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _matches(parts: tuple[str, ...], patterns: list[str]) -> bool:
    rel = PurePosixPath(*parts)
    return any(rel.match(p) for p in patterns)


def _walk(root: str, patterns: list[str], skipped: list[Skipped]) -> list[_Candidate]:
    """Every matching regular file under ``root`` (a real path), in no particular order.

    Real folders are always walked. A symlink is followed only when its real path stays
    inside ``root``; a symlinked folder only when that real folder was not walked yet (no
    loops, no exponential aliasing). Symlinks leaving ``root`` are reported, never read.
    """
    found: list[_Candidate] = []
    visited = {root}
    stack: list[tuple[str, tuple[str, ...]]] = [(root, ())]
    while stack:
        real_dir, rel = stack.pop()
        try:
            with os.scandir(real_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            skipped.append(Skipped(_rel_id(rel), f"cannot list this folder: {e.strerror}"))
            continue
        subdirs: list[tuple[str, tuple[str, ...]]] = []
        for entry in entries:  # in name order: of two links to one folder, the first wins
            parts = (*rel, entry.name)
            if entry.is_symlink():
                _symlink(entry, parts, root, patterns, visited, subdirs, found, skipped)
            elif entry.is_dir(follow_symlinks=False):
                real = entry.path  # real_dir is real and entry is no symlink
                visited.add(real)
                subdirs.append((real, parts))
            elif _matches(parts, patterns):
                if entry.is_file(follow_symlinks=False):
                    found.append(_Candidate(parts, entry.path))
                else:
                    skipped.append(
                        Skipped(_rel_id(parts), "not a regular file (FIFO, socket or device)")
                    )
            elif patterns == list(DEFAULT_PATTERNS) and not entry.name.startswith("."):
                skipped.append(Skipped(_rel_id(parts), NOT_A_DOCUMENT))
        stack.extend(reversed(subdirs))  # depth first, in name order
    return found


def _rel_id(parts: tuple[str, ...]) -> str:
    return _escape("/".join(parts)) or "."


def _symlink(
    entry: os.DirEntry[str],
    parts: tuple[str, ...],
    root: str,
    patterns: list[str],
    visited: set[str],
    subdirs: list[tuple[str, tuple[str, ...]]],
    found: list[_Candidate],
    skipped: list[Skipped],
) -> None:
    real = os.path.realpath(entry.path)
    try:
        mode = entry.stat().st_mode  # the target's
    except OSError:
        mode = None
    is_dir = mode is not None and stat.S_ISDIR(mode)
    if not is_dir and not _matches(parts, patterns):
        return  # not a file ingest would take: nothing to report
    doc_id = _rel_id(parts)
    if not _inside(real, root):
        what = "folder" if is_dir else "file"
        skipped.append(
            Skipped(
                doc_id,
                f"symlink to a {what} outside the input folder ({_escape(real)}); not read. "
                "Copy it into the folder if it belongs to the corpus",
            )
        )
    elif mode is None:
        skipped.append(Skipped(doc_id, "broken symlink (its target does not exist)"))
    elif is_dir and real in visited:
        where = (
            "an enclosing folder (a loop)"
            if _inside(str(Path(entry.path).parent), real)
            else "a folder already walked"
        )
        skipped.append(Skipped(doc_id, f"symlink to {where}; not followed"))
    elif is_dir:
        visited.add(real)
        subdirs.append((real, parts))
    elif stat.S_ISREG(mode):
        found.append(_Candidate(parts, real))
    else:
        skipped.append(Skipped(doc_id, "symlink to something other than a regular file"))


def _read(real: str, max_bytes: int) -> bytes | str:
    """The file's bytes, or why it was not read. Never more than ``max_bytes + 1`` bytes."""
    try:
        fd = os.open(real, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK)
    except OSError as e:
        return f"cannot open: {e.strerror}"
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return "not a regular file (it changed while ingesting)"
            raw = b"" if st.st_size > max_bytes else f.read(max_bytes + 1)
        except OSError as e:
            return f"cannot read: {e.strerror}"
    size = max(st.st_size, len(raw))
    if size > max_bytes:
        return (
            f"too large: {size:,} bytes, over the {max_bytes:,}-byte cap; split it, or "
            "raise the cap (--max-file-mib)"
        )
    return raw


@dataclass(frozen=True)
class _Decoded:
    text: str
    encoding: str  # the codec's name, the ``encoding`` column
    how: str  # EXACT, GIVEN, GUESSED or LOSSY, the ``decoding`` column
    guessed: bool = False  # detected (also when LOSSY)


def _decode(raw: bytes, encoding: str | None = None) -> _Decoded | str:
    """The decoded file, or why it is binary.

    ``encoding`` given: every file is decoded with it. Else a byte-order mark decides;
    else UTF-8 when the file is valid UTF-8; a file with at least as many valid multi-byte
    UTF-8 characters as bad bytes is damaged UTF-8 (bad bytes replaced); any other is
    decoded with ``detect_encoding``'s guess; when it has none, the file is binary, or
    UTF-8 with its bad bytes replaced."""
    if encoding is not None:
        return _decode_as(raw, encoding, GIVEN)
    marked = _by_bom(raw)
    if marked is not None:
        return marked
    if b"\0" in raw[:SNIFF_BYTES]:
        return f"binary: NUL bytes in the first {SNIFF_BYTES // 1024} KiB; not ingested"
    try:
        return _Decoded(raw.decode(UTF8), UTF8, EXACT)
    except UnicodeDecodeError:
        return _decode_not_utf8(raw)


def _decode_not_utf8(raw: bytes) -> _Decoded | str:
    """Damaged UTF-8 (bad bytes replaced), the detected encoding, or why it is binary.
    Counting valid characters against bad bytes keeps a shift_jis or EUC file, where a
    few byte pairs happen to be valid UTF-8, from passing for damaged UTF-8."""
    loose = raw.decode(UTF8, errors="surrogateescape")  # one lone surrogate per bad byte
    valid = len(loose) - len(_UTF8_BEYOND_ASCII.sub("", loose))  # counts, no lists
    if valid < len(loose) - len(_BAD_BYTE.sub("", loose)):  # not damaged UTF-8: detect
        detected = detect_encoding(raw)
        if detected is not None:
            return _decode_as(raw, detected, GUESSED)
    bad = len(loose) - len(_NOT_TEXT.sub("", loose))
    if bad > BINARY_FRACTION * len(raw):
        return (
            f"binary: {bad / len(raw):.0%} of its bytes are undecodable or control "
            "characters; not ingested (convert it to UTF-8 text if it is text, or pass "
            "--encoding)"
        )
    return _Decoded(raw.decode("utf-8-sig", errors="replace"), UTF8, LOSSY)


def _by_bom(raw: bytes) -> _Decoded | None:
    """The text a byte-order mark declares (the mark dropped), or None: no mark, or bytes
    its encoding rejects (damaged UTF-8 or binary: the usual checks decide)."""
    for bom, codec in BOMS:
        if raw.startswith(bom):
            try:
                return _Decoded(raw[len(bom) :].decode(codec), codec, EXACT)
            except UnicodeDecodeError:
                return None
    return None


def _decode_as(raw: bytes, encoding: str, how: str) -> _Decoded:
    guessed = how == GUESSED
    try:
        return _Decoded(raw.decode(encoding), encoding, how, guessed)
    except UnicodeDecodeError:
        return _Decoded(raw.decode(encoding, errors="replace"), encoding, LOSSY, guessed)


def check_encoding(encoding: str | None) -> str | None:
    """The codec's canonical name; InputError for a name Python does not know."""
    if encoding is None:
        return None

    try:
        return codecs.lookup(encoding).name
    except LookupError:
        raise InputError(
            f"--encoding {encoding!r}: not an encoding Python knows (e.g. utf-8, cp1252, "
            "latin-1, shift_jis)"
        ) from None


class _RowGroups:
    """Buffers rows and writes a row group every ``docs`` documents or ``nbytes`` bytes."""

    def __init__(self, writer: pq.ParquetWriter, docs: int, nbytes: int) -> None:
        self.writer, self.docs, self.nbytes = writer, max(1, docs), nbytes
        self.ids: list[str] = []
        self.texts: list[str] = []
        self.rows: list[dict[str, object]] = []
        self.size = 0

    def add(self, doc_id: str, decoded: _Decoded, size: int, fmt: str) -> None:
        row = {DOC_ID: doc_id, TEXT: decoded.text, ENCODING: decoded.encoding,
               DECODING: decoded.how, SOURCE_FORMAT: fmt}  # fmt: skip
        self.add_row(row, size)

    def add_row(self, row: dict[str, object], size: int) -> None:
        self.rows.append(row)
        self.size += size
        if len(self.rows) >= self.docs or self.size >= self.nbytes:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        table = pa.Table.from_pylist(self.rows, schema=SCHEMA)
        self.writer.write_table(table, row_group_size=table.num_rows)
        self.rows = []
        self.size = 0


def _candidates(folder: Path, patterns: list[str], skipped: list[Skipped]) -> list[tuple[str, str]]:
    """(doc_id, real path) of every file to read, sorted, each real file once."""
    given, patterns = patterns, [p.removeprefix("**/") for p in patterns]  # any depth
    if not patterns or any(p.startswith("/") or ".." in p.split("/") for p in patterns):
        raise InputError(
            f"--pattern {given!r}: patterns are globs relative to the folder, such as "
            "'*.txt' or 'reports/*.md'; pass at least one, without '/' at the start or '..'"
        )
    found = _walk(os.path.realpath(folder), patterns, skipped)
    found.sort(key=lambda c: c.parts)
    first: dict[str, str] = {}
    out = []
    for c in found:
        doc_id = _rel_id(c.parts)
        if c.real in first:
            skipped.append(Skipped(doc_id, f"same file as {first[c.real]} (via a symlink)"))
            continue
        first[c.real] = doc_id
        out.append((doc_id, c.real))
    return out


def _temp_beside(output: Path) -> tuple[int, Path]:
    """A new file beside ``output`` (same folder, so the final rename is atomic)."""
    if output.is_dir():
        raise OutputError(
            f"{output} is a folder; give the Parquet file to write, e.g. {output}/documents.parquet"
        )
    tmp = output.with_name(f".{output.name}.{secrets.token_hex(4)}.tmp")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        # 0o666 minus the umask: the same permissions a plain write would give OUTPUT.
        return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
    except OSError as e:
        raise OutputError(
            f"cannot create {tmp} beside the output {output}: {e.strerror}; choose a "
            "writable output location"
        ) from e


def _nothing_ingested(folder: Path, patterns: list[str], skipped: list[Skipped]) -> InputError:
    if not skipped:
        return InputError(
            f"{folder} holds no files matching {', '.join(patterns)}; check the folder, or "
            "pass --pattern for other file names"
        )
    shown = "; ".join(f"{s.doc_id}: {s.reason}" for s in skipped[:5])
    more = f" (and {len(skipped) - 5} more)" if len(skipped) > 5 else ""
    return InputError(
        f"nothing ingested from {folder}: every matching file was skipped: {shown}{more}. "
        "Fix or remove those files, or narrow --pattern"
    )


def _write_failed(tmp: Path, output: Path, e: OSError) -> RunFailed:
    """Why writing the temporary file failed, and that ``output`` was left as it was."""
    return RunFailed(
        f"writing {tmp} (the temporary file for {output}) failed: "
        f"{e.strerror or e}; {output} was left as it was. Free space or fix the "
        "folder's permissions, then rerun"
    )


def _publish(tmp: Path, output: Path) -> None:
    """Rename the complete temporary file to ``output`` (atomic: they share a folder)."""
    try:
        tmp.replace(output)
    except OSError as e:
        raise OutputError(
            f"cannot rename {tmp} to {output}: {e.strerror}; {output} must be a file "
            "path in a folder you can write to"
        ) from e


def ingest_folder(
    folder: Path,
    output: Path,
    patterns: list[str],
    *,
    max_file_bytes: int = MAX_FILE_BYTES,
    row_group_docs: int = ROW_GROUP_DOCS,
    row_group_bytes: int = ROW_GROUP_BYTES,
    on_file: Callable[[int, int], None] | None = None,
    encoding: str | None = None,
) -> IngestResult:
    """Write one (doc_id, text) row per text file under ``folder`` matching ``patterns``.

    Files are found recursively and written in sorted order of their relative paths.
    doc_id is the path relative to ``folder``, escaped as described in this module's
    docstring (bytes that are not UTF-8 become ``%XX``, ``%`` becomes ``%25``). text is the
    content decoded as UTF-8 (or as its byte-order mark says), or with the detected
    encoding (``encoding``: with that one), recorded in the ``encoding`` column and how it
    was chosen in ``decoding``; a file whose encoding was detected is named in ``guessed``;
    a file with undecodable bytes gets U+FFFD for them, is named in ``lossy`` and counted
    in ``replaced``.

    Skipped (listed in ``IngestResult.skipped`` with the reason, never read): files and
    folders reached through a symlink whose real path leaves ``folder``; a second path to
    a file already taken (symlinks inside ``folder``, the first path in sorted order wins);
    symlinked folders already walked (loops); binary files (see ``SNIFF_BYTES``,
    ``BINARY_FRACTION``); files over ``max_file_bytes``; files that cannot be opened.

    Memory is bounded by one row group (``row_group_docs`` documents or
    ``row_group_bytes`` bytes of text, whichever comes first) plus one file, plus the list
    of paths. Rows go to a temporary file beside ``output`` (``.NAME.XXXXXXXX.tmp``),
    renamed to ``output`` only when complete: a failure leaves ``output`` as it was (a
    killed process may leave the temporary file behind; delete it).

    ``on_file(done, total)`` is called after each file is read or skipped. Raises
    InputError when nothing could be ingested, OutputError when ``output`` cannot be
    created, RunFailed when writing fails midway (``output`` is then left as it was).
    """
    skipped: list[Skipped] = []
    reading = _Reading(max_file_bytes, check_encoding(encoding))
    todo = _candidates(folder, patterns, skipped)
    if not todo:
        raise _nothing_ingested(folder, patterns, sorted(skipped, key=lambda s: s.doc_id))
    result = IngestResult(output)
    fd, tmp = _temp_beside(output)
    done = False
    try:
        try:
            _write(fd, todo, result, skipped, on_file, reading, row_group_docs, row_group_bytes)
        except OSError as e:  # reading errors are skipped files: this is the output side
            raise _write_failed(tmp, output, e) from e
        result.skipped = sorted(skipped, key=lambda s: s.doc_id)
        if result.documents == 0:
            raise _nothing_ingested(folder, patterns, result.skipped)
        _publish(tmp, output)
        done = True
    finally:
        if not done:
            tmp.unlink(missing_ok=True)
    return result


def _write(
    fd: int,
    todo: list[tuple[str, str]],
    result: IngestResult,
    skipped: list[Skipped],
    on_file: Callable[[int, int], None] | None,
    reading: _Reading,
    row_group_docs: int,
    row_group_bytes: int,
) -> None:
    """Read each file and stream its row into the Parquet file open as ``fd``; fsync it."""
    with os.fdopen(fd, "wb") as f, contextlib.closing(reading):
        with pq.ParquetWriter(f, SCHEMA, compression="zstd") as writer:
            rows = _RowGroups(writer, row_group_docs, row_group_bytes)
            for i, (doc_id, real) in enumerate(todo, 1):
                _ingest_one(doc_id, real, reading, rows, result, skipped)
                if on_file is not None:
                    on_file(i, len(todo))
            rows.flush()
        f.flush()
        os.fsync(f.fileno())  # the data is on disk before the rename makes it OUTPUT


@dataclass
class _Reading:
    max_bytes: int  # larger files are skipped
    encoding: str | None  # every file's encoding; None: UTF-8, else detected
    parser: Any = None  # the parse stage's parser process, started on the first document

    def parse(self, doc_id: str, raw: bytes) -> tuple[str, Any]:
        from docintel.pipeline.stages.parse import ParseConfig, _Child

        if self.parser is None:
            self.parser = _Child(ParseConfig(max_bytes=self.max_bytes).limits())
        return self.parser.parse(doc_id, raw, ParseConfig().time_limit_s)

    def close(self) -> None:
        if self.parser is not None:
            self.parser.stop()


# Formats read by their parser (PDF, HTML, DOCX, e-mail), not decoded as text.
PARSED_FORMATS = ("pdf", "html", "docx", "eml")


def _parse_one(
    doc_id: str,
    raw: bytes,
    reading: _Reading,
    rows: _RowGroups,
    result: IngestResult,
    skipped: list[Skipped],
) -> None:
    """A PDF, HTML, DOCX or e-mail file through the parse stage's parsers (in their own
    process, under the same time limit): its rows (e-mail attachments as
    ``<path>/<name>``), or why it was skipped."""
    status, value = reading.parse(doc_id, raw)
    if status == "error":
        skipped.append(Skipped(doc_id, f"{value[0]}: {value[1]}"))
        return
    for d in value:
        one = f"{doc_id}/{d['suffix']}" if d["suffix"] else doc_id
        if d["error"] is not None:
            skipped.append(Skipped(one, f"{d['error'][0]}: {d['error'][1]}"))
            continue
        row = {DOC_ID: one, TEXT: d["text"], DECODING: PARSED, SOURCE_FORMAT: d["format"],
               TITLE: d["title"], PAGE_STARTS: d["page_starts"]}  # fmt: skip
        rows.add_row(row, len(d["text"]))
        result.documents += 1


def _ingest_one(
    doc_id: str,
    real: str,
    reading: _Reading,
    rows: _RowGroups,
    result: IngestResult,
    skipped: list[Skipped],
) -> None:
    raw = _read(real, reading.max_bytes)
    fmt = DOCUMENT_SUFFIXES.get(PurePosixPath(doc_id).suffix.lower(), "txt")
    if fmt in PARSED_FORMATS and isinstance(raw, bytes):
        _parse_one(doc_id, raw, reading, rows, result, skipped)
        return
    decoded = _decode(raw, reading.encoding) if isinstance(raw, bytes) else raw
    if isinstance(decoded, str):
        skipped.append(Skipped(doc_id, decoded))
        return
    rows.add(doc_id, decoded, len(raw), fmt)
    result.documents += 1
    if decoded.encoding != UTF8:
        result.encodings[decoded.encoding] = result.encodings.get(decoded.encoding, 0) + 1
    if decoded.guessed:
        result.guessed.append((doc_id, decoded.encoding))
    if decoded.how == LOSSY:
        result.replaced += 1
        result.lossy.append(doc_id)
