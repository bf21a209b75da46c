"""Which pools and precisions run, per stage: the one place that decides it.

Two words that must not be confused:

* the **pool** a replica belongs to: :data:`GPU_POOL` (holds a fraction of a GPU) or
  :data:`CPU_POOL`; the dispatcher routes batches between pools (GPU first, spill to CPU);
* the **backend** label a stage writes on every row it computed (``gpu-fp16``,
  ``gpu-sim``, ``cpu-int8``, ``cpu-fp32``..., :mod:`docintel.pipeline.schema`): how the result was
  computed. A GPU-pool replica without CUDA writes ``gpu-sim``; a CPU-pool replica of a
  model stage writes ``cpu-int8`` or ``cpu-fp32`` by its :class:`Precision`.

:func:`stage_layout` reads the config once (spill mode, replicas, ``[embed]
cpu_precision``) and returns plain data; :func:`build_stage` turns one pool of it into the
stage object its replicas hold; :func:`int8_stages` says which stages need int8 artefacts.
Nothing here imports Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from docintel.pipeline.config import Config, PoolConfig
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.schema import STAGES
from docintel.pipeline.stages import Stage
from docintel.pipeline.stages.base import Placement
from docintel.pipeline.stages.classify import Classifier, Int8Classifier
from docintel.pipeline.stages.embed import Embedder
from docintel.pipeline.stages.embed_int8 import Int8Embedder, OnnxEmbedder
from docintel.pipeline.stages.faults import PoisonedStage
from docintel.pipeline.stages.sentencize import Sentencizer

PoolKind = Literal["gpu", "cpu"]
GPU_POOL: PoolKind = "gpu"
CPU_POOL: PoolKind = "cpu"
# What a pool's replicas compute in. GPU replicas run half precision on CUDA (fp16/bf16 by
# the card; fp32 as gpu-sim without CUDA); CPU replicas run fp32 or the int8 artefacts.
Precision = Literal["half", "fp32", "int8"]

# Stages whose CPU replicas have an int8 model (`docintel quantize` builds both); the
# rule-based sentencizer has no weights to quantize.
INT8_STAGES = ("embed", "classify")
# A small MLP gains nothing from intra-op parallelism; one thread (TF, or ORT for the
# int8 copy) leaves cores to the encoder running beside it.
CLASSIFY_THREADS = 1


@dataclass(frozen=True)
class Pool:
    """One pool of one stage: how many replicas, what each holds, what it computes in."""

    stage: str
    kind: PoolKind
    replicas: int
    cpus: float  # CPUs held by each replica
    gpu_fraction: float  # of one GPU, per replica (0 for CPU pools)
    max_in_flight: int  # calls queued per replica
    precision: Precision


def _cpu_precision(cfg: Config, stage: str, pool: PoolConfig) -> Precision:
    """``[embed] cpu_precision`` for both model stages: int8/fp32 force it; auto picks int8
    where the CPU replicas are a spill pool (spill auto and the stage has GPU replicas)."""
    if stage not in INT8_STAGES:
        return "fp32"
    chosen = cfg.embed.cpu_precision
    if chosen != "auto":
        return chosen
    return "int8" if cfg.run.spill == "auto" and pool.gpu_replicas > 0 else "fp32"


def _stage_pools(cfg: Config, stage: str) -> list[Pool]:
    pool: PoolConfig = getattr(cfg.resources, stage)
    spill = cfg.run.spill
    gpu = Pool(
        stage, GPU_POOL, pool.gpu_replicas, pool.gpu_cpus, pool.gpu_fraction,
        pool.max_in_flight, "half",
    )  # fmt: skip
    cpu = Pool(
        stage, CPU_POOL, pool.replicas, pool.cpus, 0.0, pool.max_in_flight,
        _cpu_precision(cfg, stage, pool),
    )  # fmt: skip
    wanted = {
        "auto": [gpu, cpu],
        "gpu-only": [gpu],
        "cpu-only": [cpu],
        "off": [gpu] if pool.gpu_replicas else [cpu],
    }[spill]
    pools = [p for p in wanted if p.replicas > 0]
    if not pools:
        what = {"gpu-only": "GPU replicas", "cpu-only": "CPU replicas"}.get(spill, "replicas")
        key = "gpu_replicas" if spill == "gpu-only" else "replicas"
        raise ConfigError(
            f"stage {stage!r} has no {what} under spill mode {spill!r}: set "
            f"[resources.{stage}] {key} to at least 1, or choose another --spill mode"
        )
    return pools


def stage_layout(cfg: Config) -> dict[str, list[Pool]]:
    """Per stage, the pools the spill mode starts: GPU first (dispatch order), then CPU."""
    return {stage: _stage_pools(cfg, stage) for stage in STAGES}


def _onnx_fp32(cfg: Config, pool: Pool) -> bool:
    return pool.kind == CPU_POOL and pool.precision == "fp32" and cfg.embed.cpu_runtime == "onnx"


def onnx_fp32_needed(cfg: Config, layout: dict[str, list[Pool]]) -> bool:
    """Whether an embed pool runs the fused fp32 ONNX encoder (it must exist first)."""
    return any(_onnx_fp32(cfg, p) for p in layout.get("embed", []))


def int8_stages(layout: dict[str, list[Pool]]) -> list[str]:
    """Stages with a pool that runs int8 artefacts (they must exist before the run)."""
    return [s for s, pools in layout.items() if any(p.precision == "int8" for p in pools)]


def build_stage(cfg: Config, pool: Pool) -> Stage:
    """The stage object one replica of ``pool`` holds (config only: the model loads in the
    replica's ``setup()``). GPU replicas cap their framework at the pool's fraction."""
    stage: Stage
    placement = Placement(pool.kind, pool.gpu_fraction)
    int8 = pool.precision == "int8"
    if pool.stage == "sentencize":
        stage = Sentencizer(cfg.sentencize, placement)
    elif pool.stage == "embed" and int8:
        stage = Int8Embedder(cfg.embed, cfg.embed.resolved_int8_dir(), replicas=pool.replicas)
    elif pool.stage == "embed" and _onnx_fp32(cfg, pool):
        stage = OnnxEmbedder(cfg.embed, cfg.embed.resolved_int8_dir(), replicas=pool.replicas)
    elif pool.stage == "embed":
        stage = Embedder(cfg.embed, replicas=pool.replicas, placement=placement)
    elif pool.stage == "classify" and int8:
        stage = Int8Classifier(cfg.classify, cfg.embed.resolved_int8_dir(), CLASSIFY_THREADS)
    elif pool.stage == "classify":
        stage = Classifier(cfg.classify, threads=CLASSIFY_THREADS, placement=placement)
    else:
        raise KeyError(pool.stage)
    if cfg.faults.poison_stage == pool.stage and cfg.faults.poison_doc_ids:
        stage = PoisonedStage(stage, cfg.faults.poison_doc_ids)
    return stage


def chain_stages(cfg: Config) -> list[Stage]:
    """One stage object per stage, in order, for the driver's column-chain check."""
    return [build_stage(cfg, stage_layout(cfg)[s][0]) for s in STAGES]
