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

    cpus: float
    replicas: int = 1
    max_in_flight: int = 2
    gpu_fraction: float = 0.0

    @classmethod
    def from_pool(cls, pool: PoolConfig) -> Resources:
        return cls(cpus=pool.cpus, replicas=pool.replicas, max_in_flight=pool.max_in_flight)


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


def stage_resources(cfg: Config) -> dict[str, Resources]:
    r = cfg.resources
    return {
        "sentencize": Resources.from_pool(r.sentencize),
        "embed": Resources.from_pool(r.embed),
        "classify": Resources.from_pool(r.classify),
    }


def check_layout(cfg: Config, cluster_cpus: float) -> None:
    """Refuse, on the driver, a layout that cannot make progress on this cluster.

    Actors hold their CPUs for the whole run; read and write tasks need ``io_cpus`` on top,
    or they never schedule and the run hangs (ray#44687).
    """
    res = stage_resources(cfg)
    held = sum(r.cpus * r.replicas for r in res.values())
    need = held + cfg.resources.io_cpus
    if need > cluster_cpus + 1e-9:
        detail = ", ".join(f"{s} {r.replicas}x{r.cpus:g}" for s, r in res.items())
        raise ConfigError(
            f"the stage pools hold {held:g} CPUs ({detail}) and read/write tasks need "
            f"{cfg.resources.io_cpus:g} more, but the Ray cluster has {cluster_cpus:g} CPUs: "
            "lower [resources.<stage>] cpus or replicas, or give Ray more CPUs (--num-cpus)"
        )
