"""One Ray actor class per model stage. Each loads its model once, in its own process.

Which stage object a replica holds (pool, precision) is decided in docintel.pipeline.layout;
the actor only hosts it."""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

from docintel.actors.metrics import report_gpu_memory
from docintel.pipeline.batch import Batch
from docintel.pipeline.schema import BACKEND_GPU_BF16, BACKEND_GPU_FP16, BACKEND_GPU_FP32
from docintel.pipeline.stages import Stage, run_stage

CUDA_BACKENDS = (BACKEND_GPU_FP16, BACKEND_GPU_BF16, BACKEND_GPU_FP32)  # not gpu-sim


class StageActor:
    """Holds one stage. A failed ``setup()`` is reported by ``ready()``, not as a dead actor,
    so the driver can show the stage's own message (which model path, what was expected)."""

    stage_name: ClassVar[str]

    def __init__(
        self, stage: Stage, delay_s: float = 0.0, key: str = "", load_delay_s: float = 0.0
    ) -> None:
        self.stage = stage
        self.delay_s = delay_s  # test-only slowdown ([faults] gpu_delay_s)
        self.key = key  # stage/pool/index, for metrics
        self.setup_error: Exception | None = None
        time.sleep(load_delay_s)  # test-only slow model load ([faults] load_delay_s)
        try:
            stage.setup()
        except Exception as e:  # re-raised by ready()/process() with the original type
            self.setup_error = e

    def ready(self) -> dict[str, Any]:
        if self.setup_error is not None:
            raise self.setup_error
        import ray

        return {
            "backend": self.stage.backend,
            "version": self.stage.version,
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
        }

    def process(self, batch: Batch) -> Batch:
        if self.setup_error is not None:
            raise self.setup_error
        if self.delay_s:
            time.sleep(self.delay_s)
        out = run_stage(self.stage, batch)
        if self.stage.backend in CUDA_BACKENDS:
            report_gpu_memory(self.stage_name, self.key)
        return out


class SentencizeActor(StageActor):
    stage_name = "sentencize"


class EmbedActor(StageActor):
    stage_name = "embed"


class ClassifyActor(StageActor):
    stage_name = "classify"


ACTOR_CLASSES: dict[str, type[StageActor]] = {
    c.stage_name: c for c in (SentencizeActor, EmbedActor, ClassifyActor)
}
