"""Ray job entrypoint of the nightly audit (a RayJob, a CronJob, or by hand).

    python -m docintel.jobs.nightly_audit --config job.toml [--source URI] [--output URI]
                                          [--date YYYY-MM-DD]

Thin by design: load the config, call :func:`docintel.pipeline.audit.run_audit` (the
function behind ``docintel audit``) with the run function of ``docintel run``, print a
plain-text summary for the job's log and return the exit code of ``docintel run``: 0 done,
1 failed (rerun to resume), 2 bad usage or configuration, 3 partial (unreadable source
files skipped; retried next night).

Submitted as a Ray job, the entrypoint runs where ``RAY_ADDRESS`` names the cluster; the
pipeline then joins that cluster instead of starting an embedded Ray beside it, exactly as
``python -m docintel.jobs.batch`` does. Job logs are files: progress is printed as plain
lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from docintel.jobs.entry import ProgressLines, join_job_cluster, report_error
from docintel.pipeline.config import load_config
from docintel.pipeline.errors import DocintelError
from docintel.pipeline.exitcodes import ExitCode


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m docintel.jobs.nightly_audit",
        description="Audit only the documents that are new or changed since the last audit "
        "(same as `docintel audit`).",
        epilog="example: python -m docintel.jobs.nightly_audit --config nightly.toml "
        "--date 2026-05-01",
    )
    p.add_argument("--config", "-c", type=Path, help="TOML config ([audit] source/output...)")
    p.add_argument("--source", help="Documents: Parquet file, folder, glob or s3://prefix")
    p.add_argument("--output", help="Audit root: folder or s3://prefix")
    p.add_argument("--date", help="Night to audit, YYYY-MM-DD (default: today)")
    return p


def _print(s: Any) -> ExitCode:
    for line in s.notes + s.warnings:
        print(f"docintel: note: {line}")
    if s.already_complete:
        print(f"docintel: audit {s.date}: already complete, nothing to do; report: {s.report}")
        return ExitCode.OK
    print(
        f"docintel: audit {s.date}: new {s.new}, changed {s.changed}, removed {s.removed}, "
        f"unchanged {s.unchanged}, reprocessed {s.reprocessed}"
        f"{' (models changed)' if s.models_changed else ''}; documents {s.documents}, "
        f"sentences {s.sentences}, errors {s.errors}; report: {s.report}"
    )
    for f in s.skipped_files:
        print(f"docintel: skipped: {f['reason']}", file=sys.stderr)
    return ExitCode.PARTIAL if s.partial else ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    """Parse flags, audit, print the summary; returns the exit code."""
    args = _parser().parse_args(argv)
    from docintel.actors.runner import execute
    from docintel.pipeline.audit import run_audit

    progress = ProgressLines()
    try:
        cfg = join_job_cluster(load_config(args.config, {"run.show_progress": False}))
        s = run_audit(
            cfg, args.source, args.output, args.date, execute, progress.on_start, progress.on_batch
        )
    except DocintelError as e:
        return report_error(e)
    return _print(s)


if __name__ == "__main__":
    sys.exit(main())
