"""Ray job entrypoint of the nightly audit (a RayJob, a CronJob, or by hand).

    python -m jobs.nightly_audit --config job.toml [--source URI] [--output URI]
                                 [--date YYYY-MM-DD]

Thin by design: load the config, call :func:`jobs.audit.run_audit` (the function behind
``docintel audit``), print a plain-text summary for the job's log and return the exit code
of ``docintel run``: 0 done, 1 failed (rerun to resume), 2 bad usage or configuration,
3 partial (unreadable source files skipped; retried next night).

Submitted as a Ray job, the entrypoint runs where ``RAY_ADDRESS`` names the cluster; the
pipeline then joins that cluster instead of starting an embedded Ray beside it, exactly as
``python -m jobs.batch`` does. Job logs are files: progress is printed as plain lines.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pipeline.config import load_config
from pipeline.errors import DocintelError, UsageError

EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL = 1, 2, 3
RAY_ADDRESS_ENV = "RAY_ADDRESS"  # set by Ray's job supervisor for the entrypoint


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jobs.nightly_audit",
        description="Audit only the documents that are new or changed since the last audit "
        "(same as `docintel audit`).",
        epilog="example: python -m jobs.nightly_audit --config nightly.toml --date 2026-05-01",
    )
    p.add_argument("--config", "-c", type=Path, help="TOML config ([audit] source/output...)")
    p.add_argument("--source", help="Documents: Parquet file, folder, glob or s3://prefix")
    p.add_argument("--output", help="Audit root: folder or s3://prefix")
    p.add_argument("--date", help="Night to audit, YYYY-MM-DD (default: today)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from jobs.audit import run_audit
    from jobs.batch import OVERRIDE_JOB_RUNTIME_ENV, ProgressLines

    progress = ProgressLines()
    try:
        cfg = load_config(args.config, {"run.show_progress": False})
        address = os.environ.get(RAY_ADDRESS_ENV, "")
        if address:  # inside a Ray job: the job's cluster, as jobs.batch joins it
            cfg = cfg.with_overrides({"run.ray_address": address})
            os.environ.setdefault(OVERRIDE_JOB_RUNTIME_ENV, "1")
        s = run_audit(
            cfg, args.source, args.output, args.date, progress.on_start, progress.on_batch
        )
    except DocintelError as e:
        usage = isinstance(e, UsageError)
        kind = "usage error" if usage else "run failed"
        print(f"docintel: {kind}: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE if usage else EXIT_FAILED
    for line in s.notes + s.warnings:
        print(f"docintel: note: {line}")
    if s.already_complete:
        print(f"docintel: audit {s.date}: already complete, nothing to do; report: {s.report}")
        return 0
    print(
        f"docintel: audit {s.date}: new {s.new}, changed {s.changed}, removed {s.removed}, "
        f"unchanged {s.unchanged}, reprocessed {s.reprocessed}"
        f"{' (models changed)' if s.models_changed else ''}; documents {s.documents}, "
        f"sentences {s.sentences}, errors {s.errors}; report: {s.report}"
    )
    for f in s.skipped_files:
        print(f"docintel: skipped: {f['reason']}", file=sys.stderr)
    return EXIT_PARTIAL if s.partial else 0


if __name__ == "__main__":
    sys.exit(main())
