"""Live run metrics through Ray's metrics API (Prometheus endpoint, dashboard, Grafana).

The driver reports what only it sees: batches and sentences per stage and pool, batches
spilled to a CPU pool, batches held on the driver waiting for a replica slot, each
replica's busy fraction, batch retries and failed documents. Each GPU replica reports its
own CUDA memory. Ray exports them from every node's metrics agent as ``ray_docintel_*``
(``infra/grafana/docintel-dashboard.json`` charts them); tags name the run, stage, pool
and replica. Recording is a few dictionary updates per batch, handed to Ray in bulk once a
second (FLUSH_S): nothing here waits on I/O.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from functools import cache
from typing import Any

from ray.util import metrics

PREFIX = "docintel_"


@cache
def _driver() -> dict[str, Any]:
    stage_pool = ("run", "stage", "pool")
    return {
        "batches": metrics.Counter(PREFIX + "batches", "Batches a stage pool finished", stage_pool),
        "sentences": metrics.Counter(
            PREFIX + "sentences", "Sentences a stage pool processed", stage_pool
        ),
        "spilled": metrics.Counter(
            PREFIX + "batches_spilled",
            "Batches a stage sent to its CPU pool while it also had GPU replicas",
            ("run", "stage"),
        ),
        "held": metrics.Gauge(
            PREFIX + "batches_held",
            "Batches ready for a stage but waiting on the driver for a replica slot",
            ("run", "stage"),
        ),
        "busy": metrics.Gauge(
            PREFIX + "replica_busy_fraction",
            "Share of its time in the pool a replica spent computing",
            ("run", "stage", "pool", "replica"),
        ),
        "replicas": metrics.Gauge(PREFIX + "replicas", "Live replicas per stage pool", stage_pool),
        "retries": metrics.Counter(
            PREFIX + "batch_retries", "Batches re-run from their read after a failure", ("run",)
        ),
        "failed": metrics.Counter(
            PREFIX + "documents_failed", "Documents that ended as error rows", ("run",)
        ),
        "documents": metrics.Counter(
            PREFIX + "documents", "Documents written (result or error row)", ("run",)
        ),
    }


# Ray's metric calls cost tens of microseconds each (tags are validated and the record
# sent to the metrics agent): the driver adds up its counts in dictionaries per event and
# hands them to Ray at most this often, so its cost per batch does not grow with the
# number of counters. Gauges keep their last value.
FLUSH_S = 1.0


class RunMetrics:
    """The driver's metrics of one run (tags carry the run id), recorded in bulk."""

    def __init__(self, run_id: str) -> None:
        self.run = run_id
        self.m = _driver()
        self._counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
        self._gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._flushed = time.monotonic()

    def _inc(self, name: str, n: float, **tags: str) -> None:
        if n:  # Ray's counters take only increments > 0
            self._counts[(name, tuple(tags.items()))] += n

    def _set(self, name: str, value: float, **tags: str) -> None:
        self._gauges[(name, tuple(tags.items()))] = value

    def flush(self, now: float | None = None, force: bool = False) -> None:
        """Hand the counts and gauges gathered since the last flush to Ray (every FLUSH_S
        seconds, or now when ``force``)."""
        now = time.monotonic() if now is None else now
        if not force and now - self._flushed < FLUSH_S:
            return
        self._flushed = now
        for (name, tags), n in self._counts.items():
            self.m[name].inc(n, {"run": self.run, **dict(tags)})
        for (name, tags), value in self._gauges.items():
            self.m[name].set(value, {"run": self.run, **dict(tags)})
        self._counts.clear()
        self._gauges.clear()

    def call_done(self, stage: str, pool: str, spilled: bool) -> None:
        self._inc("batches", 1, stage=stage, pool=pool)
        if spilled:
            self._inc("spilled", 1, stage=stage)

    def batch_written(self, pools: dict[str, str], sentences: int, docs: int, errors: int) -> None:
        for stage, pool in pools.items():
            self._inc("sentences", sentences, stage=stage, pool=pool)
        self._inc("documents", docs)
        self._inc("failed", errors)

    def retried(self) -> None:
        self._inc("retries", 1)

    def held(self, stage: str, n: int) -> None:
        self._set("held", n, stage=stage)

    def replica(self, stage: str, pool: str, key: str, busy_fraction: float) -> None:
        self._set("busy", busy_fraction, stage=stage, pool=pool, replica=key)

    def replicas(self, stage: str, pool: str, n: int) -> None:
        self._set("replicas", n, stage=stage, pool=pool)


@cache
def _gpu_memory() -> Any:
    return metrics.Gauge(
        PREFIX + "gpu_memory_bytes",
        "CUDA memory a GPU replica's framework holds (peak allocated since start)",
        ("stage", "replica"),
    )


def report_gpu_memory(stage: str, replica: str) -> None:
    """From inside a GPU replica: its CUDA memory (PyTorch's allocator; TensorFlow's
    where the stage runs Keras). Silent where CUDA is absent."""
    used = 0
    try:
        import torch

        if torch.cuda.is_available():
            used = int(torch.cuda.max_memory_allocated())
    except ImportError:
        pass
    if "tensorflow" in sys.modules:  # a stage that runs Keras on the card
        try:
            import tensorflow as tf

            if tf.config.list_physical_devices("GPU"):
                used += int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
        except (ImportError, ValueError):
            pass
    if used:
        _gpu_memory().set(used, {"stage": stage, "replica": replica})
