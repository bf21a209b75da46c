"""What the Ray job entrypoints share (``python -m docintel.jobs.batch``,
``python -m docintel.jobs.nightly_audit``): joining the job's cluster, plain progress lines
(job logs are files, not terminals) and one-line errors with their exit codes."""

from __future__ import annotations

import os
import sys
import time

from docintel.jobs.ui import safe
from docintel.pipeline.config import Config
from docintel.pipeline.errors import DocintelError
from docintel.pipeline.exitcodes import ExitCode, error_kind, exit_code
from docintel.pipeline.output.sink import BatchStats

RAY_ADDRESS_ENV = "RAY_ADDRESS"  # set by Ray's job supervisor for the entrypoint
# A progress line at most this often (plus the first and the last): enough to see a job
# move in `docintel logs`, few enough that a million-document log stays readable.
PROGRESS_EVERY_S = 10.0
# Ray refuses a driver whose ray.init(runtime_env=...) sets a key that the job's own
# runtime_env also sets (e.g. a job submitted with env_vars TOKENIZERS_PARALLELISM). The
# pipeline's worker environment (docintel.actors.cluster.WORKER_ENV) must hold for its
# actors, so inside a job it wins those keys; every other part of the job's runtime_env
# (working_dir, other env_vars) is kept as is.
OVERRIDE_JOB_RUNTIME_ENV = "RAY_OVERRIDE_JOB_RUNTIME_ENV"


def join_job_cluster(cfg: Config) -> Config:
    """Inside a Ray job (RAY_ADDRESS set), the run joins the job's cluster instead of
    starting an embedded Ray beside it; elsewhere the config is returned as is."""
    address = os.environ.get(RAY_ADDRESS_ENV, "")
    if not address:
        return cfg
    os.environ.setdefault(OVERRIDE_JOB_RUNTIME_ENV, "1")
    return cfg.with_overrides({"run.ray_address": address})


def report_error(e: DocintelError) -> ExitCode:
    """``docintel: <kind>: <message>`` on stderr (the line `docintel submit` picks out of a
    failed job's log); returns the exit code."""
    print(f"docintel: {error_kind(e)}: {safe(e, multiline=True)}", file=sys.stderr, flush=True)
    return exit_code(e)


class ProgressLines:
    """on_start / on_batch callbacks for the run function that print plain lines."""

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
