"""Starting or joining Ray, and creating the stage pools on it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import ray

from actors.resources import actor_options, check_layout, stage_resources
from actors.stages import ACTOR_CLASSES, build_stage
from pipeline.config import Config
from pipeline.dispatch import Dispatcher, Replica
from pipeline.errors import DocintelError, RunFailed

# Environment of every worker: quiet frameworks, no hub access, no tokenizer fork warnings.
WORKER_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "KERAS_BACKEND": "tensorflow",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore::DeprecationWarning",
}


@contextlib.contextmanager
def ray_session(cfg: Config) -> Iterator[None]:
    """An embedded local Ray (default) or a connection to ``run.ray_address``.

    If Ray is already initialised in this process (tests, notebooks), it is used as is.
    """
    if ray.is_initialized():
        yield
        return
    kwargs: dict[str, Any] = {
        "runtime_env": {"env_vars": WORKER_ENV},
        "logging_level": "WARNING",
        "log_to_driver": True,
    }
    if cfg.run.ray_address:
        kwargs["address"] = cfg.run.ray_address
    else:
        kwargs.update(
            address="local",  # always a new embedded instance, never a stale or other cluster
            num_cpus=cfg.run.num_cpus or os.cpu_count(),
            num_gpus=cfg.run.num_gpus,
            include_dashboard=False,
        )
        if cfg.run.object_store_mb:
            kwargs["object_store_memory"] = cfg.run.object_store_mb * 1024 * 1024
    ray.init(**kwargs)
    try:
        yield
    finally:
        ray.shutdown()


def actor_name(run_id: str, replica_key: str) -> str:
    """``docintel:<run id>:<stage>/<backend>/<index>``, unique per run on a cluster."""
    return f"docintel:{run_id}:{replica_key}"


@contextlib.contextmanager
def stage_pools(
    cfg: Config,
    run_id: str,
) -> Iterator[tuple[dict[str, Any], Dispatcher, dict[str, dict[str, Any]]]]:
    """Start every stage replica, wait until each has loaded its model, kill them after.

    Yields the actor handles by replica key, the dispatcher over them, and per stage the
    backend and model version its replicas report.
    """
    cluster = ray.cluster_resources()
    check_layout(cfg, cluster.get("CPU", 0.0), cluster.get("GPU", 0.0))
    actors: dict[str, Any] = {}
    pools: dict[str, list[Replica]] = {}
    for stage, stage_pools_ in stage_resources(cfg).items():
        cls = ray.remote(ACTOR_CLASSES[stage])
        pools[stage] = []
        for res in stage_pools_:
            delay = cfg.faults.gpu_delay_s if res.kind == "gpu" else 0.0
            for i in range(res.replicas):
                rep = Replica(stage, i, res.kind, res.max_in_flight)
                opts = actor_options(res, actor_name(run_id, rep.key))
                stage_obj = build_stage(stage, cfg, res.kind, res.gpu_fraction)
                actors[rep.key] = cls.options(**opts).remote(stage_obj, delay)
                pools[stage].append(rep)
    keys = list(actors)
    try:
        try:
            infos = ray.get([actors[k].ready.remote() for k in keys])
        except ray.exceptions.RayTaskError as e:
            cause = e.cause
            if isinstance(cause, DocintelError):
                raise cause from None
            raise RunFailed(f"a stage actor failed to start: {cause!r}") from e
        stage_info: dict[str, dict[str, Any]] = {}
        for key, info in zip(keys, infos, strict=True):
            entry = stage_info.setdefault(key.split("/")[0], {**info, "backends": []})
            entry["backends"].append(info["backend"])
        yield actors, Dispatcher(pools), stage_info
    finally:
        for handle in actors.values():  # free their CPUs for the next run on this cluster
            ray.kill(handle)
