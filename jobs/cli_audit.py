"""`docintel audit`: the nightly audit command (options, help and printing; the audit itself
is docintel.pipeline.audit.run_audit, run through docintel.actors.runner.execute)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from docintel.jobs.ui import (
    ConfigOpt,
    ProgressOpt,
    console,
    fail,
    out,
    run_with_progress,
    safe,
    warn_partial,
)
from docintel.pipeline.config import load_config
from docintel.pipeline.errors import DocintelError

SourceOpt = Annotated[
    str | None,
    typer.Option(
        help="Documents to audit: Parquet file, folder, glob or s3://prefix, re-read "
        "each night (default: \\[audit] source)."
    ),
]
AuditOutputOpt = Annotated[
    str | None,
    typer.Option(
        help="Audit root, a folder or s3://prefix: gets run_date=YYYY-MM-DD/ partitions "
        "with report.json/report.html, and _audit/ state (default: \\[audit] output)."
    ),
]
DateOpt = Annotated[
    str | None,
    typer.Option(
        help="Night to audit, YYYY-MM-DD (default: today). A date already audited is a "
        "no-op; an interrupted one is resumed."
    ),
]


def audit(
    source: SourceOpt = None,
    output: AuditOutputOpt = None,
    config: ConfigOpt = None,
    date: DateOpt = None,
    progress: ProgressOpt = True,
) -> None:
    """Process only the documents that are new or changed since the last audit.

    Source files with unchanged size and modification time are not read; in the
    others, each document's text hash is compared with the last audit's. The
    night's documents go through one normal docintel run, written to
    OUTPUT/run_date=DATE/ with report.json and report.html beside it; read all
    nights at once through the hive partition run_date. With the config's output
    format = "iceberg", OUTPUT is one Iceberg warehouse instead: each night appends its
    snapshots (run id audit-DATE) to its tables, and run_date=DATE/ holds the
    report. A model change
    reprocesses every document. Exit codes as `docintel run`; 3 means some
    source files were unreadable (they are read again next time).

    Examples:

      docintel audit --source data/demo --output audits --date 2026-05-01

      docintel audit -c infra/config/audit-local.toml   # source, output from it
    """
    from docintel.actors.runner import execute
    from docintel.pipeline.audit import run_audit

    def audit_run(cfg: Any, src: Any, dst: Any, on_start: Any, on_batch: Any) -> Any:
        return run_audit(cfg, src, dst, date, execute, on_start=on_start, on_batch=on_batch)

    try:
        cfg = load_config(config, {"run.show_progress": None if progress else False})
        summary = run_with_progress(audit_run, cfg, source, output)
    except DocintelError as e:
        fail(e)
    print_audit_summary(summary)
    if summary.partial:
        warn_partial(
            "audit",
            len(summary.skipped_files),
            "source file(s) were unreadable and skipped (listed above); they are read "
            "again next time",
        )


def _notes(s: Any) -> None:
    for note in s.notes:
        console.print(f"[cyan]note:[/] {escape(safe(note))}", highlight=False)
    for w in s.warnings:
        console.print(f"[yellow]warning:[/] {escape(safe(w))}", highlight=False)
    for f in s.skipped_files:
        console.print(f"[yellow]skipped:[/] {escape(safe(f['reason']))}", highlight=False)


def print_audit_summary(s: Any) -> None:
    """The audit as a table: what changed, what ran, where the report is."""
    _notes(s)
    if s.already_complete:
        out.print(
            f"the audit of {s.date} in {escape(safe(s.output))} is already complete: nothing to "
            f"do ({s.documents:,} documents, {s.sentences:,} sentences, {s.errors:,} "
            f"errors); report: {escape(safe(s.report))}",
            highlight=False,
            soft_wrap=True,
        )
        return
    t = Table(title=f"docintel audit {s.date}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    for what in ("new", "changed", "removed", "unchanged"):
        t.add_row(f"{what} documents", f"{getattr(s, what):,}")
    if s.models_changed:
        t.add_row("reprocessed (models changed)", f"{s.reprocessed:,}")
    t.add_row("documents processed", f"{s.documents:,}")
    t.add_row("sentences", f"{s.sentences:,}")
    t.add_row("errors (documents)", f"{s.errors:,}")
    if s.run is not None:
        t.add_row("run", f"{s.run_id} ({s.run.wall_seconds:,.1f} s)")
        if s.run.skipped_batches:
            t.add_row("batches (this run / resumed)", f"{s.run.batches} / {s.run.skipped_batches}")
    elif not s.ran:
        t.add_row("run", "none: nothing new or changed")
    out.print(t)
    # paths on lines of their own, never wrapped or cut: they are copied and opened
    out.print(f"partition: {escape(safe(s.partition))}", soft_wrap=True, highlight=False)
    out.print(f"report: {escape(safe(s.report))}", soft_wrap=True, highlight=False)
    if s.models_changed:
        console.print(
            "[cyan]note:[/] the model versions differ from the last audit's, so every "
            "document was processed again",
            highlight=False,
        )
