"""Live run metrics through Ray's metrics API (Prometheus endpoint, dashboard, Grafana).

The driver reports what only it sees: batches and sentences per stage and pool, batches
spilled to a CPU pool, batches held on the driver waiting for a replica slot, each
replica's busy fraction, batch retries and failed documents. Each GPU replica reports its
own CUDA memory. Ray exports them from every node's metrics agent as ``ray_docintel_*``
(``infra/grafana/docintel-dashboard.json`` charts them); tags name the run, stage, pool
and replica. Recording is a few dictionary updates per batch: nothing here waits on I/O.
"""

from __future__ import annotations

import sys
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


class RunMetrics:
    """The driver's metrics of one run (tags carry the run id)."""

    def __init__(self, run_id: str) -> None:
        self.run = run_id
        self.m = _driver()

    def call_done(self, stage: str, pool: str, spilled: bool) -> None:
        self.m["batches"].inc(1, {"run": self.run, "stage": stage, "pool": pool})
        if spilled:
            self.m["spilled"].inc(1, {"run": self.run, "stage": stage})

    def batch_written(self, pools: dict[str, str], sentences: int, docs: int, errors: int) -> None:
        for stage, pool in pools.items():
            if sentences:  # Ray's counters take only increments > 0
                self.m["sentences"].inc(sentences, {"run": self.run, "stage": stage, "pool": pool})
        if docs:
            self.m["documents"].inc(docs, {"run": self.run})
        if errors:
            self.m["failed"].inc(errors, {"run": self.run})

    def retried(self) -> None:
        self.m["retries"].inc(1, {"run": self.run})

    def held(self, stage: str, n: int) -> None:
        self.m["held"].set(n, {"run": self.run, "stage": stage})

    def replica(self, stage: str, pool: str, key: str, busy_fraction: float) -> None:
        tags = {"run": self.run, "stage": stage, "pool": pool, "replica": key}
        self.m["busy"].set(busy_fraction, tags)

    def replicas(self, stage: str, pool: str, n: int) -> None:
        self.m["replicas"].set(n, {"run": self.run, "stage": stage, "pool": pool})


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
