"""One Ray actor class per model stage. Each loads its model once, in its own process."""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

from pipeline.batch import Batch
from pipeline.config import Config
from pipeline.stages import Stage, run_stage
from pipeline.stages.base import Placement
from pipeline.stages.classify import Classifier, Int8Classifier
from pipeline.stages.embed import Embedder
from pipeline.stages.embed_int8 import Int8Embedder
from pipeline.stages.faults import PoisonedStage
from pipeline.stages.sentencize import Sentencizer


class StageActor:
    """Holds one stage. A failed ``setup()`` is reported by ``ready()``, not as a dead actor,
    so the driver can show the stage's own message (which model path, what was expected)."""

    stage_name: ClassVar[str]

    def __init__(self, stage: Stage, delay_s: float = 0.0) -> None:
        self.stage = stage
        self.delay_s = delay_s  # test-only slowdown ([faults] gpu_delay_s)
        self.setup_error: Exception | None = None
        try:
            stage.setup()
        except Exception as e:  # re-raised by ready()/process() with the original type
            self.setup_error = e

    def ready(self) -> dict[str, Any]:
        if self.setup_error is not None:
            raise self.setup_error
        return {"backend": self.stage.backend, "version": self.stage.version, "pid": os.getpid()}

    def process(self, batch: Batch) -> Batch:
        if self.setup_error is not None:
            raise self.setup_error
        if self.delay_s:
            time.sleep(self.delay_s)
        return run_stage(self.stage, batch)


class SentencizeActor(StageActor):
    stage_name = "sentencize"


class EmbedActor(StageActor):
    stage_name = "embed"


class ClassifyActor(StageActor):
    stage_name = "classify"


ACTOR_CLASSES: dict[str, type[StageActor]] = {
    c.stage_name: c for c in (SentencizeActor, EmbedActor, ClassifyActor)
}

# A small MLP gains nothing from intra-op parallelism; one thread (TF, or ORT for the
# int8 copy) leaves cores to the encoder running beside it.
CLASSIFY_TF_THREADS = 1


# Stages whose CPU replicas have an int8 model (`docintel quantize` builds both); the
# rule-based sentencizer has no weights to quantize.
INT8_STAGES = ("embed", "classify")


def cpu_int8(cfg: Config, stage: str = "embed") -> bool:
    """Whether ``stage``'s CPU replicas run its int8 artefact.

    One switch for both model stages, ``[embed] cpu_precision`` (the int8 folder and its
    parity report cover encoder and classifier together): "int8"/"fp32" force it; "auto"
    picks int8 where the CPU replicas are a spill pool, i.e. spill is auto and this stage
    also has GPU replicas (its CPU pool is then the overflow, not the main path).
    """
    if stage not in INT8_STAGES:
        return False
    precision = cfg.embed.cpu_precision
    if precision != "auto":
        return precision == "int8"
    pool = cfg.resources.embed if stage == "embed" else cfg.resources.classify
    return cfg.run.spill == "auto" and pool.gpu_replicas > 0


def build_stage(name: str, cfg: Config, device: str = "cpu", gpu_fraction: float = 0.0) -> Stage:
    """The stage object (config only; the model loads in the actor's ``setup()``).

    ``device`` is the pool: "gpu" replicas cap their framework at ``gpu_fraction`` of the
    card and run fp16/bf16, or fp32 on the CPU as ``gpu-sim`` when CUDA is absent.
    """
    stage: Stage
    placement = Placement(device, gpu_fraction)
    if name == "sentencize":
        stage = Sentencizer(cfg.sentencize, placement)
    elif name == "embed" and device == "cpu" and cpu_int8(cfg):
        stage = Int8Embedder(
            cfg.embed, cfg.embed.resolved_int8_dir(), replicas=cfg.resources.embed.replicas
        )
    elif name == "embed":
        stage = Embedder(cfg.embed, replicas=cfg.resources.embed.replicas, placement=placement)
    elif name == "classify" and device == "cpu" and cpu_int8(cfg, "classify"):
        stage = Int8Classifier(
            cfg.classify, cfg.embed.resolved_int8_dir(), threads=CLASSIFY_TF_THREADS
        )
    elif name == "classify":
        stage = Classifier(cfg.classify, threads=CLASSIFY_TF_THREADS, placement=placement)
    else:
        raise KeyError(name)
    if cfg.faults.poison_stage == name and cfg.faults.poison_doc_ids:
        stage = PoisonedStage(stage, cfg.faults.poison_doc_ids)
    return stage
