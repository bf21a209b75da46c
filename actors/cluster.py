"""Starting or joining Ray, and creating the stage pools on it."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from docintel.actors.resources import actor_options, check_layout
from docintel.actors.stages import ACTOR_CLASSES
from docintel.pipeline.config import Config
from docintel.pipeline.dispatch import Dispatcher, Replica
from docintel.pipeline.errors import DocintelError, RunFailed
from docintel.pipeline.layout import GPU_POOL, build_stage, stage_layout

# Environment of every worker: quiet frameworks, no hub access, no tokenizer fork warnings.
WORKER_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "KERAS_BACKEND": "tensorflow",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore::DeprecationWarning",
}


# The embedded Ray is for this machine only. Ray binds its services (GCS, raylet, workers,
# agents) to the node's IP; this switch, which Ray reads when it picks that IP, makes it
# the loopback address (Ray's own setting for single-machine use on macOS and Windows).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTH_MODE_ENV = "RAY_AUTH_MODE"  # token: every Ray API and internal call needs the token
TOKEN_ENVS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # a token the user chose wins
TOKEN_BYTES = 32  # as `ray get-auth-token --generate` makes it: 64 hex characters


def _private_token_file() -> None:
    """Ray's default token file (~/.ray/auth_token), readable by its owner only.

    Ray writes it with the process umask (usually 0644) when it is missing; we create it
    first with mode 0600, and tighten an existing one we own.
    """
    if any(os.environ.get(name) for name in TOKEN_ENVS):
        return
    path = Path.home() / ".ray" / "auth_token"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
            path.chmod(0o600)
        return
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(TOKEN_BYTES))


@contextlib.contextmanager
def _local_only() -> Iterator[None]:
    """Loopback binding and token auth for the embedded instance, undone afterwards (the
    same process may later join a real cluster, which needs the node's own IP)."""
    from ray._private import ray_constants  # Ray caches the switch when first imported

    saved_env = {k: os.environ.get(k) for k in (LOOPBACK_ENV, AUTH_MODE_ENV)}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOOPBACK_ENV] = "0"  # the raylet, GCS and workers inherit it
    # Unset, a new local Ray turns token auth on itself (Ray >= 2.59) and refreshes the
    # setting it cached at import; an inherited RAY_AUTH_MODE=disabled must not opt out.
    os.environ.pop(AUTH_MODE_ENV, None)
    ray_constants.ENABLE_RAY_CLUSTER = False
    _private_token_file()
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def ray_session(cfg: Config) -> Iterator[None]:
    """An embedded local Ray (default) or a connection to ``run.ray_address``.

    The embedded Ray listens on 127.0.0.1 only, with token authentication on and the
    token file private to its owner. If Ray is already initialised in this process (tests,
    notebooks), it is used as is.
    """
    if ray.is_initialized():
        yield
        return
    kwargs: dict[str, Any] = {
        "runtime_env": {"env_vars": WORKER_ENV},
        "logging_level": "WARNING",
        "log_to_driver": True,
    }
    local = not cfg.run.ray_address
    if not local:
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
    with _local_only() if local else contextlib.nullcontext():
        ray.init(**kwargs)
        try:
            yield
        finally:
            ray.shutdown()


def actor_name(run_id: str, replica_key: str) -> str:
    """``docintel:<run id>:<stage>/<pool>/<index>``, unique per run on a cluster."""
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
    for stage, layout in stage_layout(cfg).items():
        cls = ray.remote(ACTOR_CLASSES[stage])
        pools[stage] = []
        for pool in layout:
            delay = cfg.faults.gpu_delay_s if pool.kind == GPU_POOL else 0.0
            for i in range(pool.replicas):
                rep = Replica(stage, i, pool.kind, pool.max_in_flight)
                opts = actor_options(pool, actor_name(run_id, rep.key))
                actors[rep.key] = cls.options(**opts).remote(build_stage(cfg, pool), delay)
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
