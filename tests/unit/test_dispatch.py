"""Dispatcher: least-loaded replica with a free slot, saturation, release."""

from __future__ import annotations

import pytest

from pipeline.dispatch import Dispatcher, Replica


def _pool(n: int = 3, slots: int = 2, stage: str = "embed") -> list[Replica]:
    return [Replica(stage=stage, index=i, backend="cpu", max_in_flight=slots) for i in range(n)]


def test_acquire_spreads_then_saturates():
    d = Dispatcher({"embed": _pool()})
    assert d.slots("embed") == 6
    got = [d.acquire("embed") for _ in range(6)]
    assert [r.index for r in got] == [0, 1, 2, 0, 1, 2]
    assert all(r.in_flight == 2 for r in d.pools["embed"])
    assert d.acquire("embed") is None
    assert d.acquire("embed") is None  # still full; nothing was counted
    assert sum(d.served.values()) == 6
    assert d.served["embed/cpu/1"] == 2


def test_acquire_picks_the_least_loaded_replica():
    pool = _pool()
    pool[0].in_flight = 1
    pool[2].in_flight = 1
    d = Dispatcher({"embed": pool})
    r = d.acquire("embed")
    assert r is pool[1]
    assert r.in_flight == 1
    # all equal now: the lowest index wins the tie
    assert d.acquire("embed") is pool[0]


def test_release_frees_a_slot():
    d = Dispatcher({"embed": _pool(n=2, slots=1)})
    a = d.acquire("embed")
    b = d.acquire("embed")
    assert d.acquire("embed") is None
    d.release(b)
    assert b.in_flight == 0
    again = d.acquire("embed")
    assert again is b
    d.release(a)
    d.release(again)
    assert all(r.in_flight == 0 for r in d.pools["embed"])


def test_release_without_acquire_raises():
    d = Dispatcher({"embed": _pool()})
    with pytest.raises(RuntimeError, match="embed/cpu/0"):
        d.release(d.pools["embed"][0])
    r = d.acquire("embed")
    d.release(r)
    with pytest.raises(RuntimeError):
        d.release(r)


def test_pools_are_independent():
    d = Dispatcher(
        {"embed": _pool(n=1, slots=1), "classify": _pool(n=1, slots=1, stage="classify")}
    )
    assert d.acquire("embed") is not None
    assert d.acquire("embed") is None
    r = d.acquire("classify")
    assert r is not None
    assert r.key == "classify/cpu/0"


def test_gpu_first_then_spill_to_cpu_then_back():
    gpu = Replica("embed", 0, "gpu", max_in_flight=2)
    cpu = Replica("embed", 0, "cpu", max_in_flight=1)
    d = Dispatcher({"embed": [cpu, gpu]})  # listing order does not matter
    first, second = d.acquire("embed"), d.acquire("embed")
    assert first is gpu and second is gpu  # not saturated: nothing goes to the CPU
    spilled = d.acquire("embed")
    assert spilled is cpu  # every GPU slot busy: spill
    assert d.acquire("embed") is None  # both pools full: the batch waits
    d.release(gpu)
    assert d.acquire("embed") is gpu  # a GPU slot freed: work flows back to the GPU
    assert d.served == {"embed/gpu/0": 3, "embed/cpu/0": 1}
