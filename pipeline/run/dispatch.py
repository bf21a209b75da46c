"""Routing policy: which replica of a stage's pools takes the next batch (no Ray inside).

Each replica has ``max_in_flight`` slots and runs one call at a time (its queued calls wait
in Ray). The policy, per call:

1. **GPU first.** The GPU replica with a free slot that would start the batch soonest takes
   it, unless it is *saturated*: its queue would delay the batch longer than the best CPU
   replica would take to finish it (that replica's own queue plus its service time). An
   idle GPU replica is never saturated, so with spare GPU capacity nothing goes to the CPU.
2. **Spill.** When every GPU replica is full or saturated, the CPU replica with a free slot
   and the earliest expected finish takes it (the int8 pool).
3. **Wait.** Otherwise ``acquire`` returns None and the batch waits on the driver until a
   call finishes: work in flight stays bounded end to end, and a batch is never parked
   behind a slow GPU call while a CPU replica would have finished it sooner.
4. **End of input.** Once every batch of the run has been admitted (``set_outlook``), in a
   stage that has already spilled in this run, a GPU replica chosen by rule 1 takes the
   batch only if it would finish it no later than the CPU pool would finish every batch
   still to pass the stage (``_cpu_drain``). Otherwise the CPU replica with a free slot and
   the earliest expected finish takes it, or, none free, the batch waits on the driver for
   one: the run's tail is then the CPU pool's drain, not one slow GPU call started last. A
   stage that never spilled (spare GPU capacity) keeps rule 1; a stage without CPU
   replicas, or whose CPU pool is not measured yet, is not affected.
5. **Slices.** A batch spilled to a CPU pool may run as ``slices[stage]`` calls (the
   executor cuts it: pipeline/run/slices.py). Rules 1 and 4 then count the CPU pool's time for
   all of them (list scheduling over its replicas, as ``_cpu_drain``), and the slices after
   the first take CPU slots with ``acquire_slice``, never a GPU's, and are not batches
   still to come in rule 4's outlook.

As GPU calls finish, their replicas' queues shrink and new batches go back to the GPU.
Expected waits come from measured service times: the driver sees each call finish, and a
replica runs one call at a time in submission order, so a call's service time is from
``max(its submission, the replica's previous finish)`` to its finish, smoothed per replica
(EWMA). Which pools exist is the spill mode's choice (actors/resources.py). The Ray
executor (actors/executor.py) owns the actor handles and calls ``acquire``/``release``
around each actor call with the time it observed, and ``set_outlook`` before each dispatch
round (rule 4).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SPILL_ORDER = ("gpu", "cpu")  # GPU replicas first; CPU replicas only when GPUs are saturated
# Weight of the newest service-time sample. 0.3 follows a replica that slows down (a
# neighbour starts competing for its cores) within a few calls, while one odd batch (a
# long document) moves the estimate by less than a third.
EWMA_ALPHA = 0.3
# Until a pool's first call finishes its replicas have no estimate. An idle replica is then
# taken (GPU first), which measures it; a busy GPU replica of unknown speed gets no second
# call while there is a CPU pool (its wait is unknown, so it counts as saturated), and an
# unmeasured busy CPU pool never makes a measured GPU replica look saturated.


@dataclass
class Replica:
    """One actor of a stage pool, as the policy sees it: its slots and its measured speed."""

    stage: str
    index: int
    pool: str  # the pool it belongs to: "gpu" or "cpu" (not a row's backend label)
    max_in_flight: int
    service_s: float | None = None  # EWMA of measured call times; None until one finishes
    submitted: deque[float] = field(default_factory=deque)  # calls in flight, oldest first
    last_done: float = -math.inf  # when the driver last saw one of its calls finish
    # Where it runs and how (from the replica's ready(); the manifest's replicas list).
    node: str = ""
    backend: str = ""
    # Totals for reports (bench/spill.py, the executor's end-of-run log line).
    calls: int = 0
    busy_s: float = 0.0  # measured service time, summed
    queued_s: float = 0.0  # time calls waited in this replica's queue, summed

    @property
    def key(self) -> str:
        return f"{self.stage}/{self.pool}/{self.index}"

    @property
    def in_flight(self) -> int:
        return len(self.submitted)

    @property
    def free(self) -> int:
        return self.max_in_flight - self.in_flight

    def wait(self, now: float, service: float) -> float:
        """Expected seconds before a call submitted ``now`` would start on this replica.

        A running call past its expected end (a neighbour took its cores, a long batch) is
        assumed to need a whole service time more: counting it as about to finish would
        park batches behind a stalled call, while waiting for it to finish costs one driver
        round trip (milliseconds) of idle replica.
        """
        if not self.submitted:
            return 0.0
        started = max(self.submitted[0], self.last_done)
        remaining = started + service - now
        if remaining <= 0:
            remaining = service
        return remaining + (self.in_flight - 1) * service

    def stats(self) -> dict[str, Any]:
        return {
            "replica": self.key,
            "calls": self.calls,
            "busy_s": round(self.busy_s, 3),
            "queued_s": round(self.queued_s, 3),
            "service_s": None if self.service_s is None else round(self.service_s, 4),
        }


@dataclass
class Dispatcher:
    pools: dict[str, list[Replica]]
    served: Counter[str] = field(default_factory=Counter)  # calls per replica key
    clock: Callable[[], float] = time.monotonic  # the executor passes its own ``now``
    # Rule 4 (set_outlook): every batch admitted; batches not yet submitted, per stage.
    input_done: bool = False
    remaining: dict[str, int] = field(default_factory=dict)
    spilled: set[str] = field(default_factory=set)  # stages with a CPU call beside GPUs
    # A batch spilled to a stage's CPU pool runs as this many calls (pipeline/run/slices.py):
    # rules 1 and 4 count the CPU pool's time for all of them. 1 (no entry): one call.
    slices: dict[str, int] = field(default_factory=dict)

    def set_outlook(self, input_done: bool, remaining: Mapping[str, int]) -> None:
        """What is left of the run, before a dispatch round (rule 4 of the module docstring).

        ``input_done``: every batch of the run has been admitted (its read launched).
        ``remaining[stage]``: batches not yet submitted to ``stage`` -- waiting on the driver
        for it, or still in an earlier stage or read -- including the one about to be
        acquired. Each call ``acquire`` hands out counts one of them submitted, so the
        numbers stay right through a round of several calls until the next ``set_outlook``.
        Never called: rule 4 is off, as before it existed.
        """
        self.input_done = input_done
        self.remaining = {stage: max(0, int(n)) for stage, n in remaining.items()}

    def service(self, replica: Replica) -> float | None:
        """The replica's expected call time: its own EWMA, else its pool's mean, else None."""
        if replica.service_s is not None:
            return replica.service_s
        known = [
            r.service_s
            for r in self.pools[replica.stage]
            if r.pool == replica.pool and r.service_s is not None
        ]
        return sum(known) / len(known) if known else None

    def _wait(self, r: Replica, now: float) -> float:
        """Expected delay before ``r`` starts a new call: 0 when idle, inf when busy with
        calls of unknown length (its pool not measured yet)."""
        s = self.service(r)
        if s is None:
            return 0.0 if r.in_flight == 0 else math.inf
        return r.wait(now, s)

    def _finish(self, r: Replica, now: float) -> float:
        """Expected finish of a new call on ``r``. Unmeasured: 0 when idle (try it, which
        measures it), inf when busy (no estimate to spill on)."""
        s = self.service(r)
        if s is None:
            return 0.0 if r.in_flight == 0 else math.inf
        return r.wait(now, s) + s

    def acquire(self, stage: str, now: float | None = None) -> Replica | None:
        """The replica that takes the next call of ``stage``, its slot taken; None = wait."""
        now = self.clock() if now is None else now
        best = self._choose(stage, now)
        if best is not None and best.pool == "gpu" and self.input_done and stage in self.spilled:
            best = self._look_ahead(stage, best, now)
        return None if best is None else self._take(best, now)

    def _choose(self, stage: str, now: float) -> Replica | None:
        """Rules 1-3: the replica that takes the next call, or None (wait); nothing taken."""
        replicas = self.pools[stage]
        for i, kind in enumerate(SPILL_ORDER):
            free = [r for r in replicas if r.pool == kind and r.free > 0]
            if not free:
                continue
            if i == len(SPILL_ORDER) - 1:  # the last pool: earliest expected finish
                return min(free, key=lambda r: (self._finish(r, now), -r.free, r.index))
            best = min(free, key=lambda r: (self._wait(r, now), -r.free, r.index))
            # The pools after this one, slots free or not: how soon they could finish it.
            later = [r for r in replicas if r.pool in SPILL_ORDER[i + 1 :]]
            fallback = self._fallback(stage, later, now)
            wait = self._wait(best, now)
            # not saturated: nowhere else to go, or a known wait no longer than the fallback
            if not later or (wait < math.inf and wait <= fallback):
                return best
        return None

    def _fallback(self, stage: str, later: list[Replica], now: float) -> float:
        """How soon the pools after the GPU's could finish the batch: one call on the
        replica that would finish it first, or, a batch that spills as ``k`` slices, the
        ``k`` calls spread over the pool (when every replica of it is measured)."""
        k = self.slices.get(stage, 1)
        services = [self.service(r) for r in later]
        if k > 1 and later and all(s is not None for s in services):
            return self._cpu_drain(later, services, k, now, stop=math.inf)  # type: ignore[arg-type]
        return min((self._finish(r, now) for r in later), default=math.inf)

    def acquire_slice(self, stage: str, now: float) -> Replica | None:
        """A CPU replica for one more slice of a batch already sent to the CPU pool: the
        one with a free slot and the earliest expected finish; None = wait for a slot. A
        stage left without CPU replicas (their node gone) gives its slices to the GPU
        replicas, rather than leave them waiting for a pool that may never return."""
        replicas = self.pools[stage]
        pool = "cpu" if any(r.pool == "cpu" for r in replicas) else "gpu"
        free = [r for r in replicas if r.pool == pool and r.free > 0]
        best = min(free, key=lambda r: (self._finish(r, now), -r.free, r.index), default=None)
        return None if best is None else self._take(best, now, count=False)

    def _look_ahead(self, stage: str, gpu: Replica, now: float) -> Replica | None:
        """Rule 4: ``gpu`` (rule 1's choice) if it would finish the batch no later than the
        CPU pool would drain the stage, else the CPU replica with a free slot and the
        earliest expected finish (if sooner than the GPU), else None: wait for a CPU slot.
        ``gpu`` when there is no estimate: no CPU replica with slots, or none measured."""
        cpus = [r for r in self.pools[stage] if r.pool == "cpu" and r.max_in_flight > 0]
        services = [self.service(r) for r in cpus]
        if not cpus or any(s is None for s in services):
            return gpu  # no CPU replica to drain to, or no estimate: rules 1-3 only
        gpu_finish = self._finish(gpu, now)
        todo = max(1, self.remaining.get(stage, 1))  # this batch at least
        todo *= self.slices.get(stage, 1)  # calls, when a spilled batch is sliced
        if gpu_finish <= self._cpu_drain(cpus, services, todo, now, stop=gpu_finish):
            return gpu  # done before the CPU pool would be anyway: the tail does not grow
        free = [r for r in cpus if r.free > 0]
        best = min(free, key=lambda r: (self._finish(r, now), -r.free, r.index), default=None)
        if best is not None and self._finish(best, now) < gpu_finish:
            return best
        # Wait for a busy CPU replica's slot: the drain has it finish the batch before the
        # GPU would. One is busy: with every CPU replica free, the drain's first call is
        # ``best``'s own finish, and the drain is sooner than the GPU's. No deadlock, then:
        # a call in flight on it will be released.
        return None

    @staticmethod
    def _cpu_drain(
        cpus: list[Replica], services: list[float], todo: int, now: float, stop: float
    ) -> float:
        """Seconds from ``now`` until the CPU replicas ``cpus`` would have finished what
        they hold plus ``todo`` more calls of the stage, or the first value >= ``stop``.

        Each replica first clears its own queue (``Replica.wait``: the rest of the running
        call and the queued ones); then the ``todo`` calls go one by one to the replica that
        would finish each first, as rule 2 sends them (list scheduling: exact for FIFO
        replicas at their expected service times). With ``n`` replicas of equal service
        time ``s`` and queues ``q_i`` it is about ``(sum(q_i) + todo * s) / n``, rounded up
        to whole calls, and never less than one call's finish nor the longest queue: the
        pool's drain counts what it already holds. Two errors, opposite ways: every batch
        left is assumed ready now (those still upstream are not: the drain comes out too
        early, towards the CPU pool), and all of them on the CPU pool (the GPU takes some:
        too late, towards the GPU). Both are small at the end of the input, where it acts.
        """
        ends = [r.wait(now, s) for r, s in zip(cpus, services, strict=True)]
        last = max(ends)
        for _ in range(todo):
            if last >= stop:
                break  # the drain only grows: the answer is already known
            i = min(range(len(ends)), key=lambda j: ends[j] + services[j])
            ends[i] += services[i]
            last = max(last, ends[i])
        return last

    def _take(self, replica: Replica, now: float, count: bool = True) -> Replica:
        """Take a slot of ``replica``; ``count``: a batch's first call of the stage (its
        other slices are not batches still to come, for rule 4)."""
        replica.submitted.append(now)
        self.served[replica.key] += 1
        stage = replica.stage
        if count and self.remaining.get(stage, 0) > 0:
            self.remaining[stage] -= 1  # submitted now: no longer remaining (set_outlook)
        if replica.pool == "cpu" and any(r.pool == "gpu" for r in self.pools[stage]):
            self.spilled.add(stage)
        return replica

    def release(self, replica: Replica, now: float | None = None) -> float | None:
        """One call of ``replica`` finished (or failed), observed by the driver at ``now``;
        its measured service time (None: no sample).

        The executor passes the same ``now`` for every call it saw finish in one poll; a
        replica's second call seen in the same poll gives no service-time sample (only
        their total is known), so it counts in ``calls`` but not in the estimate.
        """
        if not replica.submitted:
            raise RuntimeError(f"release of {replica.key} with no call in flight")
        now = self.clock() if now is None else now
        submitted = replica.submitted.popleft()
        started = max(submitted, replica.last_done)
        replica.calls += 1
        replica.queued_s += max(0.0, started - submitted)
        sample = None
        if replica.last_done != now:
            sample = max(0.0, now - started)
            replica.busy_s += sample
            replica.service_s = (
                sample
                if replica.service_s is None
                else EWMA_ALPHA * sample + (1 - EWMA_ALPHA) * replica.service_s
            )
        replica.last_done = now
        return sample

    def slots(self, stage: str) -> int:
        return sum(r.max_in_flight for r in self.pools[stage])

    def stats(self) -> list[dict[str, Any]]:
        """Per replica: calls, measured busy and queue seconds, current service estimate."""
        return [r.stats() for rs in self.pools.values() for r in rs]
