"""Starting or joining Ray, and creating the stage pools on it."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from docintel.actors import local_ray
from docintel.actors.pools import PoolManager, actor_name, current_shape
from docintel.actors.resources import check_layout
from docintel.pipeline import registry
from docintel.pipeline.config import AUTO, Config
from docintel.pipeline.errors import UsageError
from docintel.pipeline.run.layout import ClusterShape, Pool, stage_layout

__all__ = ["actor_name", "current_shape", "ray_session", "stage_pools"]

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
IDLE_WORKER_KEEP_MS = 600_000  # idle task workers of the embedded Ray live 10 minutes
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


# The embedded Ray's temp folder (session folders: logs, sockets, spilled objects) lies in
# a folder only we can enter. Ray's default, /tmp/ray, and every session folder in it are
# mode 0777 (Ray chmods each folder it makes, so that users can share one machine's
# Ray), with 0644 logs that can hold document text (a worker's traceback quotes its
# batch). Ray chmods the temp folder it is given as well, so the private folder is its
# parent: the temp folder is RAY_TEMP_NAME inside it (``_private_ray_temp``).
RAY_TEMP_NAME = "ray"
# A Unix socket path holds at most 107 bytes on Linux (103 on macOS), and Ray puts its
# sockets at <temp>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store, up to ~66
# bytes after the temp folder; so the temp folder's path stays within this many bytes.
MAX_RAY_TEMP_BYTES = 36
RUNTIME_DIR_ENV = "XDG_RUNTIME_DIR"  # the user's private runtime folder (systemd: 0700)
RAY_TMPDIR_ENV = "RAY_TMPDIR"  # Ray's own setting for where its temp folder goes


def _owned_private_dir(path: Path, *, create: bool) -> bool:
    """Whether ``path`` is a real folder (not a symlink) owned by us and closed to others;
    created 0700 when missing and ``create``; tightened to 0700 when ours but open."""
    if create:
        with contextlib.suppress(FileExistsError, OSError):
            path.mkdir(mode=0o700)
    try:  # opened without following a symlink, then checked and fixed through the handle
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            return False
        if stat.S_IMODE(st.st_mode) & 0o077:
            if not create:
                return False  # someone else's choice of mode (a runtime dir): not ours to fix
            os.fchmod(fd, 0o700)
        return True
    finally:
        os.close(fd)


def _root_candidates() -> list[tuple[Path, Path | None]]:
    """(private folder, base that must itself be private or None), in order of preference:
    under RAY_TMPDIR if set (the user's choice of where Ray's files go), under the
    user's runtime folder ($XDG_RUNTIME_DIR: private, local, emptied at logout), under
    TMPDIR if set, under /tmp."""
    uid = os.getuid()
    out: list[tuple[Path, Path | None]] = []
    if os.environ.get(RAY_TMPDIR_ENV):
        out.append((Path(os.environ[RAY_TMPDIR_ENV]) / f"docintel-{uid}", None))
    runtime = os.environ.get(RUNTIME_DIR_ENV)
    if runtime and Path(runtime).is_absolute():
        out.append((Path(runtime) / "docintel", Path(runtime)))
    if os.environ.get("TMPDIR"):
        out.append((Path(os.environ["TMPDIR"]) / f"docintel-{uid}", None))
    out.append((Path("/tmp") / f"docintel-{uid}", None))
    return out


def _private_ray_temp() -> Path:
    """The embedded Ray's temp folder: ``ray`` in the first candidate folder that is
    short enough for Ray's socket paths and private to us (created 0700, checked: a
    real folder of ours, not a symlink). UsageError if there is none."""
    tried = []
    for root, base in _root_candidates():
        temp = root.absolute() / RAY_TEMP_NAME
        if len(os.fsencode(temp)) > MAX_RAY_TEMP_BYTES:
            tried.append(f"{root} (path too long for Ray's sockets)")
        elif base is not None and not _owned_private_dir(base, create=False):
            tried.append(f"{root} ({base} is not a private folder of ours)")
        elif not _owned_private_dir(root, create=True):
            tried.append(f"{root} (exists but is not a private folder of ours, or cannot be made)")
        else:
            return temp
    raise UsageError(
        "no private folder for the embedded Ray's temp files (logs, sockets, spilled "
        f"objects): tried {'; '.join(tried)}. Set {RAY_TMPDIR_ENV} to a short path of a "
        f"folder you own; docintel uses {RAY_TMPDIR_ENV}/docintel-UID/{RAY_TEMP_NAME}"
    )


def _close_session(temp: Path) -> None:
    """After ``ray.init``: Ray made ``temp`` and this run's session folder 0777; both go
    back to 0700 (their parent already keeps others out; this keeps them out if one is
    moved). The session is the node's own, not ``session_latest``, which a concurrent run
    of the same user may have moved on. Ray's API for it is private; Ray is pinned."""
    session = Path(ray._private.worker.global_worker.node.get_session_dir_path())
    for path in (temp, session):
        if temp in (path, path.parent):  # only what Ray made in our folder
            with contextlib.suppress(OSError):
                path.chmod(0o700)


@contextlib.contextmanager
def _local_only() -> Iterator[None]:
    """Loopback binding and token auth for the embedded instance, and the workers'
    environment, undone afterwards (the same process may later join a real cluster, which
    needs the node's own IP)."""
    from ray._private import ray_constants  # Ray caches the switch when first imported

    saved_env = {k: os.environ.get(k) for k in (LOOPBACK_ENV, AUTH_MODE_ENV, *WORKER_ENV)}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOOPBACK_ENV] = "0"  # the raylet, GCS and workers inherit it
    # The workers' environment by inheritance (raylet -> workers), not as a runtime_env:
    # Ray builds a runtime_env for every worker through its agent, ~1 s more before the
    # stage actors are ready on a 2-core machine (0.7 s -> 1.7-2.1 s for three actors).
    os.environ.update(WORKER_ENV)
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
def ray_session(cfg: Config, shape: ClusterShape | None = None) -> Iterator[None]:
    """An embedded local Ray (default) or a connection to ``run.ray_address``.

    The embedded Ray listens on 127.0.0.1 only, with token authentication on and the
    token file private to its owner. If Ray is already initialised in this process (tests,
    notebooks), it is used as is.
    """
    if ray.is_initialized():
        yield
        return
    # Quiet by default: docintel prints its own progress and summary; Ray's notices and
    # the frameworks' lines from the actors (TensorFlow's oneDNN/absl, tracer warnings) go
    # to Ray's log files unless run.verbose (--verbose): for the embedded Ray, in
    # session_latest/logs of its private temp folder (_private_ray_temp: e.g.
    # $XDG_RUNTIME_DIR/docintel/ray or /tmp/docintel-UID/ray).
    # Errors still reach the driver: a failed call raises there with its traceback.
    verbose = cfg.run.verbose
    kwargs: dict[str, Any] = {
        "logging_level": "WARNING" if verbose else "ERROR",
        "log_to_driver": verbose,
    }
    local = not cfg.run.ray_address
    temp = _private_ray_temp() if local else None
    if not local:
        kwargs["address"] = cfg.run.ray_address
        kwargs["runtime_env"] = {"env_vars": WORKER_ENV}
    else:
        kwargs.update(
            address="local",  # always a new embedded instance, never a stale or other cluster
            _temp_dir=str(temp),  # private (see RAY_TEMP_NAME), never the shared /tmp/ray
            num_cpus=cfg.run.num_cpus or os.cpu_count(),
            # the GPUs prepare() found (it asked nvidia-smi once) or N logical ones
            # (checked in prepare); without a plan's shape, "auto" lets Ray detect them
            num_gpus=_gpus(cfg, shape),
            include_dashboard=False,
            # Read and write tasks reuse idle workers instead of starting a new Python
            # process each: Ray kills idle workers above one per CPU after 1 s, and with
            # the stage actors holding those, most I/O tasks paid a process start (the
            # demo: 30 workers started for 74 tasks; 6 with this). They stay bounded by
            # the I/O tasks that run at once.
            _system_config={"idle_worker_killing_time_threshold_ms": IDLE_WORKER_KEEP_MS},
        )
        if cfg.run.object_store_mb:
            kwargs["object_store_memory"] = cfg.run.object_store_mb * 1024 * 1024
    with _local_only() if local else contextlib.nullcontext():
        if local:
            local_ray.start(kwargs)  # a start that times out: RayStartTimedOut, no traceback
        else:
            ray.init(**kwargs)
        if temp is not None:
            _close_session(temp)
        with _watched(local, verbose):
            yield


@contextlib.contextmanager
def _watched(local: bool, verbose: bool) -> Iterator[None]:
    """The session's body, then Ray's shutdown. The embedded Ray's GCS is watched: lost
    under the run, the run unwinds as ClusterLost (actors/local_ray.py) and what is left of
    that Ray is ended without waiting on its GCS. Quiet: the raylet's notices go to the
    framework log, not the terminal."""
    global _WATCH  # noqa: PLW0603 - one embedded Ray per process
    _WATCH = local_ray.GcsWatch.start() if local else None
    with contextlib.nullcontext() if verbose else local_ray.quiet_notices():
        try:
            yield
        except BaseException as e:
            if _WATCH is not None and _WATCH.lost.is_set():
                raise local_ray.ClusterLost(local_ray.LOST) from e
            raise
        finally:
            lost = _WATCH is not None and _WATCH.lost.is_set()
            if _WATCH is not None:
                _WATCH.stop()  # before the shutdown ends the GCS
            _WATCH = None
            if lost:
                local_ray.end_processes()
            if local:
                _end_autoscaler_monitor()
            ray.shutdown()  # quiet too: the actors' last notices come during it


_WATCH: local_ray.GcsWatch | None = None  # the embedded Ray's watch, while a session runs


def cluster_lost() -> bool:
    """Whether the embedded Ray of the session under way was lost (its GCS ended)."""
    return _WATCH is not None and _WATCH.lost.is_set()


def _gpus(cfg: Config, shape: ClusterShape | None) -> float | None:
    if shape is not None:
        return shape.gpus
    return None if cfg.run.num_gpus == AUTO else cfg.run.num_gpus


MONITOR_SCRIPT = "ray/autoscaler/_private/monitor.py"


def _end_autoscaler_monitor() -> None:
    """End the embedded Ray's autoscaler monitor before ``ray.shutdown()``.

    The embedded instance has no autoscaler to run. Its monitor process answers SIGTERM by
    reporting to the GCS, which ``ray.shutdown()`` has stopped just before, so every run
    waited Ray's full 1 s grace period for it before the kill. Only a process of ours
    (a descendant of this driver) running Ray's monitor script is ended; none found, the
    shutdown is as before.
    """
    import psutil

    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(arg.endswith(MONITOR_SCRIPT) for arg in proc.cmdline()):
                proc.kill()


def _ship_user_stages(chain: registry.Chain) -> None:
    """The modules of user-defined stages travel with the stage objects, pickled by value:
    a ``module:Class`` the driver imports from its own path (a file beside a notebook, a
    folder on PYTHONPATH) then works in every worker, on a cluster too, without installing
    it there. A stage whose module imports other modules of its own still needs those
    installed on the nodes (an image, or ``docintel submit --working-dir``)."""
    for spec in chain:
        if not spec.builtin:
            ray.cloudpickle.register_pickle_by_value(sys.modules[spec.cls.__module__])


@contextlib.contextmanager
def stage_pools(
    chain: registry.Chain,
    run_id: str,
    layout: dict[str, list[Pool]] | None = None,
) -> Iterator[PoolManager]:
    """Start every replica of the plan's stages (``chain``) as ``layout`` says (default:
    sized to the connected cluster) and kill them all after. Replicas join as their models
    load (the run does not wait for all of them first); the manager keeps the pools in
    step with the cluster while the run goes on (actors/pools.py)."""
    shape = current_shape()
    layout = layout or stage_layout(chain.cfg, shape, chain)
    check_layout(chain.cfg, layout, shape)
    _ship_user_stages(chain)
    manager = PoolManager(chain, run_id, layout)
    try:
        manager.start()
        yield manager
    finally:
        if not cluster_lost():  # a lost Ray's actors went with it; killing them would wait
            manager.close()
