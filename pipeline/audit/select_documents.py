"""Selecting a night's documents when the audit source is a folder (or prefix) of document
files (.pdf, .html, .docx, .eml, .txt, .md: pipeline/input/documents.py); :func:`select_night`
lists the source and picks this or the Parquet selection (select.py).

One document per file, its id the file's path relative to the source root (as
``docintel run`` gives it). A file whose (size, mtime) is as the last audit saw it, with
the same models, is not read. Every other file is read and hashed by content (BLAKE2b-128
of its bytes, streamed in bounded chunks): new, changed or unchanged against the doc
index, so a file touched but rewritten with the same bytes is unchanged and not run
again. The selected files are copied into the night's staging folder under the same
relative paths, so the night's run over that folder gives the same ids. An e-mail's
attachments are documents of the night's run (``<path>/<name>``) but not rows of the
index: they follow their file (new, changed or unchanged with it).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from docintel.pipeline.audit.select import (
    _Counts,
    _file_stamps,
    _next_index,
    _unchanged_files,
    record_selection,
    select_documents,
)
from docintel.pipeline.audit.state import (
    CONTENT_HASH,
    HASH_BYTES,
    INDEX_SCHEMA,
    PROCESSED_DATE,
    SOURCE_FILE,
    AuditLayout,
    read_index,
)
from docintel.pipeline.config import Config
from docintel.pipeline.errors import InputError, RunFailed
from docintel.pipeline.input.source import InputFile, resolve_input
from docintel.pipeline.schema import DOC_ID
from docintel.pipeline.storage import is_local, s3_error

CHUNK_BYTES = 1024 * 1024  # read (and copy) a file this much at a time: memory stays flat


@dataclass(frozen=True)
class _Files:
    """Where tonight's document files are read from and staged to."""

    src_fs: pafs.FileSystem
    out_fs: pafs.FileSystem
    staging: str


def select_night(
    cfg: Config,
    lay: AuditLayout,
    day: str,
    source: str,
    state: dict[str, Any] | None,
    models: dict[str, str],
) -> dict[str, Any]:
    """The night's selection (:func:`select.select_documents`), for a source of Parquet
    files or of document files (``resolve_input`` refuses a mix)."""
    src_fs, files = resolve_input(source, cfg.storage)
    if files[0].document:
        return select_document_files(lay, day, source, state, models, src_fs, files)
    return select_documents(cfg, lay, day, source, state, models, (src_fs, files))


def select_document_files(
    lay: AuditLayout,
    day: str,
    source: str,
    state: dict[str, Any] | None,
    models: dict[str, str],
    src_fs: pafs.FileSystem,
    files: list[InputFile],
) -> dict[str, Any]:
    """:func:`select.select_documents` for a source of document files: the selection record
    (written last), the staged copies and the pending index."""
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    seen = _file_stamps(src_fs, files)
    previous_models = state["models"] if state else None
    models_changed = previous_models is not None and previous_models != models
    old_files: dict[str, Any] = state["files"] if state else {}
    unread = _unchanged_files(files, seen, old_files, models_changed)
    unread_paths = {f.path for f in unread}
    old = read_index(lay) if state else INDEX_SCHEMA.empty_table()
    to_read = [f for f in files if f.path not in unread_paths]
    where = _Files(src_fs, lay.fs, lay.staging(day))
    counts, tonight, read_ok, skipped = _stage(where, to_read, old, day, models_changed)
    skipped_paths = {f.path for f, _ in skipped}
    index, removed, kept_unread = _next_index(old, tonight, unread_paths, skipped_paths)
    counts.unchanged += kept_unread
    next_files = {f.path: seen[f.path] for f in unread + read_ok}
    next_files.update({p: old_files[p] for p in skipped_paths if p in old_files})
    head = {"date": day, "source": source, "started": started, "input": "documents",
            "columns": None, "models": models, "previous_models": previous_models,
            "models_changed": models_changed}  # fmt: skip
    return record_selection(lay, day, index, head, counts, removed, next_files, skipped)


class _Unreadable(InputError):
    """A document file that could not be read: skipped tonight, retried tomorrow."""


def _stage(
    where: _Files, files: list[InputFile], old: pa.Table, day: str, models_changed: bool
) -> tuple[_Counts, pa.Table, list[InputFile], list[tuple[InputFile, _Unreadable]]]:
    """Hash every file read tonight, copy the selected ones into the staging folder
    (emptied first). Returns the counts, the files' index rows, the files read and the
    files skipped as unreadable."""
    where.out_fs.delete_dir_contents(where.staging, missing_dir_ok=True)
    if is_local(where.out_fs):
        where.out_fs.create_dir(where.staging, recursive=True)
    ids = pa.array([f.rel for f in files], pa.string())
    known = old.filter(pc.is_in(old[DOC_ID], value_set=ids)).to_pylist()
    before = {r[DOC_ID]: r for r in known}
    counts = _Counts()
    rows: list[dict[str, Any]] = []
    read_ok: list[InputFile] = []
    skipped: list[tuple[InputFile, _Unreadable]] = []
    today = dt.date.fromisoformat(day)
    for f in files:
        try:
            digest = _digest(where.src_fs, f)
            prior = before.get(f.rel)
            kind = _kind(prior, digest, models_changed)
            selected = kind != "unchanged"
            if selected:
                _copy(where, f, digest)
        except _Unreadable as e:
            skipped.append((f, e))
            continue
        setattr(counts, kind, getattr(counts, kind) + 1)
        when = today if selected or prior is None else prior[PROCESSED_DATE]
        rows.append({DOC_ID: f.rel, CONTENT_HASH: digest, PROCESSED_DATE: when,
                     SOURCE_FILE: f.path})  # fmt: skip
        read_ok.append(f)
    return counts, pa.Table.from_pylist(rows, INDEX_SCHEMA), read_ok, skipped


def _kind(prior: dict[str, Any] | None, digest: bytes, models_changed: bool) -> str:
    """The file is new, changed, unchanged, or reprocessed (same bytes, new models)."""
    if prior is None:
        return "new"
    if prior[CONTENT_HASH] != digest:
        return "changed"
    return "reprocessed" if models_changed else "unchanged"


def _failed(fs: pafs.FileSystem, f: InputFile, e: OSError) -> Exception:
    """An OSError reading ``f``: on S3 the storage's fault (fatal), locally the file's."""
    if not is_local(fs):
        return s3_error(e, f.uri)
    return _Unreadable(
        f"source file {f.uri} could not be read ({e}); the audit skips it tonight and "
        "reads it again next time. Fix or remove it"
    )


def _digest(fs: pafs.FileSystem, f: InputFile) -> bytes:
    """BLAKE2b-128 of the file's bytes, read in chunks of :data:`CHUNK_BYTES`."""
    h = hashlib.blake2b(digest_size=HASH_BYTES)
    try:
        with fs.open_input_stream(f.path) as raw:
            while chunk := raw.read(CHUNK_BYTES):
                h.update(chunk)
    except OSError as e:
        raise _failed(fs, f, e) from e
    return h.digest()


def _copy(where: _Files, f: InputFile, digest: bytes) -> None:
    """Copy ``f`` to ``<staging>/<rel>``, hashing again: bytes that differ from the ones
    hashed mean the file changed while the audit read it."""
    target = f"{where.staging}/{f.rel}"
    if is_local(where.out_fs) and "/" in f.rel:
        where.out_fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
    h = hashlib.blake2b(digest_size=HASH_BYTES)
    try:
        with (
            where.src_fs.open_input_stream(f.path) as raw,
            where.out_fs.open_output_stream(target) as out,
        ):
            while chunk := raw.read(CHUNK_BYTES):
                h.update(chunk)
                out.write(chunk)
    except OSError as e:
        raise _failed(where.src_fs, f, e) from e
    if h.digest() != digest:
        raise RunFailed(
            f"source file {f.uri} changed while the audit was reading it; run the audit "
            "again (nothing was committed)"
        )
