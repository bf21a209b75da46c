"""Routing policy: which replica of a stage's pools takes the next batch (no Ray inside).

Each replica has ``max_in_flight`` slots. ``acquire`` returns the least-loaded GPU replica
with a free slot; when every GPU replica is full (saturated), the least-loaded CPU replica
with a free slot (the batch *spills* to the int8 CPU pool); else None, and the batch waits
for a slot, which bounds work in flight end to end. As GPU slots free up, the next batches
go back to the GPU. Which pools exist is the spill mode's choice (actors/resources.py).
The Ray executor (actors/executor.py) owns the actor handles and calls
``acquire``/``release`` around each actor call.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

SPILL_ORDER = ("gpu", "cpu")  # GPU replicas first; CPU replicas only when GPUs are full


@dataclass
class Replica:
    stage: str
    index: int
    backend: str  # the pool it belongs to: "gpu" or "cpu"
    max_in_flight: int
    in_flight: int = 0

    @property
    def key(self) -> str:
        return f"{self.stage}/{self.backend}/{self.index}"

    @property
    def free(self) -> int:
        return self.max_in_flight - self.in_flight


@dataclass
class Dispatcher:
    pools: dict[str, list[Replica]]
    served: Counter[str] = field(default_factory=Counter)  # calls per replica key

    def acquire(self, stage: str) -> Replica | None:
        for kind in SPILL_ORDER:
            candidates = [r for r in self.pools[stage] if r.backend == kind and r.free > 0]
            if candidates:
                best = max(candidates, key=lambda r: (r.free, -r.index))
                best.in_flight += 1
                self.served[best.key] += 1
                return best
        return None

    def release(self, replica: Replica) -> None:
        if replica.in_flight <= 0:
            raise RuntimeError(f"release of {replica.key} with no call in flight")
        replica.in_flight -= 1

    def slots(self, stage: str) -> int:
        return sum(r.max_in_flight for r in self.pools[stage])
