"""One audit call: the order of the nights, and each night from selection to committed state.

Per night: check the models (and, with Iceberg output, the warehouse), select the
documents (or reuse the selection a crashed audit of the same date persisted), run them
through the injected run function (into the night's partition, or appended to the audit
root's Iceberg tables: tables.py), write the report, and commit the state last.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.audit.changes import describe_changes, diff_index
from docintel.pipeline.audit.latest import update_latest
from docintel.pipeline.audit.select import waiting_since
from docintel.pipeline.audit.select_documents import select_night
from docintel.pipeline.audit.state import (
    INDEX_SCHEMA,
    AuditLayout,
    AuditSummary,
    already_complete,
    commit_state,
    completed,
    drop_incomplete_staging,
    drop_staged_inputs,
    drop_unmarked_staging,
    parse_date,
    pending_dates,
    read_index,
    read_json,
    read_state,
    remove_empty_dirs,
)
from docintel.pipeline.audit.tables import (
    NightTables,
    check_output,
    night_tables,
    run_id_of,
    run_output,
    run_started,
)
from docintel.pipeline.config import Config
from docintel.pipeline.errors import ConfigError, OutputError, RunFailed, UsageError
from docintel.pipeline.labels import resolve_labels
from docintel.pipeline.output.protocol import RunSummary
from docintel.pipeline.output.sink import BatchStats, resolve_output
from docintel.pipeline.output.tables import RunTables
from docintel.pipeline.report import REPORT_HTML, REPORT_JSON, write_report
from docintel.pipeline.run.lease import Lease
from docintel.pipeline.run.plan import check_models, ensure_derived
from docintel.pipeline.stages.classify import read_classifier_meta

StartCallback = Callable[[int, int], None]  # (total documents, documents already done)
BatchCallback = Callable[[BatchStats], None]


class Execute(Protocol):
    """The run function, :func:`docintel.actors.runner.execute`: passed in by the caller,
    because ``docintel.pipeline`` does not import Ray."""

    def __call__(
        self,
        cfg: Config,
        input_uri: str,
        output_uri: str,
        on_start: StartCallback | None = None,
        on_batch: BatchCallback | None = None,
    ) -> RunSummary: ...


@dataclass(frozen=True)
class _Audit:
    """What every night of one :func:`run_audit` call shares."""

    cfg: Config
    lay: AuditLayout
    output: str
    execute: Execute
    on_start: StartCallback | None
    on_batch: BatchCallback | None
    lease: Lease  # held on _audit/ for the whole call: the state changes only under it


def run_audit(
    cfg: Config,
    source: str | None,
    output: str | None,
    date: str | None,
    execute: Execute,
    on_start: StartCallback | None = None,
    on_batch: BatchCallback | None = None,
) -> AuditSummary:
    """Audit ``source`` into ``output`` for ``date`` (default: today): only what changed.

    ``source``/``output`` default to the config's ``[audit]`` keys. Idempotent per date:
    a date that already completed is a no-op; an interrupted one is resumed. An audit
    interrupted on an earlier date is finished first (the nightly job recovers by itself).
    ``execute`` runs each night's selection (:func:`docintel.actors.runner.execute`);
    ``on_start``/``on_batch`` are passed to it (progress display).
    """
    source = source or cfg.audit.source
    output = output or cfg.audit.output
    if not source:
        raise ConfigError("no audit source: pass --source URI or set [audit] source")
    if not output:
        raise ConfigError("no audit output: pass --output URI or set [audit] output")
    day = parse_date(date)
    fs, root = resolve_output(output, cfg.storage)
    lay = AuditLayout(fs, root)
    root_existed = fs.get_file_info(root).type != pafs.FileType.NotFound
    held = False
    # One audit at a time per audit root: the state is read, then rewritten whole.
    run = cfg.run
    try:
        with Lease(fs, lay.audit_dir, cfg.storage, f"docintel audit {day}", run.lease_ttl_s,
                   run.lease_wait_s) as lease:  # fmt: skip
            held = True
            audit = _Audit(cfg, lay, output, execute, on_start, on_batch, lease)
            try:
                return _locked(audit, day, source)
            except BaseException:
                drop_unmarked_staging(lay, day)  # no half-made staging is left behind
                raise
    except BaseException:
        if held:  # the folders this audit made and left empty go too (not another's)
            remove_empty_dirs(lay, root_existed)
        raise


def _locked(audit: _Audit, day: str, source: str) -> AuditSummary:
    """The audit of ``day`` under the ``_audit/`` lease."""
    lay = audit.lay
    state = read_state(lay)
    done = completed(state)
    if day in done:
        return _already_done(audit.cfg, done[day], source, audit.output, state)
    notes, state = _finish_earlier(audit, day, state, done)
    drop_incomplete_staging(lay, day, completed(state))
    summary = _audit_one(audit, day, source, state)
    summary.notes[:0] = notes
    return summary


def _already_done(
    cfg: Config, entry: dict[str, Any], source: str, output: str, state: dict[str, Any] | None
) -> AuditSummary:
    """The recorded audit of the date, plus what waits in the source since it ran."""
    summary = already_complete(entry, source, output)
    files, docs = waiting_since(cfg, source, state)
    if files:
        later = dt.date.fromisoformat(entry["date"]) + dt.timedelta(days=1)
        summary.notes.append(
            f"{files:,} source file(s) holding {docs:,} document(s) are new or changed "
            f"since the audit of {entry['date']}; their new or changed documents wait for "
            f"the next audit (an audit is done once per date): docintel audit --date {later}"
        )
    return summary


def _finish_earlier(
    audit: _Audit, day: str, state: dict[str, Any] | None, done: dict[str, Any]
) -> tuple[list[str], dict[str, Any] | None]:
    """Refuse a date before the audits' last one; finish the audits interrupted before
    ``day``. Returns notes on what was finished and the state after it."""
    lay, output = audit.lay, audit.output
    notes: list[str] = []
    last = max(done, default=None)
    if last is not None and day < last:
        raise UsageError(
            f"the audits in {output} have reached {last}; an audit of the earlier date {day} "
            "would undo later ones. Audit a later date (or omit --date for today)"
        )
    for pending in pending_dates(lay, done):
        if pending > day:
            raise UsageError(
                f"the audit of {pending} in {output} is unfinished and later than {day}; "
                f"finish it first: docintel audit --date {pending}"
            )
        if pending < day:
            earlier = _audit_one(audit, pending, None, state)
            notes.append(
                f"finished the interrupted audit of {pending} first "
                f"({earlier.documents:,} documents; report {earlier.report})"
            )
            state = read_state(lay)
    return notes, state


# --- one night -----------------------------------------------------------------------------


def _audit_one(
    audit: _Audit, day: str, source: str | None, state: dict[str, Any] | None
) -> AuditSummary:
    """Select (or reuse the selection of) ``day``, run it, report, then commit the state."""
    cfg, lay = audit.cfg, audit.lay
    models = _models(cfg, lay)
    partition = lay.partition(day)
    selection, resumed = _selection(audit, day, source, state, models)
    run_id = run_id_of(day)
    ran = selection["selected"] > 0
    run_summary = None
    if ran:
        run_cfg = cfg.with_overrides({"run.run_id": run_id})
        staging, dst = lay.uri(lay.staging(day)), run_output(cfg, lay, day)
        run_summary = audit.execute(run_cfg, staging, dst, audit.on_start, audit.on_batch)
    night = night_tables(cfg, lay)
    record = _audit_record(audit, day, selection, models, run_id if ran else None)
    record.update(_night_changes(lay, day, state, night))
    if ran and cfg.audit.watch:
        record["watch"] = _watch(cfg, night(day))
    history = _history(lay, state, cfg.audit.trend_runs)
    a = cfg.audit
    report = write_report(lay.fs, partition, record, history, a.risk(), a.top_n, night(day))
    entry = _state_entry(lay, record, selection, report["counts"])
    audit.lease.renew()  # the state is committed under a claim that is fresh and ours
    audit.lease.check()
    commit_state(lay, day, state, selection, entry, cfg.storage)
    if cfg.privacy.on:
        drop_staged_inputs(lay, day)  # the raw text of tonight's documents
    return _summary(audit, entry, selection, models, resumed, run_summary)


def _models(cfg: Config, lay: AuditLayout) -> dict[str, str]:
    """The versions of the night's models (an extra head's as ``classify.NAME``: a changed
    head reprocesses); the heads must know the ``[audit] risk_label(s)``. With a warehouse
    format, it must take the night's rows (else exit 2 here)."""
    ensure_derived(cfg)  # what the night's run will need, built before anything is staged
    labels, versions, _ = check_models(cfg)
    heads = {"": labels}
    for name, folder in cfg.classify.head_dirs().items():
        heads[name] = read_classifier_meta(folder)[0]
        versions = {**versions, f"classify.{name}": fingerprint(folder)}
    try:
        resolve_labels(cfg.audit.risk(), heads, "[audit] risk_labels")
    except UsageError as e:
        raise ConfigError(f"{e}; set [audit] risk_label or risk_labels to some of them") from e
    check_output(cfg, lay, labels)
    return versions  # per stage: the sentencizer's spaCy pipeline, the models' versions


def _selection(
    audit: _Audit,
    day: str,
    source: str | None,
    state: dict[str, Any] | None,
    models: dict[str, str],
) -> tuple[dict[str, Any], bool]:
    """The night's selection and whether it is resumed: the one a crashed audit of ``day``
    persisted (it must have read the same source with the same models), else a new one."""
    lay, output = audit.lay, audit.output
    partition = lay.partition(day)
    selection = read_json(lay, lay.selection(day))
    if selection is None:
        if source is None:  # only pending dates come without a source, and they have one
            raise RunFailed(f"{lay.uri(lay.selection(day))} vanished while auditing")
        started = run_started(audit.cfg, lay, day)
        if started is not None:
            run_dir = lay.uri(started.rsplit("/", 1)[0])
            raise OutputError(
                f"{run_dir} holds the run {run_id_of(day)} but {lay.uri(lay.selection(day))}, "
                f"the record of its input, is missing; delete {run_dir} (and, with Iceberg "
                f"output, that run's snapshots) to redo the audit of {day}"
            )
        return select_night(audit.cfg, lay, day, source, state, models), False
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
    return selection, True


def _night_changes(
    lay: AuditLayout, day: str, state: dict[str, Any] | None, night: NightTables
) -> dict[str, Any]:
    """Tonight's changes by document, and ``latest/`` brought up to date (its corpus
    counts): from the index before the night and the pending one after it."""
    old = read_index(lay, state) if state else INDEX_SCHEMA.empty_table()
    with lay.fs.open_input_file(lay.pending_index(day)) as f:
        new = pq.read_table(f).cast(INDEX_SCHEMA)
    diff = diff_index(old, new, day)
    corpus = update_latest(lay, day, new, diff, max(completed(state), default=None), night)
    return {"changes": describe_changes(night, day, diff), "corpus": corpus}


def _watch(cfg: Config, tables: RunTables) -> list[dict[str, Any]]:
    """The ``[audit] watch`` queries' top sentences among the night's new and changed
    documents (the night's run), one flat row per hit for the report's watch list."""
    from docintel.pipeline.search.query import watch_hits  # the encoder: only when asked
    from docintel.pipeline.search.source import SentencesSource

    a = cfg.audit
    found = watch_hits(SentencesSource.of(tables, cfg.storage), a.watch, None, a.watch_top, cfg)
    return [{"query": q, **hit} for q in a.watch for hit in found.get(q, [])]


def _audit_record(
    audit: _Audit,
    day: str,
    selection: dict[str, Any],
    models: dict[str, str],
    run_id: str | None,
) -> dict[str, Any]:
    """The audit as the report records it (finished: now, after the run)."""
    c = selection["counts"]
    return {
        "date": day,
        "run_id": run_id,
        "source": selection["source"],
        "output": audit.output,
        "partition": audit.lay.uri(audit.lay.partition(day)),
        "new": c["new"],
        "changed": c["changed"],
        "removed": c["removed"],
        "unchanged": c["unchanged"],
        "reprocessed": c["reprocessed"],
        "models_changed": selection["models_changed"],
        "models": models,
        "previous_models": selection["previous_models"],
        "ran": selection["selected"] > 0,
        "skipped_source_files": selection["skipped_files"],
        "started": selection["started"],
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _history(lay: AuditLayout, state: dict[str, Any] | None, n: int) -> list[dict[str, Any]]:
    """report.json of the last ``n`` completed audits, oldest first (missing ones skipped)."""
    history = []
    for entry in (state["audits"] if state else [])[-n:]:
        report = read_json(lay, f"{lay.partition(entry['date'])}/{REPORT_JSON}")
        if report is not None:
            history.append(report)
    return history


def _state_entry(
    lay: AuditLayout,
    record: dict[str, Any],
    selection: dict[str, Any],
    counts: dict[str, Any],
) -> dict[str, Any]:
    """The night's entry in ``state.json``: the audit record with the report's counts."""
    c = selection["counts"]
    return {
        "date": record["date"],
        "run_id": record["run_id"],
        "partition": record["partition"],
        **{k: c[k] for k in ("new", "changed", "removed", "unchanged", "reprocessed")},
        "documents": counts["documents"],
        "sentences": counts["sentences"],
        "errors": counts["errors"],
        "report": lay.uri(f"{lay.partition(record['date'])}/{REPORT_HTML}"),  # people read
        "report_json": lay.uri(f"{lay.partition(record['date'])}/{REPORT_JSON}"),
        "ran": record["ran"],
        "models_changed": selection["models_changed"],
        "source": selection["source"],
        "skipped_files": selection["skipped_files"],
        "started": record["started"],
        "finished": record["finished"],
    }


def _summary(
    audit: _Audit,
    entry: dict[str, Any],
    selection: dict[str, Any],
    models: dict[str, str],
    resumed: bool,
    run_summary: RunSummary | None,
) -> AuditSummary:
    """What this invocation did for the night of ``entry``."""
    c = selection["counts"]
    return AuditSummary(
        date=entry["date"],
        source=selection["source"],
        output=audit.output,
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
        ran=entry["ran"],
        models_changed=selection["models_changed"],
        models=models,
        resumed=resumed,
        skipped_files=selection["skipped_files"],
        warnings=list(run_summary.warnings) if run_summary else [],
        run=run_summary,
    )
