"""The embedded local Ray's failures, made plain: a start that times out, a cluster lost
under a run, and Ray's own notices kept off a quiet terminal.

* A start that times out (a loaded machine: Ray waits a fixed time for its GCS and raylet)
  is :class:`RayStartTimedOut`, with a retry hint; what the failed start left running is
  ended.
* A run watches its embedded Ray's GCS process (:class:`GcsWatch`). When it ends under the
  run (`ray stop` from another shell, a kill, the OOM killer), Ray's driver would go on
  silently for a minute and then end the process with exit code 1 and no word. Instead the
  main thread is interrupted at once and the run unwinds as :class:`ClusterLost` (the
  committed batches kept, the output's lease released); the command line says what
  happened and how to resume. A run stuck in a Ray call that cannot return is ended by the
  watch itself LOST_GRACE_S later, with the same words (:func:`on_lost`).
* Quiet runs: the raylet's notices that Ray's driver prints on stdout in colour (a task of
  a killed actor retried, a worker that died: every Ctrl-C printed some) go to descriptor
  2, which quiet commands point at the framework log (jobs/ui.py), not to the terminal.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import ray

from docintel.pipeline.errors import RunFailed

GCS_PROCESS = "gcs_server"  # the GCS binary's name: the embedded Ray's head process
LOST_POLL_S = 0.5  # how often a run looks at its embedded Ray's GCS process
# Ray's driver ends the process 60 s after its GCS is gone (gcs_rpc_server_reconnect_
# timeout_s); a run that has not unwound this long after the loss is ended by the watch.
LOST_GRACE_S = 20.0
LOST = (
    "the local Ray cluster of this run stopped under it (its GCS process ended: `ray stop` "
    "from another shell, a kill, or the machine ran out of memory)"
)


class LocalRayFailed(RunFailed):
    """The embedded Ray failed under a run (exit code 1); committed batches are kept."""


class ClusterLost(LocalRayFailed):
    """The embedded Ray's GCS process ended while a run used it."""


class RayStartTimedOut(LocalRayFailed):
    """The embedded Ray did not start in the time Ray gives its services."""


def _ours(before: frozenset[int] = frozenset()) -> list[psutil.Process]:
    """This driver's descendants (the embedded Ray's processes), less ``before``."""
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in before]


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()


def start(kwargs: dict[str, Any]) -> None:
    """``ray.init(**kwargs)`` for the embedded Ray. A start that fails ends what it left
    running (Ray leaves its GCS behind); one that timed out is RayStartTimedOut."""
    before = frozenset(p.pid for p in _ours())
    try:
        ray.init(**kwargs)
    except Exception as e:  # Ray's start raises RuntimeError, TimeoutError or Exception
        _kill(_ours(before))
        with contextlib.suppress(Exception):
            ray.shutdown()
        if isinstance(e, TimeoutError) or "timed out" in str(e).lower():
            raise RayStartTimedOut(
                f"the local Ray cluster did not start in time (Ray: {e}). The machine may "
                "be busy: retry the command, or give Ray fewer CPUs (--num-cpus)"
            ) from e
        raise


# What to say when the watch must end the process itself (the command line's words).
_last_words: list[Callable[[ClusterLost], None]] = []


@contextlib.contextmanager
def on_lost(say: Callable[[ClusterLost], None]) -> Iterator[None]:
    """While inside: ``say`` is what a run prints if its embedded Ray is lost and the run
    cannot unwind (the process then exits with code 1 right after)."""
    _last_words.append(say)
    try:
        yield
    finally:
        _last_words.remove(say)


class GcsWatch:
    """A daemon thread that watches the embedded Ray's GCS process (see the module)."""

    def __init__(self, gcs: psutil.Process) -> None:
        self.gcs = gcs
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="docintel-gcs-watch", daemon=True)

    @classmethod
    def start(cls) -> GcsWatch | None:
        """Watching the GCS this driver started; None if it is not found among its
        processes (a Ray of another kind: nothing to watch)."""
        gcs = next((p for p in _ours() if _name(p) == GCS_PROCESS), None)
        if gcs is None:
            return None
        watch = cls(gcs)
        watch._thread.start()
        return watch

    def stop(self) -> None:
        """Stop watching (before the run's own shutdown ends the GCS)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _alive(self) -> bool:
        try:
            return self.gcs.is_running() and self.gcs.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _run(self) -> None:
        while not self._stop.wait(LOST_POLL_S):
            if self._alive():
                continue
            self.lost.set()
            _thread.interrupt_main()  # the run unwinds: ClusterLost (cluster.ray_session)
            if not self._stop.wait(LOST_GRACE_S):
                _end_lost_run()
            return


def _name(p: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return p.name()
    return ""


def _end_lost_run() -> None:
    """The run did not unwind (stuck in a Ray call): end the embedded Ray's processes,
    say what happened, exit with code 1."""
    _kill(_ours())
    err = ClusterLost(LOST)
    try:
        for say in _last_words:
            say(err)
        if not _last_words:
            print(f"docintel: run failed: {err}", file=sys.stderr, flush=True)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(1)


def end_processes() -> None:
    """End the embedded Ray's remaining processes (after its GCS was lost: Ray's own
    shutdown would wait on the GCS for each of them)."""
    _kill(_ours())


@contextlib.contextmanager
def quiet_notices() -> Iterator[None]:
    """The raylet's notices Ray's driver prints on stdout go to descriptor 2 instead (the
    framework log, in a quiet command). Ray's printer is private; Ray is pinned."""
    from ray._private import worker

    printer = worker.print_to_stdstream

    def to_descriptor_2(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":
            printer(data, ignore_prefix)
            return
        with contextlib.suppress(OSError), os.fdopen(os.dup(2), "w") as log:
            worker.print_worker_logs(data, log, ignore_prefix)

    worker.print_to_stdstream = to_descriptor_2
    try:
        yield
    finally:
        worker.print_to_stdstream = printer
