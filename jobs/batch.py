"""Ray job entrypoint for a batch run: ``python -m jobs.batch --config job.toml``.

`docintel submit` starts this on a cluster through the Jobs API; `ray job submit -- python
-m jobs.batch ...` or a KubeRay RayJob can start it too. It calls jobs.run.execute, the
same run function as `docintel run`, so a job's output, resume behaviour and exit codes
(0 done, 1 failed, 2 usage, 3 partial) are exactly those of a local run.

Inside a Ray job the driver must join the job's cluster (Ray sets RAY_ADDRESS for the
entrypoint), never start an embedded Ray beside it. Job logs are files, so progress is
printed as plain lines instead of a live bar.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from pipeline.config import Config, load_config
from pipeline.errors import DocintelError, UsageError
from pipeline.sink import BatchStats

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3
# A progress line at most this often (plus the first and the last): enough to see a job
# move in `docintel logs`, few enough that a million-document log stays readable.
PROGRESS_EVERY_S = 10.0
# Ray refuses a driver whose ray.init(runtime_env=...) sets a key that the job's own
# runtime_env also sets (e.g. a job submitted with env_vars TOKENIZERS_PARALLELISM). The
# pipeline's worker environment (actors.cluster.WORKER_ENV) must hold for its actors, so
# inside a job it wins those keys; every other part of the job's runtime_env (working_dir,
# other env_vars) is kept as is.
OVERRIDE_JOB_RUNTIME_ENV = "RAY_OVERRIDE_JOB_RUNTIME_ENV"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jobs.batch",
        description="Run the docintel pipeline as a Ray job: input and output from the "
        "flags or the config's [job] input/output. Inside a Ray job it joins the job's "
        "cluster (RAY_ADDRESS); exit codes as `docintel run` (0, 1 failed, 2 usage, "
        "3 partial).",
        epilog="Example:  ray job submit --address http://HEAD:8265 --working-dir jobdir "
        "-- python -m jobs.batch --config job.toml --output s3://results/run-0412 "
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
    address = os.environ.get("RAY_ADDRESS", "")
    if address:  # set by Ray for a job's entrypoint: the cluster's GCS address
        cfg = cfg.with_overrides({"run.ray_address": address})
        os.environ.setdefault(OVERRIDE_JOB_RUNTIME_ENV, "1")
    return cfg, input_uri, output_uri


class ProgressLines:
    """on_start / on_batch callbacks for jobs.run.execute that print plain lines."""

    def __init__(self, every_s: float = PROGRESS_EVERY_S) -> None:
        self.every_s = every_s
        self.total = self.done = self.sentences = 0
        self.t0 = self.last = time.perf_counter()

    def on_start(self, total: int, done: int) -> None:
        self.total, self.done = total, done
        self.t0 = self.last = time.perf_counter()
        resumed = f" ({done:,} already done by an earlier attempt)" if done else ""
        print(f"docintel: processing {total:,} documents{resumed}", flush=True)

    def on_batch(self, stats: BatchStats) -> None:
        self.done += stats.documents
        self.sentences += stats.sentences
        now = time.perf_counter()
        if now - self.last < self.every_s and self.done < self.total:
            return
        self.last = now
        elapsed = max(now - self.t0, 1e-9)
        pct = 100 * self.done / self.total if self.total else 100.0
        print(
            f"docintel: {self.done:,}/{self.total:,} documents ({pct:.0f}%), "
            f"{self.sentences:,} sentences, {self.sentences / elapsed:,.1f} sentences/s, "
            f"{elapsed:,.0f} s",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run, print the summary; returns the exit code."""
    args = _parser().parse_args(argv)
    from jobs.cli import _print_summary
    from jobs.run import execute

    progress = ProgressLines()
    try:
        cfg, input_uri, output_uri = job_config(args.config, args.input, args.output, args.run_id)
        where = cfg.run.ray_address or "an embedded local Ray (not inside a Ray job)"
        code = Path(__file__).resolve().parent.parent  # installed package or shipped source
        print(f"docintel: batch run {input_uri} -> {output_uri} on {where}", flush=True)
        print(f"docintel: code from {code}, config {args.config or '(defaults)'}", flush=True)
        summary = execute(
            cfg, input_uri, output_uri, on_start=progress.on_start, on_batch=progress.on_batch
        )
    except DocintelError as e:
        code = EXIT_USAGE if isinstance(e, UsageError) else EXIT_FAILED
        kind = "usage error" if code == EXIT_USAGE else "run failed"
        print(f"docintel: {kind}: {e}", file=sys.stderr, flush=True)
        return code
    _print_summary(summary)
    if summary.partial:
        print(
            f"docintel: partial run: {len(summary.skipped_files)} input file(s) were "
            "unreadable and skipped (listed in _manifest.json skipped_files); exit code 3",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_PARTIAL
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
