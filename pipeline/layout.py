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

import os
import subprocess
from dataclasses import dataclass
from typing import Literal

from docintel.pipeline.config import AUTO, EMBED_REPLICAS_PER_LIGHT_REPLICA, Config, PoolConfig
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.schema import STAGES
from docintel.pipeline.stages import Stage
from docintel.pipeline.stages.base import Placement
from docintel.pipeline.stages.classify import Classifier, Int8Classifier, OnnxClassifier
from docintel.pipeline.stages.embed import Embedder
from docintel.pipeline.stages.embed_int8 import Int8Embedder, OnnxEmbedder
from docintel.pipeline.stages.faults import MODELLED_STAGES, ModelledStage, PoisonedStage
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


@dataclass(frozen=True)
class NodeShape:
    """What one Ray node offers the pools: CPUs and GPUs (logical ones count)."""

    cpus: float
    gpus: float = 0.0
    node_id: str = ""


@dataclass(frozen=True)
class ClusterShape:
    nodes: tuple[NodeShape, ...]

    @classmethod
    def of(cls, cpus: float, gpus: float = 0.0) -> ClusterShape:
        """One node (the embedded local Ray)."""
        return cls((NodeShape(cpus, gpus),))

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    @property
    def gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)

    def describe(self) -> str:
        def node(n: NodeShape) -> str:
            return f"{n.cpus:g} CPUs" + (f" + {n.gpus:g} GPUs" if n.gpus else "")

        if len(self.nodes) == 1:
            return node(self.nodes[0])
        return f"{len(self.nodes)} nodes ({'; '.join(node(n) for n in self.nodes)})"


class _Packer:
    """First-fit placement of replicas on nodes, as Ray has to place them (each replica
    whole on one node); CPU-only replicas go to CPU-only nodes first."""

    def __init__(self, shape: ClusterShape, reserve_cpus: float) -> None:
        self.cpus = [n.cpus for n in shape.nodes]
        self.gpus = [n.gpus for n in shape.nodes]
        if self.cpus:  # read/write tasks need this much somewhere while the pools run
            roomiest = max(range(len(self.cpus)), key=self.cpus.__getitem__)
            self.cpus[roomiest] -= reserve_cpus

    def copy(self) -> _Packer:
        other = _Packer(ClusterShape(()), 0.0)
        other.cpus, other.gpus = list(self.cpus), list(self.gpus)
        return other

    def place(self, cpus: float, gpus: float) -> bool:
        nodes = range(len(self.cpus))
        if gpus:
            order = sorted(nodes, key=lambda i: (-self.gpus[i], -self.cpus[i]))
        else:
            order = sorted(nodes, key=lambda i: (self.gpus[i] > 0, -self.cpus[i]))
        for i in order:
            if self.cpus[i] + 1e-9 >= cpus and self.gpus[i] + 1e-9 >= gpus:
                self.cpus[i] -= cpus
                self.gpus[i] -= gpus
                return True
        return False


def _bounded(n: int, low: int, high: int) -> int:
    return max(low, min(n, high) if high else n)


def _gpu_replicas(pool: PoolConfig, shape: ClusterShape) -> int:
    """Fixed, or one per whole GPU of the cluster (each stage gets one per card)."""
    if pool.gpu_replicas != AUTO:
        return int(pool.gpu_replicas)
    per_card = sum(int(n.gpus + 1e-9) for n in shape.nodes)
    return _bounded(per_card, pool.min_gpu_replicas, pool.max_gpu_replicas)


def _cpu_replicas(
    cfg: Config, shape: ClusterShape, gpu: dict[str, int], wanted: dict[str, bool]
) -> dict[str, int]:
    """CPU replicas per stage: fixed counts as given; "auto" ones from the CPUs that the
    GPU replicas, the fixed pools and the I/O tasks leave, in rounds of one embed replica
    (plus one sentencize and one classify replica every EMBED_REPLICAS_PER_LIGHT_REPLICA
    rounds), each round placed whole on the nodes, until one does not fit or every max is
    reached. A stage whose CPU pool is its only pool gets at least one replica."""
    pools = {s: getattr(cfg.resources, s) for s in STAGES}
    packer = _Packer(shape, cfg.resources.io_cpus)
    for s in STAGES:  # GPU replicas first: they must sit on GPU nodes
        for _ in range(gpu[s]):
            packer.place(pools[s].gpu_cpus, pools[s].gpu_fraction)
    counts = dict.fromkeys(STAGES, 0)
    auto = [s for s in STAGES if wanted[s] and pools[s].replicas == AUTO]
    for s in STAGES:
        if wanted[s] and s not in auto:
            counts[s] = int(pools[s].replicas)
            for _ in range(counts[s]):
                packer.place(pools[s].cpus, 0.0)

    def room(s: str) -> bool:
        return not pools[s].max_replicas or counts[s] < pools[s].max_replicas

    rounds = 0
    while auto:
        light = rounds % EMBED_REPLICAS_PER_LIGHT_REPLICA == 0
        step = [s for s in auto if (s == "embed" or light or "embed" not in auto) and room(s)]
        if not step or ("embed" in auto and "embed" not in step):
            break
        trial = packer.copy()
        if not all(trial.place(pools[s].cpus, 0.0) for s in step):
            break
        packer = trial
        for s in step:
            counts[s] += 1
        rounds += 1
        if "embed" not in auto:
            break  # no auto encoder pool to follow: the light pools get one replica each
    for s in auto:
        counts[s] = max(counts[s], pools[s].min_replicas, 0 if gpu[s] else 1)
    return counts


def _cpu_precision(cfg: Config, stage: str, has_gpu_pool: bool) -> Precision:
    """``[embed] cpu_precision`` for both model stages: int8/fp32 force it; auto picks int8
    where the CPU replicas are a spill pool (spill auto and the stage has GPU replicas)."""
    if stage not in INT8_STAGES:
        return "fp32"
    chosen = cfg.embed.cpu_precision
    if chosen != "auto":
        return chosen
    return "int8" if cfg.run.spill == "auto" and has_gpu_pool else "fp32"


def detect_gpus() -> int:
    """NVIDIA GPUs this process may use: the cards ``nvidia-smi -L`` lists (none without
    a driver), narrowed by ``CUDA_VISIBLE_DEVICES`` as Ray narrows them. No Ray, no torch:
    the driver calls this before anything starts."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    cards = sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
        cards = min(cards, len(ids))
    return cards


def check_declared_gpus(cfg: Config) -> None:
    """``--gpus N`` on a machine with CUDA GPUs: at most as many as it has (logical GPUs
    are for machines without any, where replicas run on the CPU as gpu-sim)."""
    if cfg.run.ray_address or cfg.run.num_gpus == AUTO:
        return
    found = detect_gpus()
    if found and int(cfg.run.num_gpus) > found:
        raise ConfigError(
            f"--gpus {cfg.run.num_gpus} asks for more GPUs than this machine has ({found}); "
            f"give at most {found}, or leave it out to use every GPU"
        )


def expected_shape(cfg: Config) -> ClusterShape | None:
    """The embedded local Ray's shape before it starts; None for a cluster joined by
    address (known only once connected)."""
    if cfg.run.ray_address:
        return None
    cpus = cfg.run.num_cpus or os.cpu_count() or 1
    gpus = detect_gpus() if cfg.run.num_gpus == AUTO else int(cfg.run.num_gpus)
    return ClusterShape.of(cpus, gpus)


def stage_layout(cfg: Config, shape: ClusterShape | None = None) -> dict[str, list[Pool]]:
    """Per stage, the pools the spill mode starts, sized to ``shape`` (default: the
    embedded Ray's expected shape): GPU first (dispatch order), then CPU."""
    shape = shape or expected_shape(cfg) or ClusterShape.of(os.cpu_count() or 1)
    spill = cfg.run.spill
    pools = {s: getattr(cfg.resources, s) for s in STAGES}
    gpu = {s: 0 if spill == "cpu-only" else _gpu_replicas(pools[s], shape) for s in STAGES}
    wanted_cpu = {
        s: spill in ("auto", "cpu-only") or (spill == "off" and not gpu[s]) for s in STAGES
    }
    cpu = _cpu_replicas(cfg, shape, gpu, wanted_cpu)
    layout = {}
    for s in STAGES:
        p = pools[s]
        g = Pool(s, GPU_POOL, gpu[s], p.gpu_cpus, p.gpu_fraction, p.max_in_flight, "half")
        c = Pool(
            s, CPU_POOL, cpu[s] if wanted_cpu[s] else 0, p.cpus, 0.0, p.max_in_flight,
            _cpu_precision(cfg, s, gpu[s] > 0),
        )  # fmt: skip
        chosen = [x for x in (g, c) if x.replicas > 0]
        if not chosen:
            what = {"gpu-only": "GPU replicas", "cpu-only": "CPU replicas"}.get(spill, "replicas")
            key = "gpu_replicas" if spill == "gpu-only" else "replicas"
            hint = ""
            if spill == "gpu-only" and not shape.gpus:
                hint = " (the cluster has no GPU; --gpus N declares N logical ones)"
            raise ConfigError(
                f"stage {s!r} has no {what} under spill mode {spill!r}{hint}: set "
                f"[resources.{s}] {key} to at least 1, or choose another --spill mode"
            )
        layout[s] = chosen
    return layout


def unplaceable(cfg: Config, layout: dict[str, list[Pool]], shape: ClusterShape) -> str | None:
    """Why the cluster cannot place every replica of ``layout`` (None: it can). Placed as
    Ray must: each replica whole on one node, the I/O tasks' CPUs kept free, biggest
    first."""
    packer = _Packer(shape, cfg.resources.io_cpus)
    replicas = [(p, i) for pools in layout.values() for p in pools for i in range(p.replicas)]
    replicas.sort(key=lambda r: (-r[0].gpu_fraction, -r[0].cpus))
    for pool, i in replicas:
        if packer.place(pool.cpus, pool.gpu_fraction):
            continue
        gpu = "gpu_" if pool.kind == GPU_POOL else ""
        need = f"{pool.cpus:g} CPUs" + (f" + {pool.gpu_fraction:g} GPU" if gpu else "")
        return (
            f"the cluster cannot place {pool.stage} {pool.kind} replica {i + 1} of "
            f"{pool.replicas} ({need}, beside {cfg.resources.io_cpus:g} CPUs kept for "
            f"read/write tasks): it has {shape.describe()}. Lower [resources.{pool.stage}] "
            f"{gpu}replicas or min_{gpu}replicas, or add nodes"
        )
    return None


def _onnx_fp32(cfg: Config, pool: Pool) -> bool:
    """Whether ``pool`` runs its model's fp32 ONNX copy (CPU fp32 pools of embed and
    classify, unless [embed] / [classify] cpu_runtime says the framework itself)."""
    if pool.kind != CPU_POOL or pool.precision != "fp32":
        return False
    if pool.stage == "embed":
        return cfg.embed.cpu_runtime == "onnx"
    return pool.stage == "classify" and cfg.classify.cpu_runtime == "onnx"


def onnx_fp32_stages(cfg: Config, layout: dict[str, list[Pool]]) -> list[str]:
    """Stages with a pool that runs an fp32 ONNX copy (built before the run if missing)."""
    return [s for s, pools in layout.items() if any(_onnx_fp32(cfg, p) for p in pools)]


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
    elif pool.stage == "classify" and _onnx_fp32(cfg, pool):
        stage = OnnxClassifier(cfg.classify, cfg.embed.resolved_int8_dir(), CLASSIFY_THREADS)
    elif pool.stage == "classify":
        stage = Classifier(cfg.classify, threads=CLASSIFY_THREADS, placement=placement)
    else:
        raise KeyError(pool.stage)
    modelled_s = cfg.faults.gpu_model_s_per_sentence  # benchmarks: no model, a modelled time
    if modelled_s > 0 and pool.kind == GPU_POOL and pool.stage in MODELLED_STAGES:
        stage = ModelledStage(stage, modelled_s, cfg.embed, cfg.classify)
    if cfg.faults.poison_stage == pool.stage and cfg.faults.poison_doc_ids:
        stage = PoisonedStage(stage, cfg.faults.poison_doc_ids)
    return stage


def chain_stages(cfg: Config) -> list[Stage]:
    """One stage object per stage, in order, for the driver's column-chain check."""
    return [build_stage(cfg, stage_layout(cfg)[s][0]) for s in STAGES]
