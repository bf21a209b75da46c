"""Resources as data, and the one place that turns them into Ray options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.config import Config, PoolConfig
from pipeline.errors import ConfigError

# Ray restarts a dead stage actor (killed, OOM) this many times and re-runs the calls it
# had in flight, so a crash costs a reload, not the run. Beyond that the executor retries
# the batch from its read, then fails the run.
MAX_RESTARTS = 3
MAX_TASK_RETRIES = 3


@dataclass(frozen=True)
class Resources:
    """What one replica of a stage pool holds, and how many calls it may queue."""

    kind: str  # "gpu" or "cpu": the pool it belongs to
    cpus: float
    replicas: int = 1
    max_in_flight: int = 2
    gpu_fraction: float = 0.0


def _pools(stage: str, pool: PoolConfig, spill: str) -> list[Resources]:
    gpu = Resources("gpu", pool.gpu_cpus, pool.gpu_replicas, pool.max_in_flight, pool.gpu_fraction)
    cpu = Resources("cpu", pool.cpus, pool.replicas, pool.max_in_flight)
    wanted = {
        "auto": [gpu, cpu],
        "gpu-only": [gpu],
        "cpu-only": [cpu],
        "off": [gpu] if pool.gpu_replicas else [cpu],
    }[spill]
    pools = [r for r in wanted if r.replicas > 0]
    if not pools:
        what = {"gpu-only": "GPU replicas", "cpu-only": "CPU replicas"}.get(spill, "replicas")
        raise ConfigError(
            f"stage {stage!r} has no {what} under spill mode {spill!r}: set "
            f"[resources.{stage}] {'gpu_replicas' if spill == 'gpu-only' else 'replicas'} "
            "to at least 1, or choose another --spill mode"
        )
    return pools


def stage_resources(cfg: Config) -> dict[str, list[Resources]]:
    """Per stage, the pools the spill mode starts: GPU first (dispatch order), then CPU."""
    r = cfg.resources
    spill = cfg.run.spill
    return {
        "sentencize": _pools("sentencize", r.sentencize, spill),
        "embed": _pools("embed", r.embed, spill),
        "classify": _pools("classify", r.classify, spill),
    }


def actor_options(res: Resources, name: str) -> dict[str, Any]:
    return {
        "name": name,  # findable with ray.get_actor (operators, fault tests)
        "num_cpus": res.cpus,
        "num_gpus": res.gpu_fraction,
        "max_restarts": MAX_RESTARTS,
        "max_task_retries": MAX_TASK_RETRIES,
        "max_concurrency": 1,  # a model runs one batch at a time; queued calls wait in Ray
    }


def task_options(cpus: float, num_returns: int = 1) -> dict[str, Any]:
    return {"num_cpus": cpus, "num_returns": num_returns, "max_retries": MAX_TASK_RETRIES}


def check_layout(cfg: Config, cluster_cpus: float, cluster_gpus: float = 0.0) -> None:
    """Refuse, on the driver, a layout that cannot make progress on this cluster.

    Actors hold their CPUs for the whole run; read and write tasks need ``io_cpus`` on top,
    or they never schedule and the run hangs (ray#44687). GPU replicas need their
    fractions of the cluster's GPUs (logical GPUs count: ``--gpus N``).
    """
    res = stage_resources(cfg)
    pools = [(s, r) for s, rs in res.items() for r in rs]
    held = sum(r.cpus * r.replicas for _, r in pools)
    need = held + cfg.resources.io_cpus
    if need > cluster_cpus + 1e-9:
        detail = ", ".join(f"{s} {r.replicas}x{r.cpus:g}" for s, r in pools if r.cpus)
        raise ConfigError(
            f"the stage pools hold {held:g} CPUs ({detail}) and read/write tasks need "
            f"{cfg.resources.io_cpus:g} more, but the Ray cluster has {cluster_cpus:g} CPUs: "
            "lower [resources.<stage>] cpus or replicas, or give Ray more CPUs (--num-cpus)"
        )
    gpus = sum(r.gpu_fraction * r.replicas for _, r in pools if r.kind == "gpu")
    if gpus > cluster_gpus + 1e-9:
        detail = ", ".join(
            f"{s} {r.replicas}x{r.gpu_fraction:g}" for s, r in pools if r.kind == "gpu"
        )
        raise ConfigError(
            f"the GPU replicas need {gpus:g} GPUs ({detail}) but the Ray cluster has "
            f"{cluster_gpus:g}: lower [resources.<stage>] gpu_replicas or gpu_fraction, "
            "declare logical GPUs with --gpus N, or run with --spill cpu-only"
        )
