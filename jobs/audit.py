"""The nightly audit: each night, process only the documents that are new or changed.

One function, :func:`run_audit`, serves ``docintel audit`` and the Ray job entrypoint
``python -m jobs.nightly_audit``; it selects the night's documents and hands them to
:func:`jobs.run.execute`, the same run function as ``docintel run``.

Layout under the audit OUTPUT (a local folder or an ``s3://`` prefix)::

    _audit/state.json                   written last, only when an audit completes: model
                                        versions, source files {path: size, mtime_ns} as
                                        seen when that audit started, completed audits
    _audit/doc_index.parquet            doc_id, content_hash, processed_date, source_file:
                                        one row per document of the source
    _audit/inputs/run_date=D/           the night's staging input (new + changed documents
                                        only, one Parquet file per source file that has
                                        some), then _selection.json (the selection's
                                        counts; marks the staging complete) and
                                        _doc_index.parquet (the index once D completes)
    run_date=D/                         a normal docintel run (run id ``audit-D``) over the
                                        staging input, plus report.json and report.html

Why the selection is persisted before the run: a crashed audit resumes its run with the
same run id and the *same* input (the run's batch ids depend on the input's layout), and
the counts and the index it records must describe what that run processed, not what the
source holds by the time the rerun happens. The state and the index change only after the
report is written, so a night that never completed leaves its documents to the next one.

Change detection is two-level. Files whose (size, mtime) match the state's are not read at
all. Files that are new or differ are read (the id column first, for one join against the
index and the duplicate checks; then id + text streamed batch by batch, hashed with
BLAKE2b-128) and each document is new (id not in the index), changed (different hash) or
unchanged. Ids the index holds that the source no longer has are counted as removed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.config import Config
from pipeline.errors import ConfigError, InputError, OutputError, RunFailed, UsageError
from pipeline.schema import DOC_ID
from pipeline.sink import BatchStats, atomic_write, resolve_output
from pipeline.source import InputFile, resolve_input
from pipeline.storage import display_uri, is_local, s3_error

if TYPE_CHECKING:
    from jobs.run import RunSummary

AUDIT_DIR = "_audit"  # leading underscore: pyarrow.dataset and docintel inputs skip it
STATE_FILE = "state.json"
DOC_INDEX_FILE = "doc_index.parquet"
INPUTS_DIR = "inputs"
SELECTION_FILE = "_selection.json"  # written last into a staging folder: it is complete
PENDING_INDEX_FILE = "_doc_index.parquet"  # the index as it will be once the night completes
PARTITION_KEY = "run_date"  # hive-style: OUTPUT/run_date=YYYY-MM-DD/documents/...
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
RUN_STATE = "_run.json"  # jobs.run writes it first into a run's folder
STATE_VERSION = 1  # bump when a key of state.json changes meaning

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

# Rows hashed per step while streaming a source file: bounds memory on huge files
# (a record batch of long documents is still only this many texts).
READ_BATCH_ROWS = 4096
# Staging row groups: the run reads one row group per task and cuts it into batches, so
# a row group holds several batches (fewer, larger reads) but stays bounded in bytes.
STAGING_BATCHES_PER_ROW_GROUP = 8
STAGING_ROW_GROUP_BYTES = 64 * 1024 * 1024
MAX_REPORTED = 5  # duplicate ids named in a message: enough to find the pattern
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")

# Per-document hash input: a type tag, so a null, an empty string and binary text with
# the same bytes differ (the pipeline treats them differently).
_NULL, _STR, _BYTES, _OTHER = b"\x00", b"s", b"b", b"o"


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


# --- paths ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
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
        return f"{self.audit_dir}/{DOC_INDEX_FILE}"

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


def _read_json(lay: _Layout, path: str) -> dict[str, Any] | None:
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


def _write_json(lay: _Layout, path: str, data: dict[str, Any]) -> None:
    atomic_write(lay.fs, path, json.dumps(data, indent=2, default=str).encode())


# --- the entry point -----------------------------------------------------------------------


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


def run_audit(
    cfg: Config,
    source: str | None = None,
    output: str | None = None,
    date: str | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_batch: Callable[[BatchStats], None] | None = None,
) -> AuditSummary:
    """Audit ``source`` into ``output`` for ``date`` (default: today): only what changed.

    ``source``/``output`` default to the config's ``[audit]`` keys. Idempotent per date:
    a date that already completed is a no-op; an interrupted one is resumed. An audit
    interrupted on an earlier date is finished first (the nightly job recovers by itself).
    ``on_start``/``on_batch`` are passed to :func:`jobs.run.execute` (progress display).
    """
    source = source or cfg.audit.source
    output = output or cfg.audit.output
    if not source:
        raise ConfigError("no audit source: pass --source URI or set [audit] source")
    if not output:
        raise ConfigError("no audit output: pass --output URI or set [audit] output")
    day = parse_date(date)
    fs, root = resolve_output(output, cfg.storage)
    lay = _Layout(fs, root)
    state = _read_state(lay)
    done = _completed(state)
    if day in done:
        return _already_complete(done[day], source, output)
    notes: list[str] = []
    last = max(done, default=None)
    if last is not None and day < last:
        raise UsageError(
            f"the audits in {output} have reached {last}; an audit of the earlier date {day} "
            "would undo later ones. Audit a later date (or omit --date for today)"
        )
    for pending in _pending_dates(lay, done):
        if pending > day:
            raise UsageError(
                f"the audit of {pending} in {output} is unfinished and later than {day}; "
                f"finish it first: docintel audit --date {pending}"
            )
        if pending < day:
            earlier = _audit_one(cfg, lay, pending, None, output, state, on_start, on_batch)
            notes.append(
                f"finished the interrupted audit of {pending} first "
                f"({earlier.documents:,} documents; report {earlier.report})"
            )
            state = _read_state(lay)
    _drop_incomplete_staging(lay, day, _completed(state))
    summary = _audit_one(cfg, lay, day, source, output, state, on_start, on_batch)
    summary.notes[:0] = notes
    return summary


def _read_state(lay: _Layout) -> dict[str, Any] | None:
    state = _read_json(lay, lay.state)
    if state is None:
        return None
    if state.get("version") != STATE_VERSION or not isinstance(state.get("audits"), list):
        raise OutputError(
            f"{lay.uri(lay.state)} is not a docintel audit state (version {STATE_VERSION}); "
            "choose another audit output, or restore the file"
        )
    if not lay.exists(lay.index):
        raise OutputError(
            f"{lay.uri(lay.state)} exists but {lay.uri(lay.index)} is missing, so changed "
            f"documents cannot be told apart; restore it, or delete {lay.uri(lay.audit_dir)} "
            "to start the audits over (every document is then new)"
        )
    return state


def _completed(state: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {a["date"]: a for a in state["audits"]} if state else {}


def _already_complete(entry: dict[str, Any], source: str, output: str) -> AuditSummary:
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


def _dated_dirs(lay: _Layout) -> Iterator[tuple[str, str]]:
    """(date, path) of every ``run_date=D`` folder under ``_audit/inputs``."""
    sel = pafs.FileSelector(lay.inputs, allow_not_found=True)
    for info in lay.fs.get_file_info(sel):
        name = info.base_name
        if info.type == pafs.FileType.Directory and name.startswith(f"{PARTITION_KEY}="):
            day = name.partition("=")[2]
            if DATE_RE.fullmatch(day):
                yield day, info.path


def _pending_dates(lay: _Layout, done: dict[str, Any]) -> list[str]:
    """Dates whose staging is complete but whose audit never completed (a crash)."""
    return sorted(
        day for day, _ in _dated_dirs(lay) if day not in done and lay.exists(lay.selection(day))
    )


def _drop_incomplete_staging(lay: _Layout, day: str, done: dict[str, Any]) -> None:
    """Remove staging of other dates that never got its selection marker: no run used it,
    and its documents are selected again tonight (the index did not move)."""
    for other, path in _dated_dirs(lay):
        if other != day and other not in done and not lay.exists(lay.selection(other)):
            lay.fs.delete_dir(path)


# --- one night -----------------------------------------------------------------------------


def _audit_one(
    cfg: Config,
    lay: _Layout,
    day: str,
    source: str | None,
    output: str,
    state: dict[str, Any] | None,
    on_start: Callable[[int, int], None] | None,
    on_batch: Callable[[BatchStats], None] | None,
) -> AuditSummary:
    """Select (or reuse the selection of) ``day``, run it, report, then commit the state."""
    from jobs.report import write_report
    from jobs.run import check_models, execute

    labels, versions, _ = check_models(cfg)
    if cfg.audit.risk_label not in labels:
        raise ConfigError(
            f"[audit] risk_label {cfg.audit.risk_label!r} is not a label of the classifier "
            f"{cfg.classify.resolved_model_dir()} (its labels: {', '.join(labels)}); set "
            "[audit] risk_label to one of them"
        )
    models = {"sentencize": cfg.sentencize.spacy_model, **versions}
    partition = lay.partition(day)
    selection = _read_json(lay, lay.selection(day))
    resumed = selection is not None
    if selection is None:
        if source is None:  # only pending dates come without a source, and they have one
            raise RunFailed(f"{lay.uri(lay.selection(day))} vanished while auditing")
        if lay.exists(f"{partition}/{RUN_STATE}"):
            raise OutputError(
                f"{lay.uri(partition)} holds a run but {lay.uri(lay.selection(day))}, the "
                f"record of its input, is missing; delete {lay.uri(partition)} to redo the "
                f"audit of {day}"
            )
        selection = _select(cfg, lay, day, source, state, models)
    else:
        if source is not None and selection["source"] != source:
            raise UsageError(
                f"the interrupted audit of {day} in {output} read {selection['source']!r}, "
                f"not {source!r}; rerun it with --source {selection['source']}"
            )
        if selection["models"] != models:
            raise UsageError(
                f"the interrupted audit of {day} in {output} started with models "
                f"{selection['models']}, the config now gives {models}; restore those models "
                f"to finish it, or delete {lay.uri(partition)} and "
                f"{lay.uri(lay.staging(day))} to redo the night with the new ones"
            )
    run_id = f"audit-{day}"
    ran = selection["selected"] > 0
    run_summary = None
    if ran:
        run_cfg = cfg.with_overrides({"run.run_id": run_id})
        run_summary = execute(
            run_cfg, lay.uri(lay.staging(day)), lay.uri(partition), on_start, on_batch
        )
    c = selection["counts"]
    audit = {
        "date": day,
        "run_id": run_id if ran else None,
        "source": selection["source"],
        "output": output,
        "partition": lay.uri(partition),
        "new": c["new"],
        "changed": c["changed"],
        "removed": c["removed"],
        "unchanged": c["unchanged"],
        "reprocessed": c["reprocessed"],
        "models_changed": selection["models_changed"],
        "models": models,
        "previous_models": selection["previous_models"],
        "ran": ran,
        "skipped_source_files": selection["skipped_files"],
        "started": selection["started"],
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    history = _history(lay, state, cfg.audit.trend_runs)
    report = write_report(lay.fs, partition, audit, history, cfg.audit.risk_label, cfg.audit.top_n)
    counts = report["counts"]
    entry = {
        "date": day,
        "run_id": audit["run_id"],
        "partition": audit["partition"],
        **{k: c[k] for k in ("new", "changed", "removed", "unchanged", "reprocessed")},
        "documents": counts["documents"],
        "sentences": counts["sentences"],
        "errors": counts["errors"],
        "report": lay.uri(f"{partition}/{REPORT_JSON}"),
        "ran": ran,
        "models_changed": selection["models_changed"],
        "source": selection["source"],
        "skipped_files": selection["skipped_files"],
        "started": audit["started"],
        "finished": audit["finished"],
    }
    _commit(lay, day, state, selection, entry)
    return AuditSummary(
        date=day,
        source=selection["source"],
        output=output,
        partition=entry["partition"],
        report=entry["report"],
        run_id=entry["run_id"],
        new=c["new"],
        changed=c["changed"],
        removed=c["removed"],
        unchanged=c["unchanged"],
        reprocessed=c["reprocessed"],
        documents=entry["documents"],
        sentences=entry["sentences"],
        errors=entry["errors"],
        ran=ran,
        models_changed=selection["models_changed"],
        models=models,
        resumed=resumed,
        skipped_files=selection["skipped_files"],
        warnings=list(run_summary.warnings) if run_summary else [],
        run=run_summary,
    )


def _history(lay: _Layout, state: dict[str, Any] | None, n: int) -> list[dict[str, Any]]:
    """report.json of the last ``n`` completed audits, oldest first (missing ones skipped)."""
    history = []
    for entry in (state["audits"] if state else [])[-n:]:
        report = _read_json(lay, f"{lay.partition(entry['date'])}/{REPORT_JSON}")
        if report is not None:
            history.append(report)
    return history


def _commit(
    lay: _Layout,
    day: str,
    state: dict[str, Any] | None,
    selection: dict[str, Any],
    entry: dict[str, Any],
) -> None:
    """Index first, state last: the state names the audit complete only when all is there."""
    pending = lay.pending_index(day)
    with lay.fs.open_input_file(pending) as f:
        index = pq.read_table(f)
    atomic_write(lay.fs, lay.index, index)
    audits = [a for a in (state["audits"] if state else []) if a["date"] != day]
    new_state = {
        "version": STATE_VERSION,
        "source": selection["source"],
        "columns": selection["columns"],
        "models": selection["models"],
        "files": selection["files"],
        "audits": sorted([*audits, entry], key=lambda a: a["date"]),
    }
    _write_json(lay, lay.state, new_state)
    lay.fs.delete_file(pending)  # it is doc_index.parquet now; the staging stays as a record


# --- selection -----------------------------------------------------------------------------


@dataclass
class _Counts:
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    reprocessed: int = 0


def _select(
    cfg: Config,
    lay: _Layout,
    day: str,
    source: str,
    state: dict[str, Any] | None,
    models: dict[str, str],
) -> dict[str, Any]:
    """Decide the night's documents, write their staging input and the pending index.

    Returns the selection record, written last as the staging folder's marker.
    """
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    id_col, text_col = cfg.input.id_column, cfg.input.text_column
    src_fs, files = resolve_input(source, cfg.storage)
    seen = _file_stamps(src_fs, files)
    previous_models = state["models"] if state else None
    models_changed = previous_models is not None and previous_models != models
    old_files: dict[str, Any] = state["files"] if state else {}
    unread = [
        f
        for f in files
        if not models_changed
        and seen[f.path]["mtime_ns"] is not None
        and old_files.get(f.path) == seen[f.path]
    ]
    unread_paths = {f.path for f in unread}
    old = _read_index(lay) if state else INDEX_SCHEMA.empty_table()

    opened, skipped = _read_ids(src_fs, [f for f in files if f.path not in unread_paths], id_col)
    if skipped and not opened and not unread:
        raise skipped[0][1]
    ids = pa.concat_tables([t for _, t in opened]) if opened else _ids_table([], -1)
    _check_duplicates(ids, opened, id_col)
    joined = _join_index(ids, old)
    _check_moved_from_unread(joined, opened, unread_paths, id_col)

    staging = lay.staging(day)
    lay.fs.delete_dir_contents(staging, missing_dir_ok=True)
    if is_local(lay.fs):
        lay.fs.create_dir(staging, recursive=True)
    counts = _Counts()
    chunks: list[pa.Table] = []
    read_ok: list[InputFile] = []
    rows_per_group = cfg.run.batch_size * STAGING_BATCHES_PER_ROW_GROUP
    offsets = np.searchsorted(joined["file"].to_numpy(), np.arange(len(opened) + 1))
    for k, (f, _) in enumerate(opened):
        expected = joined.slice(offsets[k], offsets[k + 1] - offsets[k])
        target = f"{staging}/part-{k:05d}.parquet"
        try:
            chunk, file_counts = _stage_file(
                src_fs, lay.fs, target, f, expected, id_col, text_col, day,
                models_changed, rows_per_group,
            )  # fmt: skip
        except _Unreadable as e:
            skipped.append((f, e))
            continue
        chunks.append(chunk)
        read_ok.append(f)
        for name in ("new", "changed", "unchanged", "reprocessed"):
            setattr(counts, name, getattr(counts, name) + getattr(file_counts, name))

    read_index = pa.concat_tables(chunks) if chunks else INDEX_SCHEMA.empty_table()
    skipped_paths = {f.path for f, _ in skipped}
    index, removed, kept_unread = _next_index(old, read_index, unread_paths, skipped_paths)
    counts.unchanged += kept_unread
    atomic_write(lay.fs, lay.pending_index(day), index)
    next_files = {f.path: seen[f.path] for f in unread + read_ok}
    next_files.update({p: old_files[p] for p in skipped_paths if p in old_files})
    selected = counts.new + counts.changed + counts.reprocessed
    selection = {
        "date": day,
        "source": source,
        "started": started,
        "columns": {"id": id_col, "text": text_col},
        "models": models,
        "previous_models": previous_models,
        "models_changed": models_changed,
        "counts": {
            "new": counts.new,
            "changed": counts.changed,
            "removed": removed,
            "unchanged": counts.unchanged,
            "reprocessed": counts.reprocessed,
        },
        "selected": selected,
        "files": dict(sorted(next_files.items())),
        "skipped_files": [{"uri": f.uri, "reason": str(e)} for f, e in skipped],
    }
    _write_json(lay, lay.selection(day), selection)
    return selection


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


def _read_index(lay: _Layout) -> pa.Table:
    with lay.fs.open_input_file(lay.index) as f:
        table = pq.read_table(f)
    if table.schema.names != INDEX_SCHEMA.names:
        raise OutputError(
            f"{lay.uri(lay.index)} has columns {table.schema.names}, not "
            f"{INDEX_SCHEMA.names}; restore it, or delete {lay.uri(lay.audit_dir)} to start "
            "the audits over"
        )
    return table.cast(INDEX_SCHEMA)


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


def _stage_file(
    src_fs: pafs.FileSystem,
    out_fs: pafs.FileSystem,
    target: str,
    f: InputFile,
    expected: pa.Table,
    id_col: str,
    text_col: str,
    day: str,
    models_changed: bool,
    rows_per_group: int,
) -> tuple[pa.Table, _Counts]:
    """Stream one source file: hash each text, stage the selected rows, return index rows.

    ``expected`` is the file's ids joined with the index, in row order.
    """
    counts = _Counts()
    parts: list[pa.Table] = []
    today = pa.scalar(dt.date.fromisoformat(day), pa.date32())
    writer: _StagingWriter | None = None
    row = 0
    try:
        with src_fs.open_input_file(f.path) as raw:
            pf = pq.ParquetFile(raw)
            names = pf.schema_arrow.names
            if text_col not in names:
                raise InputError(
                    f"source file {f.uri} has no column {text_col!r} (set [input] "
                    f"text_column); its columns are: {', '.join(names)}"
                )
            schema = pa.schema([pf.schema_arrow.field(id_col), pf.schema_arrow.field(text_col)])
            writer = _StagingWriter(out_fs, target, schema, rows_per_group)
            for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS, columns=[id_col, text_col]):
                n = batch.num_rows
                want = expected.slice(row, n)
                ids = pc.cast(batch.column(0), pa.string())
                if n != want.num_rows or not ids.equals(want[DOC_ID].combine_chunks()):
                    raise RunFailed(
                        f"source file {f.uri} changed while the audit was reading it; run "
                        "the audit again (nothing was committed)"
                    )
                selected, part = _classify_batch(
                    batch, ids, want, f.path, today, models_changed, counts
                )
                writer.add(batch.filter(selected))
                parts.append(part)
                row += n
        if row != expected.num_rows:
            raise RunFailed(
                f"source file {f.uri} changed while the audit was reading it; run the audit "
                "again (nothing was committed)"
            )
        writer.close()
    except (pa.ArrowInvalid, OSError) as e:
        if writer is not None:
            writer.abort()
        if isinstance(e, OSError) and not is_local(src_fs):
            raise s3_error(e, f.uri) from e
        raise _unreadable(f, e) from e
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    table = pa.concat_tables(parts) if parts else INDEX_SCHEMA.empty_table()
    return table, counts


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
