"""Document files as input: a folder (read recursively), glob or ``s3://`` prefix of
``.pdf``, ``.html``/``.htm``, ``.docx``, ``.eml``, ``.txt`` and ``.md`` files.

The driver only lists them (path, size, modification time: the run's input identity, as
for Parquet). A work unit is one batch of files, cut in listing order at
``[run] batch_size`` files or :data:`UNIT_BYTES` of file bytes, whichever comes first;
the read task (on the cluster) reads their bytes and the parse stage makes text of them:
no file's bytes pass through the driver. A document's id is its path relative to the
input root, with ``/`` separators.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from docintel.pipeline.batch import Batch
from docintel.pipeline.errors import InputError
from docintel.pipeline.schema import (
    CONTENT,
    DOC_ID,
    DOCUMENT_META_SCHEMA,
    FOUND,
    SOURCE_FORMAT,
    error_table,
)
from docintel.pipeline.storage import is_local, s3_error

if TYPE_CHECKING:  # source.py lists the input and imports this module
    from docintel.pipeline.input.source import InputFile

# The file types the parse stage reads, by extension (its parsers check the content too).
DOCUMENT_SUFFIXES = {
    ".pdf": "pdf",
    ".html": "html",
    ".htm": "html",
    ".docx": "docx",
    ".eml": "eml",
    ".txt": "txt",
    ".md": "md",
}
# A batch of files closes at this many bytes even with fewer than batch_size files: a read
# task and a parse replica hold one batch's bytes at once.
UNIT_BYTES = 64 * 1024 * 1024
# Files per batch when ``[run] batch_size`` is "auto": a batch is the commit unit, and 16
# annual reports are thousands of sentences (split into pieces after sentencize), while a
# batch of short files still keeps Ray's per-call overhead small.
DOCUMENT_BATCH_SIZE = 16


def is_document(rel: str) -> bool:
    return PurePosixPath(rel).suffix.lower() in DOCUMENT_SUFFIXES


@dataclass(frozen=True)
class DocumentUnit:
    """One batch of document files: read once by a read task, parsed by the parse stage.
    ``files``: (InputFile, doc_id) in listing order; a file over ``max_bytes`` is an
    error row without being read."""

    files: tuple[tuple[InputFile, str], ...]
    batch_ids: tuple[str, ...]
    max_bytes: int

    @property
    def n_rows(self) -> int:
        return len(self.files)

    @property
    def where(self) -> str:
        first, last = self.files[0][1], self.files[-1][1]
        return first if first == last else f"{first} .. {last}"


def plan_documents(
    files: list[InputFile], doc_ids: dict[str, str], batch_size: int, max_bytes: int
) -> list[DocumentUnit]:
    """The files cut into batches (see the module docstring); ``doc_ids``: by file path."""
    units: list[DocumentUnit] = []
    group: list[tuple[InputFile, str]] = []
    size = 0
    for f in files:
        group.append((f, doc_ids[f.path]))
        size += f.size if f.size <= max_bytes else 0
        if len(group) >= batch_size or size >= UNIT_BYTES:
            units.append(_unit(group, max_bytes))
            group, size = [], 0
    if group:
        units.append(_unit(group, max_bytes))
    return units


def _unit(group: list[tuple[InputFile, str]], max_bytes: int) -> DocumentUnit:
    first = group[0][0]
    return DocumentUnit(tuple(group), (f"{first.key}-docs",), max_bytes)


def check_document_ids(units: list[DocumentUnit], max_id_bytes: int) -> int:
    """Document ids (relative paths) over ``max_id_bytes`` refused before any work; the
    number of files (e-mail attachments add documents at run time)."""
    for u in units:
        for f, doc_id in u.files:
            if len(doc_id.encode()) > max_id_bytes:
                raise InputError(
                    f"input file {f.uri} has a path of {len(doc_id.encode()):,} bytes, its "
                    f"document id; ids are limited to {max_id_bytes:,} bytes "
                    "([input] max_id_bytes): shorten the path, or raise the limit"
                )
    return sum(u.n_rows for u in units)


def _read_error(doc: str, kind: str, message: str, batch_id: str) -> dict[str, str]:
    return {DOC_ID: doc, "stage": "read", "error_type": kind, "message": message,
            "batch_id": batch_id}  # fmt: skip


def read_documents(fs: pafs.FileSystem, unit: DocumentUnit) -> list[Batch]:
    """A read task: the unit's files' bytes as rows (doc_id, content), one batch. A file
    over ``max_bytes`` or gone since the listing is an error row; storage trouble on S3
    raises (the executor retries the batch)."""
    (batch_id,) = unit.batch_ids
    ids, contents, errors = [], [], []
    for f, doc_id in unit.files:
        if f.size > unit.max_bytes:
            message = (f"{doc_id}: {f.size:,} bytes, over the {unit.max_bytes:,}-byte "
                       "limit; split it, or raise [parse] max_bytes")  # fmt: skip
            errors.append(_read_error(doc_id, "FileTooLarge", message, batch_id))
            continue
        try:
            with fs.open_input_stream(f.path) as raw:
                data = raw.read()
        except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
            errors.append(_read_error(doc_id, type(e).__name__, f"{doc_id}: {e}", batch_id))
            continue
        except OSError as e:
            if not is_local(fs):
                raise s3_error(e, f.uri) from e
            errors.append(_read_error(doc_id, type(e).__name__, f"{doc_id}: {e}", batch_id))
            continue
        ids.append(doc_id)
        contents.append(data)
    all_ids = pa.array([d for _, d in unit.files], pa.string())
    table = pa.table({DOC_ID: pa.array(ids, pa.string()), CONTENT: pa.array(contents, pa.binary())})
    return [Batch(batch_id, all_ids, table, error_table(errors), documents=_formats(all_ids))]


def _formats(ids: pa.Array) -> pa.Table:
    """Each file's format by its extension, until the parse stage says better."""
    fmts = [DOCUMENT_SUFFIXES.get(PurePosixPath(d).suffix.lower()) for d in ids.to_pylist()]
    cols = {f.name: pa.nulls(len(ids), f.type) for f in DOCUMENT_META_SCHEMA}
    cols[DOC_ID] = ids
    cols[SOURCE_FORMAT] = pa.array(fmts, pa.string())
    cols[FOUND] = pa.array([False] * len(ids), pa.bool_())
    return pa.table(cols, schema=DOCUMENT_META_SCHEMA)
