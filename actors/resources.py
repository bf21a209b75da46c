"""The one place that turns resources (data: docintel.pipeline.run.layout.Pool) into Ray options,
and the driver's check that a layout fits the cluster."""

from __future__ import annotations

from typing import Any

from docintel.pipeline.config import Config
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.run.layout import GPU_POOL, ClusterShape, Pool, unplaceable

# Ray restarts a dead stage actor (killed, OOM) this many times and re-runs the calls it
# had in flight, so a crash costs a reload, not the run. Beyond that the executor retries
# the batch from its read, then fails the run.
MAX_RESTARTS = 3
MAX_TASK_RETRIES = 3


def actor_options(pool: Pool, name: str) -> dict[str, Any]:
    return {
        "name": name,  # findable with ray.get_actor (operators, fault tests)
        "num_cpus": pool.cpus,
        "num_gpus": pool.gpu_fraction,
        "max_restarts": MAX_RESTARTS,
        "max_task_retries": MAX_TASK_RETRIES,
        "max_concurrency": 1,  # a model runs one batch at a time; queued calls wait in Ray
    }


def task_options(cpus: float, num_returns: int = 1) -> dict[str, Any]:
    return {"num_cpus": cpus, "num_returns": num_returns, "max_retries": MAX_TASK_RETRIES}


def check_layout(cfg: Config, layout: dict[str, list[Pool]], shape: ClusterShape) -> None:
    """Refuse, on the driver, a layout that cannot make progress on this cluster.

    Actors hold their CPUs for the whole run; read and write tasks need ``io_cpus`` on top,
    or they never schedule and the run hangs (ray#44687). GPU replicas need their
    fractions of the cluster's GPUs (logical GPUs count: ``--gpus N``). Then each replica
    must fit whole on one node (a replica Ray can never place would wait forever).
    """
    pools = [(s, r) for s, rs in layout.items() for r in rs]
    gpus = sum(r.gpu_fraction * r.replicas for _, r in pools if r.kind == GPU_POOL)
    if gpus > shape.gpus + 1e-9:
        detail = ", ".join(
            f"{s} {r.replicas}x{r.gpu_fraction:g}" for s, r in pools if r.kind == GPU_POOL
        )
        raise ConfigError(
            f"the GPU replicas need {gpus:g} GPUs ({detail}) but the Ray cluster has "
            f"{shape.gpus:g}: lower [resources.<stage>] gpu_replicas or gpu_fraction, "
            "declare logical GPUs with --gpus N, or run with --spill cpu-only"
        )
    held = sum(r.cpus * r.replicas for _, r in pools)
    need = held + cfg.resources.io_cpus
    if need > shape.cpus + 1e-9:
        detail = ", ".join(f"{s} {r.replicas}x{r.cpus:g}" for s, r in pools if r.cpus)
        raise ConfigError(
            f"the stage pools hold {held:g} CPUs ({detail}) and read/write tasks need "
            f"{cfg.resources.io_cpus:g} more, but the Ray cluster has {shape.cpus:g} CPUs: "
            "lower [resources.<stage>] cpus or replicas, or give Ray more CPUs (--num-cpus)"
        )
    why = unplaceable(cfg, layout, shape)
    if why:
        raise ConfigError(why)
