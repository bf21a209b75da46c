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

import math
import os
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from docintel.pipeline import registry
from docintel.pipeline.config import AUTO, EMBED_REPLICAS_PER_LIGHT_REPLICA, Config, PoolConfig
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.stages import Stage
from docintel.pipeline.stages.faults import wrap

PoolKind = Literal["gpu", "cpu"]
GPU_POOL: PoolKind = "gpu"
CPU_POOL: PoolKind = "cpu"
# What a pool's replicas compute in. GPU replicas run half precision on CUDA (fp16/bf16 by
# the card; fp32 as gpu-sim without CUDA); CPU replicas run fp32 or the int8 artefacts.
Precision = Literal["half", "fp32", "int8"]


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
    cfg: Config,
    shape: ClusterShape,
    specs: registry.Chain,
    gpu: dict[str, int],
    wanted: dict[str, bool],
) -> dict[str, int]:
    """CPU replicas per stage: fixed counts as given; "auto" ones from the CPUs that the
    GPU replicas, the fixed pools and the I/O tasks leave, in rounds of one replica of each
    heavy stage (the encoder; plus one of each light stage every
    EMBED_REPLICAS_PER_LIGHT_REPLICA rounds), each round placed whole on the nodes, until
    one does not fit or every max is reached. A stage whose CPU pool is its only pool gets
    at least one replica."""
    names = [s.name for s in specs]
    heavy = {s.name for s in specs if s.pool.heavy}
    pools = {s: cfg.resources.pool(s) for s in names}
    packer = _Packer(shape, cfg.resources.io_cpus)
    for s in names:  # GPU replicas first: they must sit on GPU nodes
        for _ in range(gpu[s]):
            packer.place(pools[s].gpu_cpus, pools[s].gpu_fraction)
    counts = dict.fromkeys(names, 0)
    auto = [s for s in names if wanted[s] and pools[s].replicas == AUTO]
    for s in names:
        if wanted[s] and s not in auto:
            counts[s] = int(pools[s].replicas)
            for _ in range(counts[s]):
                packer.place(pools[s].cpus, 0.0)
    _grow_auto(packer, pools, auto, heavy, counts)
    for s in auto:
        counts[s] = max(counts[s], pools[s].min_replicas, 0 if gpu[s] else 1)
    return counts


def _grow_auto(
    packer: _Packer,
    pools: dict[str, PoolConfig],
    auto: list[str],
    heavy: set[str],
    counts: dict[str, int],
) -> None:
    """Add auto replicas round by round while a whole round fits (see _cpu_replicas)."""

    def room(s: str) -> bool:
        return not pools[s].max_replicas or counts[s] < pools[s].max_replicas

    heavy_auto = [s for s in auto if s in heavy]
    rounds = 0
    while auto:
        light = rounds % EMBED_REPLICAS_PER_LIGHT_REPLICA == 0
        step = [s for s in auto if (s in heavy or light or not heavy_auto) and room(s)]
        if not step or any(s not in step for s in heavy_auto):
            break
        trial = packer.copy()
        if not all(trial.place(pools[s].cpus, 0.0) for s in step):
            break
        packer.cpus, packer.gpus = trial.cpus, trial.gpus
        for s in step:
            counts[s] += 1
        rounds += 1
        if not heavy_auto:
            break  # no auto heavy pool to follow: the light pools get one replica each


def _cpu_precision(cfg: Config, spec: registry.StageSpec, has_gpu_pool: bool) -> Precision:
    """``[embed] cpu_precision`` for every stage with an int8 backend: int8/fp32 force it;
    auto picks int8 where the CPU replicas are a spill pool (spill auto and the stage has
    GPU replicas)."""
    if not spec.int8:
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


def check_declared_gpus(cfg: Config, found: int | None = None) -> None:
    """``--gpus N`` on a machine with CUDA GPUs: at most as many as it has (logical GPUs
    are for machines without any, where replicas run on the CPU as gpu-sim). ``found``:
    the cards detect_gpus() found, when the caller already asked."""
    if cfg.run.ray_address or cfg.run.num_gpus == AUTO:
        return
    found = detect_gpus() if found is None else found
    if found and int(cfg.run.num_gpus) > found:
        raise ConfigError(
            f"--gpus {cfg.run.num_gpus} asks for more GPUs than this machine has ({found}); "
            f"give at most {found}, or leave it out to use every GPU"
        )


def expected_shape(cfg: Config, gpus: int | None = None) -> ClusterShape | None:
    """The embedded local Ray's shape before it starts; None for a cluster joined by
    address (known only once connected). ``gpus``: the cards detect_gpus() found, when the
    caller already asked (it starts nvidia-smi)."""
    if cfg.run.ray_address:
        return None
    cpus = cfg.run.num_cpus or os.cpu_count() or 1
    if cfg.run.num_gpus != AUTO:
        return ClusterShape.of(cpus, int(cfg.run.num_gpus))
    return ClusterShape.of(cpus, detect_gpus() if gpus is None else gpus)


def stage_layout(
    cfg: Config,
    shape: ClusterShape | None = None,
    specs: registry.Chain | None = None,
) -> dict[str, list[Pool]]:
    """Per stage of the chain (``specs``: the plan's; default: resolved from ``cfg``), in
    order, the pools the spill mode starts, sized to ``shape`` (default: the embedded
    Ray's expected shape): GPU first (dispatch order), then CPU."""
    shape = shape or expected_shape(cfg) or ClusterShape.of(os.cpu_count() or 1)
    specs = registry.resolve(cfg, specs)
    spill = cfg.run.spill
    pools = {s.name: cfg.resources.pool(s.name) for s in specs}
    gpu = {n: 0 if spill == "cpu-only" else _gpu_replicas(p, shape) for n, p in pools.items()}
    wanted_cpu = {  # a CPU-only stage (gpu_replicas 0: language, parse) always has one
        n: spill in ("auto", "cpu-only") or (spill == "off" and not gpu[n])
        or pools[n].gpu_replicas == 0
        for n in pools
    }  # fmt: skip
    cpu = _cpu_replicas(cfg, shape, specs, gpu, wanted_cpu)
    layout = {}
    for spec in specs:
        s, p = spec.name, pools[spec.name]
        g = Pool(s, GPU_POOL, gpu[s], p.gpu_cpus, p.gpu_fraction, p.max_in_flight, "half")
        c = Pool(
            s, CPU_POOL, cpu[s] if wanted_cpu[s] else 0, p.cpus, 0.0, p.max_in_flight,
            _cpu_precision(cfg, spec, gpu[s] > 0),
        )  # fmt: skip
        chosen = [x for x in (g, c) if x.replicas > 0]
        if not chosen:
            raise _no_pool(s, spill, shape)
        layout[s] = chosen
    return _fit_light(cfg, layout, shape, specs)


# A light stage's CPU replica holds no less than this when pools are squeezed onto a
# small machine (Ray's CPUs are a scheduling share; a rule-based stage uses little).
MIN_LIGHT_CPUS = 0.05


def _fit_light(
    cfg: Config, layout: dict[str, list[Pool]], shape: ClusterShape, specs: registry.Chain
) -> dict[str, list[Pool]]:
    """The layout with the light stages' CPU replicas holding less than their default
    share when every pool at its defaults would not fit the cluster's CPUs (a 2-core
    machine running five stages: parse or redaction or watch lists beside the three).
    Only stages whose ``cpus`` is the declared default shrink, all by one factor, never
    under MIN_LIGHT_CPUS; if that is not enough the layout stays as it was (refused with
    its sizes when the run starts)."""
    held = sum(p.cpus * p.replicas for ps in layout.values() for p in ps)
    over = held + cfg.resources.io_cpus - shape.cpus
    light = [
        p for s in specs if not s.pool.heavy for p in layout[s.name]
        if p.kind == CPU_POOL and p.cpus == s.pool.cpus
    ]  # fmt: skip
    light_cpus = sum(p.cpus * p.replicas for p in light)
    if over <= 1e-9 or not light_cpus:
        return layout
    factor = (light_cpus - over) / light_cpus
    if any(p.cpus * factor < MIN_LIGHT_CPUS for p in light):
        return layout
    shrink = {id(p) for p in light}
    return {
        s: [replace(p, cpus=math.floor(p.cpus * factor * 1000) / 1000) if id(p) in shrink
            else p for p in ps]
        for s, ps in layout.items()
    }  # fmt: skip


def _no_pool(stage: str, spill: str, shape: ClusterShape) -> ConfigError:
    what = {"gpu-only": "GPU replicas", "cpu-only": "CPU replicas"}.get(spill, "replicas")
    key = "gpu_replicas" if spill == "gpu-only" else "replicas"
    hint = ""
    if spill == "gpu-only" and not shape.gpus:
        hint = " (the cluster has no GPU; --gpus N declares N logical ones)"
    return ConfigError(
        f"stage {stage!r} has no {what} under spill mode {spill!r}{hint}: set "
        f"[resources.{stage}] {key} to at least 1, or choose another --spill mode"
    )


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


def artefacts(chain: registry.Chain, layout: dict[str, list[Pool]]) -> list[registry.Artefact]:
    """Every derived model the replicas of ``layout`` load (each once)."""
    out: dict[Path, registry.Artefact] = {}
    for pools in layout.values():
        for pool in pools:
            for a in chain.artefacts(pool):
                out.setdefault(a.path, a)
    return list(out.values())


def int8_stages(layout: dict[str, list[Pool]]) -> list[str]:
    """Stages with a pool that runs int8 artefacts (they must exist before the run)."""
    return [s for s, pools in layout.items() if any(p.precision == "int8" for p in pools)]


def build_stage(chain: registry.Chain, pool: Pool) -> Stage:
    """The stage object one replica of ``pool`` holds (config only: the model loads in the
    replica's ``setup()``), as the plan's resolved chain builds it for the pool's backend,
    with the ``[faults]`` that apply to it (tests and benchmarks only)."""
    spec, cfg = chain.spec(pool.stage), chain.cfg
    modelled = spec.has_weights or cfg.faults.gpu_model_rule_based
    return wrap(chain.build(pool), cfg, pool.kind, spec.placeholder if modelled else None)
