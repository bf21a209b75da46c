"""Stage pools that follow the cluster while a run goes on.

At the start, every replica of the layout (pipeline/run/layout.py, sized to the cluster) is
created, and the run begins at once: reads, and the stages whose replicas are ready, go on
while the others load their models (a replica joins the dispatcher when its model has
loaded; one of the starting layout that fails to load fails the run with the stage's own
message). Then, from the executor's loop:

* **Join.** Every ``WATCH_S`` the driver sizes the layout again from the cluster's alive
  nodes. Where an auto-sized pool could hold more replicas (a node joined), new replicas
  are created; each joins the dispatcher once its model is loaded, and serves batches. A
  pool with ``max_*replicas`` above what the cluster holds keeps the difference as pending
  actors: unplaced, they are demand that Ray's autoscaler (KubeRay, cluster launcher)
  sees and scales up for. GPU pools may appear mid-run (a GPU node joined a CPU cluster);
  a CPU pool joins only if the run started with one (its precision, and the artefacts it
  loads, were settled at the start).
* **Leave.** Replicas whose node is no longer alive leave the dispatcher and are killed
  (no restart); their in-flight calls fail and the executor re-runs those batches from
  their reads elsewhere: nothing lost, nothing written twice (a batch's parts are only
  written by its write task). A pool of fixed size gets new replicas back up to its
  count, placed where the cluster has room (or pending until it has).
* **Starve.** A stage left with no live replica for ``run.replica_wait_s`` (every node
  that held it left, and nothing can be placed) fails the run with the cluster's shape,
  rather than waiting forever.

Every replica that existed is recorded (stage, pool, index, node, backend, batches served,
busy seconds, joined and left times) for the manifest's ``replicas`` list.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import ray

from docintel.actors.metrics import RunMetrics
from docintel.actors.resources import actor_options
from docintel.actors.stages import StageActor
from docintel.pipeline.config import AUTO
from docintel.pipeline.errors import DocintelError, RunFailed
from docintel.pipeline.registry import Chain
from docintel.pipeline.run.dispatch import Dispatcher, Replica
from docintel.pipeline.run.layout import (
    CPU_POOL,
    GPU_POOL,
    ClusterShape,
    NodeShape,
    Pool,
    build_stage,
    stage_layout,
)

_ACTOR = ray.remote(StageActor)  # one actor class for every stage
WATCH_S = 2.0  # how often the driver looks at the cluster's nodes (one GCS call)

log = logging.getLogger(__name__)


def current_shape() -> ClusterShape:
    """The connected Ray cluster's alive nodes and what each declares (CPUs, GPUs)."""
    nodes = [
        NodeShape(n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0), n["NodeID"])
        for n in ray.nodes()
        if n.get("Alive")
    ]
    return ClusterShape(tuple(nodes))


def actor_name(run_id: str, replica_key: str) -> str:
    """``docintel:<run id>:<stage>/<pool>/<index>``, unique per run on a cluster."""
    return f"docintel:{run_id}:{replica_key}"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass
class _Member:
    """One replica's actor and its life in the run."""

    replica: Replica
    pool: Pool
    handle: Any
    ready_ref: Any  # ObjectRef of ready(); None once it answered
    created: float  # monotonic
    initial: bool = False  # of the layout the run started with (a failed load fails it)
    loaded: dict[str, Any] | None = None  # ready()'s answer, until its stage joins
    joined_at: float | None = None  # monotonic, when it joined the dispatcher
    joined: str = ""
    left: str = ""
    left_reason: str = ""
    pid: int | None = None  # the replica's process (as its ready() said)

    @property
    def live(self) -> bool:
        return self.joined_at is not None and not self.left

    @property
    def pending(self) -> bool:
        return self.joined_at is None and not self.left

    def record(self) -> dict[str, Any]:
        r = self.replica
        return {
            "stage": r.stage,
            "pool": r.pool,
            "index": r.index,
            "node": r.node,
            "pid": self.pid,
            "backend": r.backend,
            "batches": r.calls,
            "busy_seconds": round(r.busy_s, 3),
            "joined": self.joined or None,
            "left": self.left or None,
            **({"left_because": self.left_reason} if self.left_reason else {}),
        }


class PoolManager:
    """The replicas of every stage pool of one run (see the module docstring)."""

    def __init__(self, chain: Chain, run_id: str, layout: dict[str, list[Pool]]) -> None:
        self.chain, self.cfg, self.run_id = chain, chain.cfg, run_id
        self.layout = layout  # as started: fixes the CPU pools' precision for the run
        self.dispatcher = Dispatcher({s: [] for s in layout})
        self.actors: dict[str, Any] = {}  # replica key -> handle (the executor calls them)
        self.members: list[_Member] = []
        self.info: dict[str, dict[str, Any]] = {}  # per stage: backend, version, backends
        self.metrics = RunMetrics(run_id)
        self._next = Counter[tuple[str, str]]()
        self._watched = time.monotonic()
        self._starved: dict[str, float] = {}
        self._waiting = 0  # replicas created that have neither joined nor left
        # perf_counter when every replica of the starting layout had joined (or left)
        self.loaded_at: float | None = None

    # --- start and stop -----------------------------------------------------------------

    def start(self) -> None:
        """Create every replica of the layout, then the pending ones a pool's max asks for
        (autoscaler demand). Does not wait for their models: the run starts at once, each
        replica joins the dispatcher when its model has loaded (``poll``), and a batch
        waits on the driver for its stage's first replica, so reading, sentencizing and
        model loading overlap. A replica of the starting layout that fails to load its
        model fails the run with the stage's own message (``poll`` raises it)."""
        for pools in self.layout.values():
            for pool in pools:
                for _ in range(pool.replicas):
                    self._spawn(pool, initial=True)
        self._demand()

    @property
    def _loading(self) -> bool:
        """Some replica has not joined yet (loading, or its stage waits for it)."""
        return self._waiting > 0

    def pending_refs(self) -> list[Any]:
        """ready() refs of replicas still loading their model: the executor wakes on them."""
        if not self._loading:
            return []
        return [m.ready_ref for m in self.members if m.pending and m.loaded is None]

    def close(self) -> None:
        """Kill every replica (frees its CPUs and GPU share for the next run)."""
        self._gauges(time.monotonic())  # the last values, also for runs shorter than WATCH_S
        self.metrics.flush(force=True)
        for m in self.members:
            if not m.left:
                m.left = _now()
                m.left_reason = "run ended"
            ray.kill(m.handle, no_restart=True)

    # --- while the run goes on ----------------------------------------------------------

    def poll(self, now: float) -> None:
        """Join replicas whose model loaded; every WATCH_S, drop the ones whose node left
        and start new ones where the cluster has room. Cheap: called every loop."""
        if self._loading:  # O(1) once every replica has joined
            self._check_pending()
        if now - self._watched >= WATCH_S:
            self._watched = now
            self._watch(now)
        self._check_starved(now)
        self.metrics.flush(now)

    def _watch(self, now: float) -> None:
        self._departures()
        self._grow()
        self._gauges(now)

    def _departures(self) -> None:
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        for m in self.members:
            if m.live and m.replica.node not in alive:
                self._leave(m, "its node left the cluster")

    def _gauges(self, now: float) -> None:
        for m in self.members:
            if m.live and m.joined_at is not None:
                elapsed = max(1e-9, now - m.joined_at)
                r = m.replica
                self.metrics.replica(r.stage, r.pool, r.key, min(1.0, r.busy_s / elapsed))
        for stage, reps in self.dispatcher.pools.items():
            for kind in (GPU_POOL, CPU_POOL):
                self.metrics.replicas(stage, kind, sum(r.pool == kind for r in reps))

    def _grow(self) -> None:
        """New replicas where the run has fewer than it should: auto pools sized again to
        the cluster as it is now (a node joined), fixed pools back to their count (a node
        left with some of theirs; the new ones wait until the cluster can place them)."""
        try:
            wanted = stage_layout(self.cfg, current_shape(), self.chain)
        except DocintelError:
            wanted = {}  # e.g. no GPU left for a gpu-only layout: keep what runs
        for stage in self.layout:
            started = {p.kind: p for p in self.layout[stage]}
            sized = {p.kind: p for p in wanted.get(stage, [])}
            for kind in (GPU_POOL, CPU_POOL):
                base = started.get(kind)
                if self._auto(stage, kind):
                    if kind not in sized or (kind == CPU_POOL and base is None):
                        continue  # a new CPU pool: its precision was settled at the start
                    target, template = sized[kind].replicas, base or sized[kind]
                elif base is not None:
                    target, template = base.replicas, base
                else:
                    continue
                have = sum(
                    1
                    for m in self.members
                    if m.replica.stage == stage and m.replica.pool == kind and not m.left
                )
                for _ in range(target - have):
                    self._spawn(template)

    def _auto(self, stage: str, kind: str) -> bool:
        cfg = self.cfg.resources.pool(stage)
        return (cfg.gpu_replicas if kind == GPU_POOL else cfg.replicas) == AUTO

    def _demand(self) -> None:
        """Pending replicas up to a pool's max above what the cluster holds now: Ray's
        autoscaler sees them as resource demand and adds nodes; they join when placed."""
        for stage, pools in self.layout.items():
            cfg = self.cfg.resources.pool(stage)
            for pool in pools:
                cap = cfg.max_gpu_replicas if pool.kind == GPU_POOL else cfg.max_replicas
                if not self._auto(stage, pool.kind) or cap <= pool.replicas:
                    continue
                for _ in range(cap - pool.replicas):
                    self._spawn(pool)

    def _check_pending(self) -> None:
        pending = [m for m in self.members if m.pending and m.loaded is None]
        if pending:
            refs = [m.ready_ref for m in pending]
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            ready = set(done)
            for m in pending:
                if m.ready_ref in ready:
                    self._loaded(m)
        # A stage of the starting layout joins as a whole, once each of its replicas has
        # loaded: its GPU replicas (slower to load) are then in the dispatcher together
        # with its CPU ones, so no batch spills only because a GPU replica was not ready.
        # Stages join independently: reads and the first stages go on meanwhile.
        for stage in self.layout:
            starting = [m for m in self.members if m.initial and m.replica.stage == stage]
            waiting = [m for m in starting if m.pending]
            if all(m.loaded is not None for m in waiting):
                for m in waiting:
                    self._join(m, m.loaded)
        if self.loaded_at is None and not any(m.pending for m in self.members if m.initial):
            self.loaded_at = time.perf_counter()

    def _loaded(self, m: _Member) -> None:
        """``m``'s ready() finished: note its info (joined now, or with its stage), or
        fail the run (a replica of the starting layout whose model does not load), or drop
        it (a later replica that failed, or any whose node went away)."""
        try:
            info = ray.get(m.ready_ref)
        except ray.exceptions.RayTaskError as e:
            if m.initial:  # the model does not load: every replica would fail alike
                cause = e.cause
                if isinstance(cause, DocintelError):
                    raise cause from None
                raise RunFailed(f"a stage actor failed to start: {cause!r}") from e
            self._leave(m, f"failed to start: {e}")
            return
        except ray.exceptions.RayError as e:  # it died (its node left): replaced
            self._leave(m, f"failed to start: {e}")
            return
        if m.initial:
            m.loaded = info
        else:
            self._join(m, info)

    def _check_starved(self, now: float) -> None:
        for stage, reps in self.dispatcher.pools.items():
            if reps:
                self._starved.pop(stage, None)
                continue
            since = self._starved.setdefault(stage, now)
            if now - since > self.cfg.run.replica_wait_s:
                raise RunFailed(
                    f"stage {stage!r} has had no live replica for {now - since:.0f} s "
                    f"(run.replica_wait_s): the nodes that held it left and none can be "
                    f"placed on the cluster as it is ({current_shape().describe()})"
                )

    # --- one replica ----------------------------------------------------------------------

    def _spawn(self, pool: Pool, initial: bool = False) -> None:
        index = self._next[(pool.stage, pool.kind)]
        self._next[(pool.stage, pool.kind)] += 1
        rep = Replica(pool.stage, index, pool.kind, pool.max_in_flight)
        opts = actor_options(pool, actor_name(self.run_id, rep.key))
        stage = build_stage(self.chain, pool)
        handle = _ACTOR.options(**opts).remote(stage, rep.key, self.chain.split_cap(pool.stage))
        self.actors[rep.key] = handle
        member = _Member(rep, pool, handle, handle.ready.remote(), time.monotonic(), initial)
        self._waiting += 1
        self.members.append(member)

    def _join(self, m: _Member, info: dict[str, Any]) -> None:
        self._waiting -= 1
        m.replica.node = info.get("node", "")
        m.replica.backend = info["backend"]
        m.pid = info.get("pid")
        m.joined_at, m.joined = time.monotonic(), _now()
        m.ready_ref = None
        self.dispatcher.pools[m.replica.stage].append(m.replica)
        entry = self.info.setdefault(m.replica.stage, {**info, "backends": []})
        entry["backends"].append(info["backend"])
        log.info("replica %s joined on node %s", m.replica.key, m.replica.node)

    def _leave(self, m: _Member, why: str) -> None:
        if m.pending:
            self._waiting -= 1
        m.left, m.left_reason = _now(), why
        reps = self.dispatcher.pools[m.replica.stage]
        reps[:] = [r for r in reps if r is not m.replica]
        ray.kill(m.handle, no_restart=True)  # its in-flight calls fail: retried elsewhere
        log.warning("replica %s left: %s", m.replica.key, why)

    # --- reports ------------------------------------------------------------------------

    def records(self) -> list[dict[str, Any]]:
        """Every replica of the run, for the manifest: called when the last batch is
        written (replicas still live then leave with the run's end)."""
        self._departures()
        for m in self.members:
            if not m.left:
                m.left, m.left_reason = _now(), "run ended" if m.joined else "never placed"
        return [m.record() for m in self.members]

    def per_pool(self) -> dict[str, dict[str, int]]:
        """Replicas that served the run, per stage and pool (for the summary)."""
        out: dict[str, dict[str, int]] = {}
        for m in self.members:
            if m.joined:
                pools = out.setdefault(m.replica.stage, {})
                pools[m.replica.pool] = pools.get(m.replica.pool, 0) + 1
        return out
