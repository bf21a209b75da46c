"""The audit root: its layout, ``state.json`` (the record of completed audits), the doc
index, and what a crash leaves behind (pending and incomplete staging).

The doc index is one file per committed night, ``_audit/doc_index-<date>-<nonce>.parquet``,
and the state names the one it goes with (``"index"``). A night writes its index under a
new name, then swaps the state (compare-and-swap): until the swap the previous state and
its index are untouched, and a failed swap (another writer changed the state) deletes only
the new index, which nothing names. After a successful swap the superseded indexes are
deleted. A state of version 1 (before per-night indexes) names ``doc_index.parquet``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline.config import StorageConfig
from docintel.pipeline.errors import ConfigError, OutputError
from docintel.pipeline.output.sink import atomic_write
from docintel.pipeline.run.lease import store_at
from docintel.pipeline.schema import DOC_ID
from docintel.pipeline.storage import display_uri

if TYPE_CHECKING:
    from docintel.pipeline.output.protocol import RunSummary

AUDIT_DIR = "_audit"  # leading underscore: pyarrow.dataset and docintel inputs skip it
STATE_FILE = "state.json"
DOC_INDEX_FILE = "doc_index.parquet"  # the index of a version-1 state (one, rewritten)
INDEX_PREFIX = "doc_index-"  # doc_index-<date>-<nonce>.parquet: one per committed night
INDEX_SUFFIX = ".parquet"
INPUTS_DIR = "inputs"
SELECTION_FILE = "_selection.json"  # written last into a staging folder: it is complete
PENDING_INDEX_FILE = "_doc_index.parquet"  # the index as it will be once the night completes
PARTITION_KEY = "run_date"  # hive-style: OUTPUT/run_date=YYYY-MM-DD/documents/...
STATE_VERSION = 2  # bump when a key of state.json changes meaning (2: "index" names it)
READABLE_VERSIONS = (1, STATE_VERSION)  # 1: the index is DOC_INDEX_FILE

CONTENT_HASH = "content_hash"
PROCESSED_DATE = "processed_date"
SOURCE_FILE = "source_file"
HASH_BYTES = 16  # BLAKE2b-128: collisions are out of reach for any corpus; half of sha256
INDEX_SCHEMA = pa.schema(
    [
        pa.field(DOC_ID, pa.string(), nullable=False),
        pa.field(CONTENT_HASH, pa.binary(HASH_BYTES), nullable=False),
        pa.field(PROCESSED_DATE, pa.date32(), nullable=False),
        pa.field(SOURCE_FILE, pa.string(), nullable=False),
    ]
)
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass
class AuditSummary:
    """What one audit did (or, when ``already_complete``, what the recorded one did)."""

    date: str
    source: str
    output: str
    partition: str
    report: str
    run_id: str | None = None
    new: int = 0
    changed: int = 0
    removed: int = 0
    unchanged: int = 0
    reprocessed: int = 0  # unchanged documents processed again because a model changed
    documents: int = 0
    sentences: int = 0
    errors: int = 0
    ran: bool = False
    models_changed: bool = False
    models: dict[str, str] = field(default_factory=dict)
    already_complete: bool = False
    resumed: bool = False  # this invocation finished an interrupted audit of the date
    skipped_files: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    run: RunSummary | None = None  # the run this invocation executed or resumed, if any

    @property
    def partial(self) -> bool:
        """Unreadable source files were skipped: they are retried the next night."""
        return bool(self.skipped_files)


def parse_date(value: str | None) -> str:
    """``YYYY-MM-DD`` (default: today on this machine's clock) as a checked string."""
    if value is None:
        return dt.date.today().isoformat()
    try:
        if not DATE_RE.fullmatch(value):
            raise ValueError("not YYYY-MM-DD")
        return dt.date.fromisoformat(value).isoformat()
    except ValueError as e:
        raise ConfigError(
            f"audit date {value!r} is not a date; write YYYY-MM-DD, e.g. 2026-05-01"
        ) from e


# --- paths ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditLayout:
    """The paths under one audit root (a local folder or an ``s3://`` prefix) on ``fs``."""

    fs: pafs.FileSystem
    root: str

    @property
    def audit_dir(self) -> str:
        return f"{self.root}/{AUDIT_DIR}"

    @property
    def state(self) -> str:
        return f"{self.audit_dir}/{STATE_FILE}"

    @property
    def index(self) -> str:
        """The index of a version-1 state; see :meth:`index_of`."""
        return f"{self.audit_dir}/{DOC_INDEX_FILE}"

    def index_of(self, state: dict[str, Any] | None) -> str:
        """The doc index that goes with ``state`` (the one it names)."""
        return f"{self.audit_dir}/{index_name(state)}"

    @property
    def inputs(self) -> str:
        return f"{self.audit_dir}/{INPUTS_DIR}"

    def partition(self, day: str) -> str:
        return f"{self.root}/{PARTITION_KEY}={day}"

    def staging(self, day: str) -> str:
        return f"{self.inputs}/{PARTITION_KEY}={day}"

    def selection(self, day: str) -> str:
        return f"{self.staging(day)}/{SELECTION_FILE}"

    def pending_index(self, day: str) -> str:
        return f"{self.staging(day)}/{PENDING_INDEX_FILE}"

    def uri(self, path: str) -> str:
        return display_uri(self.fs, path)

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type == pafs.FileType.File


def read_json(lay: AuditLayout, path: str) -> dict[str, Any] | None:
    """The JSON object at ``path``, or None when there is no such file."""
    if not lay.exists(path):
        return None
    with lay.fs.open_input_stream(path) as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise OutputError(
            f"{lay.uri(path)} is not valid JSON ({e}); restore it from a backup, or delete "
            f"{lay.uri(lay.audit_dir)} to start the audits over (every document is then new)"
        ) from e
    if not isinstance(data, dict):
        raise OutputError(f"{lay.uri(path)} does not hold a JSON object; restore it")
    return data


def write_json(lay: AuditLayout, path: str, data: dict[str, Any]) -> None:
    atomic_write(lay.fs, path, json.dumps(data, indent=2, default=str).encode())


# --- the state -----------------------------------------------------------------------------


def index_name(state: dict[str, Any] | None) -> str:
    """The file name, under ``_audit/``, of the doc index that goes with ``state``."""
    name = (state or {}).get("index", DOC_INDEX_FILE)
    if not isinstance(name, str) or "/" in name or not name.endswith(INDEX_SUFFIX):
        raise OutputError(f"state.json names {name!r} as its doc index; restore the state")
    return name


def read_state(lay: AuditLayout) -> dict[str, Any] | None:
    """``state.json``, checked (with the doc index it names); None before the first audit."""
    state = read_json(lay, lay.state)
    if state is None:
        return None
    if state.get("version") not in READABLE_VERSIONS or not isinstance(state.get("audits"), list):
        raise OutputError(
            f"{lay.uri(lay.state)} is not a docintel audit state (version "
            f"{' or '.join(map(str, READABLE_VERSIONS))}); choose another audit output, or "
            "restore the file"
        )
    index = lay.index_of(state)
    if not lay.exists(index):
        raise OutputError(
            f"{lay.uri(lay.state)} exists but {lay.uri(index)} is missing, so changed "
            f"documents cannot be told apart; restore it, or delete {lay.uri(lay.audit_dir)} "
            "to start the audits over (every document is then new)"
        )
    return state


def completed(state: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The completed audits by date."""
    return {a["date"]: a for a in state["audits"]} if state else {}


def already_complete(entry: dict[str, Any], source: str, output: str) -> AuditSummary:
    """The summary of a completed audit, from its entry in the state."""
    return AuditSummary(
        date=entry["date"],
        source=entry.get("source", source),
        output=output,
        partition=entry["partition"],
        report=entry["report"],
        run_id=entry.get("run_id"),
        new=entry["new"],
        changed=entry["changed"],
        removed=entry["removed"],
        unchanged=entry["unchanged"],
        reprocessed=entry.get("reprocessed", 0),
        documents=entry["documents"],
        sentences=entry["sentences"],
        errors=entry["errors"],
        ran=entry.get("ran", bool(entry.get("run_id"))),
        models_changed=entry.get("models_changed", False),
        already_complete=True,
        skipped_files=entry.get("skipped_files", []),
    )


def _dated_dirs(lay: AuditLayout) -> Iterator[tuple[str, str]]:
    """(date, path) of every ``run_date=D`` folder under ``_audit/inputs``."""
    sel = pafs.FileSelector(lay.inputs, allow_not_found=True)
    for info in lay.fs.get_file_info(sel):
        name = info.base_name
        if info.type == pafs.FileType.Directory and name.startswith(f"{PARTITION_KEY}="):
            day = name.partition("=")[2]
            if DATE_RE.fullmatch(day):
                yield day, info.path


def pending_dates(lay: AuditLayout, done: dict[str, Any]) -> list[str]:
    """Dates whose staging is complete but whose audit never completed (a crash)."""
    return sorted(
        day for day, _ in _dated_dirs(lay) if day not in done and lay.exists(lay.selection(day))
    )


def drop_incomplete_staging(lay: AuditLayout, day: str, done: dict[str, Any]) -> None:
    """Remove staging of other dates that never got its selection marker: no run used it,
    and its documents are selected again tonight (the index did not move)."""
    for other, path in _dated_dirs(lay):
        if other != day and other not in done and not lay.exists(lay.selection(other)):
            lay.fs.delete_dir(path)


def drop_unmarked_staging(lay: AuditLayout, day: str) -> None:
    """After a failed audit of ``day``: its staging without a selection marker (a
    selection that failed half-way) goes; a complete one stays, for the resume."""
    path = lay.staging(day)
    if lay.fs.get_file_info(path).type == pafs.FileType.Directory and not lay.exists(
        lay.selection(day)
    ):
        with contextlib.suppress(OSError):
            lay.fs.delete_dir(path)


def drop_staged_inputs(lay: AuditLayout, day: str) -> None:
    """After a committed night of a run that redacts: the staged copy of the night's
    source documents (raw text) goes, so nothing unredacted stays in the audit's output;
    the selection record and the index stay (a committed night is never re-read)."""
    keep = {lay.selection(day), lay.pending_index(day)}
    listed = lay.fs.get_file_info(pafs.FileSelector(lay.staging(day), recursive=True))
    for info in listed:
        if info.type == pafs.FileType.File and info.path not in keep:
            lay.fs.delete_file(info.path)


def remove_empty_dirs(lay: AuditLayout, root_existed: bool) -> None:
    """After a failed audit, on a local disk: the folders it left empty (``_audit/inputs``,
    ``_audit``, and the audit root when the audit created it). ``rmdir`` removes only an
    empty folder, so nothing another writer put there meanwhile is touched. Object stores
    have no folders to leave behind."""
    if not isinstance(lay.fs, pafs.LocalFileSystem):
        return
    dirs = [lay.inputs, lay.audit_dir, *([] if root_existed else [lay.root])]
    for path in dirs:
        with contextlib.suppress(OSError):
            Path(path).rmdir()


def _swap_state(
    lay: AuditLayout,
    storage: StorageConfig,
    expected: dict[str, Any] | None,
    new: dict[str, Any],
) -> None:
    store = store_at(lay.fs, lay.state, storage)
    current = store.read()
    seen = json.loads(current[0].decode()) if current else None
    data = json.dumps(new, indent=2, default=str).encode()
    if seen == expected:
        tag = store.create(data) if current is None else store.swap(data, current[1])
        if tag is not None:
            return
        now = store.read()
        if now is not None and now[0] == data:
            return  # ours landed; a retried request's condition refused it again
    raise OutputError(
        f"{lay.uri(lay.state)} changed while this audit ran (another writer, outside the "
        f"{lay.uri(lay.audit_dir)} lease); this night's state was not committed. Check who "
        "else writes there, then rerun the audit: its run resumes from what is written"
    )


def read_index(lay: AuditLayout, state: dict[str, Any] | None = None) -> pa.Table:
    """The doc index of the last completed audit (the one ``state``, default the state on
    storage, names), checked against :data:`INDEX_SCHEMA`."""
    path = lay.index_of(state if state is not None else read_json(lay, lay.state))
    with lay.fs.open_input_file(path) as f:
        table = pq.read_table(f)
    if table.schema.names != INDEX_SCHEMA.names:
        raise OutputError(
            f"{lay.uri(path)} has columns {table.schema.names}, not "
            f"{INDEX_SCHEMA.names}; restore it, or delete {lay.uri(lay.audit_dir)} to start "
            "the audits over"
        )
    return table.cast(INDEX_SCHEMA)


def commit_state(
    lay: AuditLayout,
    day: str,
    state: dict[str, Any] | None,
    selection: dict[str, Any],
    entry: dict[str, Any],
    storage: StorageConfig,
) -> None:
    """The night's index under a name of its own first, the state that names it last: the
    state names the audit complete only when all is there.

    The state is replaced by a compare-and-swap against the version this audit read
    (``If-Match`` on its ETag on S3; locally under the file's lock, or an exclusive create
    for the first audit): a change by anyone else meanwhile fails the commit instead of
    being overwritten, and leaves their state with its own index (tonight's new index,
    named by no state, is deleted). The ``_audit/`` lease already keeps other docintel
    audits out; this also guards against a writer that ignores it."""
    pending = lay.pending_index(day)
    with lay.fs.open_input_file(pending) as f:
        index = pq.read_table(f)
    name = f"{INDEX_PREFIX}{day}-{uuid.uuid4().hex[:8]}{INDEX_SUFFIX}"
    atomic_write(lay.fs, lay.index_of({"index": name}), index)
    audits = [a for a in (state["audits"] if state else []) if a["date"] != day]
    new_state = {
        "version": STATE_VERSION,
        "source": selection["source"],
        "columns": selection["columns"],
        "models": selection["models"],
        "files": selection["files"],
        "index": name,
        "audits": sorted([*audits, entry], key=lambda a: a["date"]),
    }
    try:
        _swap_state(lay, storage, state, new_state)
    except BaseException:
        _drop_unnamed(lay, name)
        raise
    _drop_superseded(lay, name)
    lay.fs.delete_file(pending)  # it is the state's index now; the staging stays as a record


def _drop_unnamed(lay: AuditLayout, name: str) -> None:
    """After a failed swap: delete the night's new index unless the state names it after
    all (a swap whose answer was lost); best effort, an orphan is only disk."""
    with contextlib.suppress(OSError, OutputError):
        if index_name(read_json(lay, lay.state)) != name:
            lay.fs.delete_file(lay.index_of({"index": name}))


def _drop_superseded(lay: AuditLayout, name: str) -> None:
    """After a successful swap: the indexes no state names any more (the previous night's,
    a version-1 ``doc_index.parquet``, orphans of commits that crashed before their swap)."""
    sel = pafs.FileSelector(lay.audit_dir, allow_not_found=True)
    for info in lay.fs.get_file_info(sel):
        old = info.base_name
        is_index = old == DOC_INDEX_FILE or (
            old.startswith(INDEX_PREFIX) and old.endswith(INDEX_SUFFIX)
        )
        if is_index and old != name and info.type == pafs.FileType.File:
            with contextlib.suppress(FileNotFoundError):
                lay.fs.delete_file(info.path)
