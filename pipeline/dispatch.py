"""Routing policy: which replica of a stage's pool takes the next batch (no Ray inside).

Each replica has ``max_in_flight`` slots. ``acquire`` returns the least-loaded replica
with a free slot, or None when the pool is saturated (the batch then waits for a slot,
which bounds work in flight end to end). The Ray executor (actors/executor.py) owns the
actor handles and calls ``acquire``/``release`` around each actor call.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Replica:
    stage: str
    index: int
    backend: str  # the resource shape it runs on: "cpu" (GPU pools arrive with issue 3)
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
        candidates = [r for r in self.pools[stage] if r.free > 0]
        if not candidates:
            return None
        best = max(candidates, key=lambda r: (r.free, -r.index))
        best.in_flight += 1
        self.served[best.key] += 1
        return best

    def release(self, replica: Replica) -> None:
        if replica.in_flight <= 0:
            raise RuntimeError(f"release of {replica.key} with no call in flight")
        replica.in_flight -= 1

    def slots(self, stage: str) -> int:
        return sum(r.max_in_flight for r in self.pools[stage])
