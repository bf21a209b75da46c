"""Ray job entrypoint for a batch run: ``python -m docintel.jobs.batch --config job.toml``.

`docintel submit` starts this on a cluster through the Jobs API; `ray job submit -- python
-m docintel.jobs.batch ...` or a KubeRay RayJob can start it too. It calls the same run
function as `docintel run` (docintel.actors.runner.execute), so a job's output, resume
behaviour and exit codes (0 done, 1 failed, 2 usage, 3 partial) are exactly those of a
local run.

Inside a Ray job the driver must join the job's cluster (Ray sets RAY_ADDRESS for the
entrypoint), never start an embedded Ray beside it. Job logs are files, so progress is
printed as plain lines instead of a live bar.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from docintel.jobs.entry import ProgressLines, join_job_cluster, report_error
from docintel.pipeline.config import Config, load_config
from docintel.pipeline.errors import DocintelError, UsageError
from docintel.pipeline.exitcodes import ExitCode


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m docintel.jobs.batch",
        description="Run the docintel pipeline as a Ray job: input and output from the "
        "flags or the config's [job] input/output. Inside a Ray job it joins the job's "
        "cluster (RAY_ADDRESS); exit codes as `docintel run` (0, 1 failed, 2 usage, "
        "3 partial).",
        epilog="Example:  ray job submit --address http://HEAD:8265 --working-dir jobdir "
        "-- python -m docintel.jobs.batch --config job.toml --output s3://results/run-0412 "
        "--run-id run-0412   (or simply: docintel submit --config job.toml ...)",
    )
    p.add_argument("--config", type=Path, help="TOML config file (docintel.example.toml).")
    p.add_argument("--input", help="Parquet file, folder, glob or s3:// prefix (else [job] input).")
    p.add_argument("--output", help="Output folder or s3:// prefix (else [job] output).")
    p.add_argument("--run-id", help="Run id; resubmit with the same id to resume.")
    return p


def job_config(
    config: Path | None, input: str | None, output: str | None, run_id: str | None
) -> tuple[Config, str, str]:
    """The run's config, input and output; inside a Ray job, joined to the job's cluster."""
    cfg = load_config(config, {"run.run_id": run_id, "run.show_progress": False})
    where = f"in {config}" if config else "(no --config given)"
    input_uri, output_uri = input or cfg.job.input, output or cfg.job.output
    for key, value in (("input", input_uri), ("output", output_uri)):
        if not value:
            raise UsageError(f"no {key}: pass --{key} URI or set [job] {key} {where}")
    return join_job_cluster(cfg), input_uri, output_uri


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run, print the summary; returns the exit code."""
    args = _parser().parse_args(argv)
    from docintel.actors.runner import execute
    from docintel.jobs.ui import print_run_summary

    progress = ProgressLines()
    try:
        cfg, input_uri, output_uri = job_config(args.config, args.input, args.output, args.run_id)
        where = cfg.run.ray_address or "an embedded local Ray (not inside a Ray job)"
        code = Path(__file__).resolve().parent.parent  # installed package or shipped source
        print(f"docintel: batch run {input_uri} -> {output_uri} on {where}", flush=True)
        print(f"docintel: code from {code}, config {args.config or '(defaults)'}", flush=True)
        summary = execute(cfg, input_uri, output_uri, progress.on_start, progress.on_batch)
    except DocintelError as e:
        return report_error(e)
    print_run_summary(summary)
    if summary.partial:
        print(
            f"docintel: partial run: {len(summary.skipped_files)} input file(s) were "
            "unreadable and skipped (listed in _manifest.json skipped_files); exit code 3",
            file=sys.stderr,
            flush=True,
        )
        return ExitCode.PARTIAL
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
