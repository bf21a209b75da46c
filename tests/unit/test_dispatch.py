"""Dispatcher policy: slots, GPU first, spill by expected wait, measured service times.

Time is explicit (``now`` arguments, or a fake clock), and the simulations below play
replicas as FIFO servers with fixed service times, so every outcome is deterministic.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import statistics
from collections.abc import Callable

import pytest

from docintel.pipeline.run.dispatch import EWMA_ALPHA, Dispatcher, Replica

GPU_S = 1.5  # a slowed GPU replica (the spill bench's 1 s sleep + fp32 compute)
CPU_S = 0.2  # an int8 CPU replica


def _pool(n: int = 3, slots: int = 2, stage: str = "embed") -> list[Replica]:
    return [Replica(stage=stage, index=i, pool="cpu", max_in_flight=slots) for i in range(n)]


def _mixed(gpu_slots: int = 2, cpu_slots: int = 2, cpus: int = 1) -> Dispatcher:
    gpu = [Replica("embed", 0, "gpu", max_in_flight=gpu_slots)]
    return Dispatcher({"embed": gpu + _pool(n=cpus, slots=cpu_slots)})


def _measured(d: Dispatcher, gpu_s: float = GPU_S, cpu_s: float = CPU_S) -> None:
    """Give every replica a service-time estimate, as after a first call each."""
    for r in d.pools["embed"]:
        r.service_s = gpu_s if r.pool == "gpu" else cpu_s


# --- slots (unchanged from the slot-only policy while nothing is measured) -------------


def test_acquire_spreads_then_saturates():
    d = Dispatcher({"embed": _pool()})
    assert d.slots("embed") == 6
    got = [d.acquire("embed", 0.0) for _ in range(6)]
    assert [r.index for r in got] == [0, 1, 2, 0, 1, 2]
    assert all(r.in_flight == 2 for r in d.pools["embed"])
    assert d.acquire("embed", 0.0) is None
    assert d.acquire("embed", 0.0) is None  # still full; nothing was counted
    assert sum(d.served.values()) == 6
    assert d.served["embed/cpu/1"] == 2


def test_acquire_picks_the_least_loaded_replica():
    pool = _pool()
    d = Dispatcher({"embed": pool})
    for r in (pool[0], pool[2]):
        d._take(r, 0.0)  # one call in flight on replicas 0 and 2
    r = d.acquire("embed", 0.0)
    assert r is pool[1]
    assert r.in_flight == 1
    # all equal now: the lowest index wins the tie
    assert d.acquire("embed", 0.0) is pool[0]


def test_acquire_prefers_the_faster_cpu_replica():
    pool = _pool(n=2)
    pool[0].service_s, pool[1].service_s = 0.9, 0.3
    d = Dispatcher({"embed": pool})
    assert d.acquire("embed", 0.0) is pool[1]  # finishes at 0.3 vs 0.9
    assert d.acquire("embed", 0.0) is pool[1]  # 0.6 vs 0.9
    assert d.acquire("embed", 0.0) is pool[0]  # 0.9 vs 0.9: more free slots wins


def test_release_frees_a_slot():
    d = Dispatcher({"embed": _pool(n=2, slots=1)})
    a = d.acquire("embed", 0.0)
    b = d.acquire("embed", 0.0)
    assert d.acquire("embed", 0.0) is None
    d.release(b, 1.0)
    assert b.in_flight == 0
    again = d.acquire("embed", 1.0)
    assert again is b
    d.release(a, 2.0)
    d.release(again, 2.5)
    assert all(r.in_flight == 0 for r in d.pools["embed"])


def test_release_without_acquire_raises():
    d = Dispatcher({"embed": _pool()})
    with pytest.raises(RuntimeError, match="embed/cpu/0"):
        d.release(d.pools["embed"][0], 0.0)
    r = d.acquire("embed", 0.0)
    d.release(r, 1.0)
    with pytest.raises(RuntimeError):
        d.release(r, 2.0)


def test_pools_are_independent():
    d = Dispatcher(
        {"embed": _pool(n=1, slots=1), "classify": _pool(n=1, slots=1, stage="classify")}
    )
    assert d.acquire("embed", 0.0) is not None
    assert d.acquire("embed", 0.0) is None
    r = d.acquire("classify", 0.0)
    assert r is not None
    assert r.key == "classify/cpu/0"


def test_gpu_first_then_spill_to_cpu_then_back():
    gpu = Replica("embed", 0, "gpu", max_in_flight=2)
    cpu = Replica("embed", 0, "cpu", max_in_flight=1)
    d = Dispatcher({"embed": [cpu, gpu]})  # listing order does not matter
    assert d.acquire("embed", 0.0) is gpu  # GPU first
    # the GPU call's length is unknown yet: nothing is parked behind it, the CPU takes it
    assert d.acquire("embed", 0.0) is cpu
    assert d.acquire("embed", 0.0) is None  # the CPU slot is taken: the batch waits
    d.release(gpu, 0.5)
    assert d.acquire("embed", 0.5) is gpu  # the GPU is free again: work flows back to it
    # measured now (0.5 s): 0.5 s left on it, the CPU replica's length still unknown
    assert d.acquire("embed", 0.5) is gpu
    assert d.acquire("embed", 0.5) is None  # every slot busy
    assert d.served == {"embed/gpu/0": 3, "embed/cpu/0": 1}


def test_the_default_clock_is_used_without_now():
    t = [10.0]
    d = Dispatcher({"embed": _pool(n=1, slots=1)}, clock=lambda: t[0])
    r = d.acquire("embed")
    t[0] = 10.4
    d.release(r)
    assert r.service_s == pytest.approx(0.4)


# --- measured service times -------------------------------------------------------------


def test_service_time_runs_from_the_previous_finish_and_is_smoothed():
    d = Dispatcher({"embed": _pool(n=1, slots=2)})
    r = d.pools["embed"][0]
    d.acquire("embed", 0.0)
    d.acquire("embed", 0.0)  # queued behind the first call
    d.release(r, 1.0)
    assert r.service_s == pytest.approx(1.0)
    d.release(r, 1.5)  # started when the first finished: 0.5 s of service, 1 s queued
    assert r.service_s == pytest.approx(EWMA_ALPHA * 0.5 + (1 - EWMA_ALPHA) * 1.0)
    assert r.queued_s == pytest.approx(1.0)
    assert r.busy_s == pytest.approx(1.5)
    assert r.calls == 2
    d.acquire("embed", 3.0)  # idle in between: service counts from the submission
    d.release(r, 3.2)
    assert r.busy_s == pytest.approx(1.7)
    assert r.queued_s == pytest.approx(1.0)
    assert d.stats()[0] == {
        "replica": "embed/cpu/0",
        "calls": 3,
        "busy_s": 1.7,
        "queued_s": 1.0,
        "service_s": round(r.service_s, 4),
    }


def test_two_finishes_seen_in_one_poll_give_one_sample():
    d = Dispatcher({"embed": _pool(n=1, slots=2)})
    r = d.pools["embed"][0]
    d.acquire("embed", 0.0)
    d.acquire("embed", 0.0)
    d.release(r, 0.8)
    d.release(r, 0.8)  # the same poll: its own service time is unknown
    assert r.service_s == pytest.approx(0.8)
    assert r.calls == 2


def test_an_unmeasured_replica_borrows_its_pools_estimate():
    pool = _pool(n=2)
    pool[0].service_s = 0.4
    d = Dispatcher({"embed": pool})
    assert d.service(pool[1]) == pytest.approx(0.4)
    fresh = _pool(n=1)
    assert Dispatcher({"embed": fresh}).service(fresh[0]) is None


def test_wait_counts_the_running_call_and_the_queue():
    r = Replica("embed", 0, "gpu", max_in_flight=3)
    assert r.wait(5.0, 1.5) == 0.0
    r.submitted.extend([0.0, 0.0])
    assert r.wait(1.0, 1.5) == pytest.approx(0.5 + 1.5)
    # overdue by 2.5 s: its end is unknown, so it counts as a whole call, as the queued one
    assert r.wait(4.0, 1.5) == pytest.approx(1.5 + 1.5)
    r.last_done = 2.0  # the head started when the previous call finished
    assert r.wait(3.0, 1.5) == pytest.approx(0.5 + 1.5)


# --- saturation ----------------------------------------------------------------------------


def test_an_idle_gpu_takes_the_batch_however_slow_it_is():
    d = _mixed()
    _measured(d, gpu_s=10.0, cpu_s=0.01)
    assert d.acquire("embed", 0.0).pool == "gpu"


def test_an_overdue_gpu_call_does_not_attract_a_queued_batch():
    d = _mixed()
    _measured(d)
    gpu = d.acquire("embed", 0.0)
    cpu = d.acquire("embed", 0.0)
    assert (gpu.pool, cpu.pool) == ("gpu", "cpu")
    d.release(cpu, 0.2)
    # 3 s into a call expected to take 1.5 s: not "about to finish", so the CPU takes it
    assert d.acquire("embed", 3.0) is cpu
    d.release(gpu, 3.5)
    assert d.acquire("embed", 3.5) is gpu  # idle again: GPU first


def test_a_busy_gpu_is_saturated_when_a_cpu_replica_would_finish_first():
    d = _mixed()
    _measured(d)
    gpu = d.acquire("embed", 0.0)
    assert gpu.pool == "gpu"
    # the GPU has a free slot, but the batch would wait 1.5 s there; the CPU takes 0.2 s
    spilled = d.acquire("embed", 0.0)
    assert spilled.pool == "cpu"
    assert gpu.in_flight == 1  # nothing parked behind the GPU call while the CPU is free
    # the GPU call is 1.4 s in: 0.1 s left, sooner than the CPU replica (0.2 queued + 0.2)
    assert d.acquire("embed", 1.4) is gpu


def test_saturated_gpu_and_full_cpu_means_wait_then_either_pool_takes_it():
    d = _mixed(cpu_slots=1)
    _measured(d)
    gpu = d.acquire("embed", 0.0)
    cpu = d.acquire("embed", 0.0)
    assert (gpu.pool, cpu.pool) == ("gpu", "cpu")
    assert d.acquire("embed", 0.1) is None  # GPU queue 1.4 s > CPU's 0.1 + 0.2: wait
    d.release(cpu, 0.2)
    assert d.acquire("embed", 0.2) is cpu  # the CPU slot freed: spill
    d.release(cpu, 0.4)
    d.release(gpu, 1.5)
    assert d.acquire("embed", 1.5) is gpu  # GPU idle again: work goes back to it


@pytest.mark.parametrize("measured", [GPU_S, None])
def test_a_gpu_only_stage_fills_every_gpu_slot(measured: float | None):
    gpu = Replica("embed", 0, "gpu", max_in_flight=2, service_s=measured)
    d = Dispatcher({"embed": [gpu]})
    assert d.acquire("embed", 0.0) is gpu
    assert d.acquire("embed", 0.0) is gpu  # no CPU pool to spill to: queue on the GPU
    assert d.acquire("embed", 0.0) is None


def test_the_least_delayed_gpu_replica_is_chosen():
    gpus = [Replica("embed", i, "gpu", max_in_flight=2, service_s=GPU_S) for i in range(2)]
    cpu = Replica("embed", 0, "cpu", max_in_flight=2, service_s=CPU_S)
    d = Dispatcher({"embed": [*gpus, cpu]})
    assert d.acquire("embed", 0.0) is gpus[0]
    assert d.acquire("embed", 0.0) is gpus[1]  # the idle GPU before any queue
    assert d.acquire("embed", 0.1).pool == "cpu"  # both GPUs busy for 1.4 s more
    assert d.acquire("embed", 1.45) is gpus[0]  # 0.05 s left < the CPU's 0.2 + 0.2


# --- simulated runs ------------------------------------------------------------------------


def _simulate(
    d: Dispatcher,
    stage: str,
    batches: int,
    admit: int,
    service: dict[str, float],
    *,
    window: int | None = None,
    factors: list[float] | None = None,
    remaining: Callable[[int], int] | None = None,
):
    """Play ``batches`` calls through ``d`` on FIFO replicas with fixed service times.

    At most ``admit`` batches are in flight (submitted and unfinished); the driver acts
    only when a call finishes, as the executor does. Returns (makespan, calls per pool).

    ``window``: call ``set_outlook`` before every dispatch round, as the executor does, with
    an admission cap of ``window`` batches: the input is done once the batches not yet
    finished fit under it, and ``remaining`` is the batches not yet submitted (or what the
    ``remaining`` hook makes of that count). ``factors``: batch k's call takes
    ``factors[k]`` times its pool's service time (call-time variance; the same batch is as
    slow whatever the policy, so two policies are compared on the same input).
    """
    now = 0.0
    todo = batches
    free_at: dict[str, float] = {}  # replica key -> when its last queued call finishes
    events: list[tuple[float, int, Replica]] = []
    seq = itertools.count()
    while todo or events:
        if window is not None:
            left = todo if remaining is None else remaining(todo)
            d.set_outlook(todo + len(events) <= window, {stage: left})
        while todo and len(events) < admit:
            r = d.acquire(stage, now)
            if r is None:
                break
            call = service[r.pool] * (factors[batches - todo] if factors else 1.0)
            finish = max(now, free_at.get(r.key, -math.inf)) + call
            free_at[r.key] = finish
            heapq.heappush(events, (finish, next(seq), r))
            todo -= 1
        assert events, f"deadlock: {todo} batches wait and no call is in flight"
        now, _, r = heapq.heappop(events)
        d.release(r, now)
    per_pool = {"gpu": 0, "cpu": 0}
    for r in d.pools[stage]:
        per_pool[r.pool] += r.calls
    return now, per_pool


def test_simulated_saturation_serves_about_the_sum_of_both_pools():
    batches = 200
    d = _mixed(cpus=1)
    makespan, served = _simulate(d, "embed", batches, admit=4, service={"gpu": 1.5, "cpu": 0.2})
    both = 1 / 1.5 + 1 / 0.2  # batches/s of the two pools on their own, added up
    assert batches / makespan >= 0.95 * both
    assert served["gpu"] >= 0.9 * batches * (1 / 1.5) / both  # the GPU kept busy too


def test_simulated_no_saturation_sends_nothing_to_the_cpu():
    d = _mixed(cpus=2)
    _, served = _simulate(d, "embed", 50, admit=1, service={"gpu": 1.5, "cpu": 0.2})
    assert served == {"gpu": 50, "cpu": 0}


def test_simulated_gpu_that_keeps_up_takes_everything_once_measured():
    # a fast GPU (real hardware: faster than int8 on the CPU) with work for both slots: the
    # only CPU call is the second batch, sent while the GPU's first call had no measure yet
    d = _mixed(cpus=1)
    _, served = _simulate(d, "embed", 100, admit=2, service={"gpu": 0.05, "cpu": 0.2})
    assert served == {"gpu": 99, "cpu": 1}
    warm = _mixed(cpus=1)  # both pools measured already: nothing spills
    _measured(warm, gpu_s=0.05, cpu_s=0.2)
    _, served = _simulate(warm, "embed", 100, admit=2, service={"gpu": 0.05, "cpu": 0.2})
    assert served == {"gpu": 100, "cpu": 0}


def test_an_unmeasured_cpu_pool_spills_only_when_idle():
    d = _mixed()
    gpu, cpu = d.pools["embed"]
    gpu.service_s = GPU_S  # the GPU is measured, the CPU pool not yet
    assert d.acquire("embed", 0.0) is gpu
    assert d.acquire("embed", 0.0) is cpu  # an idle CPU replica: try it, which measures it
    # a busy unmeasured CPU replica gives no estimate: the GPU's free slot decides
    assert d.acquire("embed", 0.0) is gpu
    assert d.acquire("embed", 0.0) is cpu  # every GPU slot busy: spill
    assert d.acquire("embed", 0.0) is None


# --- end of input (rule 4) ---------------------------------------------------------------


def _spilled(gpu_s: float = GPU_S, cpu_s: float = CPU_S) -> Dispatcher:
    """A GPU replica and a CPU replica (2 slots each), both measured, the stage spilled
    once (the second call went to the CPU), both idle again at t = ``gpu_s``."""
    d = _mixed()
    _measured(d, gpu_s, cpu_s)
    gpu, cpu = d.pools["embed"]
    assert d.acquire("embed", 0.0) is gpu
    assert d.acquire("embed", 0.0) is cpu  # saturated: spill
    d.release(cpu, cpu_s)
    d.release(gpu, gpu_s)
    gpu.service_s, cpu.service_s = gpu_s, cpu_s
    assert d.spilled == {"embed"}
    return d


def test_outlook_sends_the_last_batches_to_the_cpu_pool_when_the_gpu_would_finish_later():
    d = _spilled()
    gpu, cpu = d.pools["embed"]
    t = GPU_S
    d.set_outlook(True, {"embed": 3})
    # an idle GPU would finish at t + 1.5; the CPU replica drains all 3 by t + 0.6
    assert d.acquire("embed", t) is cpu
    assert d.acquire("embed", t) is cpu  # rule 1 picks the idle GPU, rule 4 overrules it
    assert d.remaining == {"embed": 1}  # each batch handed out counts as submitted
    # the CPU slots are full, the last batch would still finish there first (t + 0.6): wait
    assert d.acquire("embed", t) is None
    assert gpu.in_flight == 0
    d.release(cpu, t + CPU_S)
    assert d.acquire("embed", t + CPU_S) is cpu
    assert d.served == {"embed/gpu/0": 1, "embed/cpu/0": 4}
    # the same state without an outlook: GPU first, as before rule 4
    plain = _spilled()
    assert plain.acquire("embed", t) is plain.pools["embed"][0]


def test_outlook_leaves_a_batch_to_the_gpu_that_finishes_it_first():
    d = _spilled()
    gpu, cpu = d.pools["embed"]
    t = GPU_S
    d.set_outlook(True, {"embed": 8})  # the CPU pool needs 8 x 0.2 = 1.6 s >= 1.5 s
    assert d.acquire("embed", t) is gpu
    assert d.acquire("embed", t) is cpu  # the GPU is busy now: rule 1 spills, as before
    # a tie (the drain exactly as long as the GPU call) goes to the GPU: no later is enough
    tie = _spilled(gpu_s=1.5, cpu_s=0.25)
    tie.set_outlook(True, {"embed": 6})  # 6 x 0.25 = 1.5
    assert tie.acquire("embed", 1.5).pool == "gpu"
    tie = _spilled(gpu_s=1.5, cpu_s=0.25)
    tie.set_outlook(True, {"embed": 5})
    assert tie.acquire("embed", 1.5).pool == "cpu"


def test_outlook_has_no_effect_before_the_input_is_done():
    d = _spilled()
    d.set_outlook(False, {"embed": 1})
    assert d.acquire("embed", GPU_S).pool == "gpu"
    d.set_outlook(True, {"embed": 1})
    assert d.acquire("embed", GPU_S).pool == "cpu"  # the GPU queue is 1.5 s now anyway
    d.set_outlook(False, {"embed": 1})
    d.release(d.pools["embed"][0], 2 * GPU_S)
    assert d.acquire("embed", 2 * GPU_S).pool == "gpu"


def test_outlook_has_no_effect_in_a_stage_that_never_spilled():
    d = _mixed()
    _measured(d)
    d.set_outlook(True, {"embed": 1})
    assert d.acquire("embed", 0.0).pool == "gpu"  # 1.5 s vs 0.2 s on the CPU: still GPU
    assert d.spilled == set()
    # a GPU-only layout never spills and has nowhere to drain to: every slot as before
    gpu = Replica("embed", 0, "gpu", max_in_flight=2, service_s=GPU_S)
    only = Dispatcher({"embed": [gpu]})
    only.set_outlook(True, {"embed": 1})
    assert [only.acquire("embed", 0.0) for _ in range(3)] == [gpu, gpu, None]


def test_outlook_needs_a_measured_cpu_pool():
    d = _mixed()
    gpu, cpu = d.pools["embed"]
    gpu.service_s = GPU_S
    assert d.acquire("embed", 0.0) is gpu
    assert d.acquire("embed", 0.0) is cpu  # spilled, but the CPU call has not finished
    d.release(gpu, GPU_S)
    d.set_outlook(True, {"embed": 1})
    assert d.acquire("embed", GPU_S) is gpu  # no CPU estimate: rules 1-3 only


def test_outlook_waits_for_a_fast_cpu_slot_rather_than_a_slow_replica_or_the_gpu():
    gpu = Replica("embed", 0, "gpu", max_in_flight=2, service_s=GPU_S)
    fast = Replica("embed", 0, "cpu", max_in_flight=1, service_s=CPU_S)
    slow = Replica("embed", 1, "cpu", max_in_flight=1, service_s=3.0)
    d = Dispatcher({"embed": [gpu, fast, slow]})
    d._take(fast, 1.4)  # a CPU call beside a GPU replica: the stage has spilled
    d.set_outlook(True, {"embed": 1})
    # GPU: done at +1.5; the fast replica: +0.1 left, then +0.2; the slow one: +3.0
    assert d.acquire("embed", 1.5) is None
    d.release(fast, 1.6)
    assert d.acquire("embed", 1.6) is fast


def test_cpu_drain_is_list_scheduling_over_the_cpu_replicas():
    pool = _pool(n=3, slots=2)
    pool[0].submitted.append(0.0)  # 0.1 s of a 0.2 s call left at t = 0.1
    services = [CPU_S] * 3
    # ends 0.1, 0, 0; five calls: 0.2, 0.2, 0.3, 0.4, 0.4 -- about (0.1 + 5 x 0.2) / 3 = 0.37
    full = Dispatcher._cpu_drain(pool, services, 5, 0.1, stop=math.inf)
    assert full == pytest.approx(0.4)
    early = Dispatcher._cpu_drain(pool, services, 5, 0.1, stop=0.25)
    assert 0.25 <= early <= full  # stops once the answer (>= stop) is known
    # the pool's own queue counts even with nothing left to add
    pool[1].submitted.extend([0.1, 0.1, 0.1])
    assert Dispatcher._cpu_drain(pool, services, 1, 0.1, stop=math.inf) == pytest.approx(0.6)


def _variance(seed: int, batches: int, spread: float = 0.3) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(1 - spread, 1 + spread) for _ in range(batches)]


def _served_in(d: Dispatcher, factors: list[float], window: int | None = None) -> float:
    """Makespan of the spill bench's embed stage (1.8 s GPU, 0.32 s CPU calls, 4 in flight)
    over ``len(factors)`` batches; every batch served."""
    service = {"gpu": 1.8, "cpu": 0.32}
    t, served = _simulate(d, "embed", len(factors), 4, service, window=window, factors=factors)
    assert sum(served.values()) == len(factors)
    return t


def test_simulated_lookahead_shortens_the_tail_of_a_saturated_run():
    # bench/spill.md: a stand-in GPU of 1.8 s per embed call, the int8 CPU replica 0.32 s,
    # 66 batches, call times +-30 %; one replica each, 2 slots; the executor's admission
    # cap is twice the slots. ratio = throughput auto / (gpu-only + cpu-only).
    service, batches, seeds = {"gpu": 1.8, "cpu": 0.32}, 66, range(40)
    plain, look, r_plain, r_look = [], [], [], []
    for seed in seeds:
        factors = _variance(seed, batches)
        gpu_only = _served_in(Dispatcher({"embed": [Replica("embed", 0, "gpu", 2)]}), factors)
        cpu_only = _served_in(Dispatcher({"embed": _pool(n=1)}), factors)
        both = batches / gpu_only + batches / cpu_only
        plain.append(_served_in(_mixed(), factors))
        look.append(_served_in(_mixed(), factors, window=8))  # the executor's cap: 2 x slots
        r_plain.append(batches / plain[-1] / both)
        r_look.append(batches / look[-1] / both)
    wins = sum(b < a for a, b in zip(plain, look, strict=True))
    losses = sum(b > a for a, b in zip(plain, look, strict=True))
    # shorter on the whole: in mean makespan, in median ratio, in most seeds
    assert statistics.mean(look) < statistics.mean(plain) - 0.3
    assert statistics.median(r_look) > statistics.median(r_plain) + 0.02
    assert statistics.median(r_look) > 0.97
    assert wins >= 5 * losses
    # a loss is a noisy estimate (the GPU's last call ran long): never more than that call
    assert all(b <= a + 1.3 * 1.8 for a, b in zip(plain, look, strict=True))
    # without call-time variance the drain never outlasts the GPU's tail: no worse
    t_plain, _ = _simulate(_mixed(), "embed", batches, 4, service)
    t_look, _ = _simulate(_mixed(), "embed", batches, 4, service, window=8)
    assert t_look <= t_plain


def test_simulated_lookahead_keeps_an_unsaturated_run_on_the_gpu():
    d = _mixed(cpus=2)
    _, served = _simulate(d, "embed", 50, 1, {"gpu": 1.5, "cpu": 0.2}, window=2)
    assert served == {"gpu": 50, "cpu": 0}
    # a fast GPU (it spilled once, unmeasured): its last batches still finish first there
    d = _mixed(cpus=1)
    _, served = _simulate(d, "embed", 100, 2, {"gpu": 0.05, "cpu": 0.2}, window=8)
    assert served == {"gpu": 99, "cpu": 1}


@pytest.mark.parametrize("claim", [None, 0, 1, 1000])
def test_simulated_lookahead_never_deadlocks(claim: int | None):
    # uneven CPU replicas, call-time variance, the input done from the first batch, and
    # remaining counts that are right (None) or wrong either way: every batch is served
    cpus = [Replica("embed", i, "cpu", max_in_flight=i + 1) for i in range(3)]
    gpus = [Replica("embed", i, "gpu", max_in_flight=2) for i in range(2)]
    d = Dispatcher({"embed": [*gpus, *cpus]})
    service = {"gpu": 1.8, "cpu": 0.32}
    factors = _variance(7, 80, spread=0.5)
    _, served = _simulate(
        d,
        "embed",
        80,
        d.slots("embed"),
        service,
        window=1000,
        factors=factors,
        remaining=None if claim is None else (lambda _: claim),
    )
    assert sum(served.values()) == 80
    assert all(r.in_flight == 0 for r in d.pools["embed"])
    # and a GPU-only layout with an outlook fills its slots as before
    only = Dispatcher({"embed": [Replica("embed", 0, "gpu", 2)]})
    _, served = _simulate(only, "embed", 20, 4, service, window=1000)
    assert served == {"gpu": 20, "cpu": 0}
