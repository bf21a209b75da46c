"""The Ray actor that hosts a stage replica. It loads its model once, in its own process.

Which stage object a replica holds (stage, pool, backend, faults) is decided on the driver
(docintel.pipeline.run.layout.build_stage, from the stage's registry entry); the actor only
hosts it."""

from __future__ import annotations

import os
from typing import Any

import ray

from docintel.actors.metrics import report_gpu_memory
from docintel.pipeline.batch import Batch
from docintel.pipeline.run.pieces import Pieces, Split, passed_on, split, take
from docintel.pipeline.run.slices import join, slice_of
from docintel.pipeline.schema import BACKEND_GPU_BF16, BACKEND_GPU_FP16, BACKEND_GPU_FP32
from docintel.pipeline.stages import Stage, run_stage

CUDA_BACKENDS = (BACKEND_GPU_FP16, BACKEND_GPU_BF16, BACKEND_GPU_FP32)  # not gpu-sim


class StageActor:
    """Holds one stage, whichever it is (built-in or user-defined): one generic actor class
    serves every stage. A failed ``setup()`` is reported by ``ready()``, not as a dead
    actor, so the driver can show the stage's own message (which model path, what was
    expected)."""

    def __init__(self, stage: Stage, key: str = "", split_cap: int = 0) -> None:
        self.stage = stage
        self.key = key  # stage/pool/index, for metrics
        # the stage that makes sentence rows: batches over this many rows leave it split
        # into pieces (pipeline/run/pieces.py); 0 = never split
        self.split_cap = split_cap
        self.setup_error: Exception | None = None
        try:
            stage.setup()
        except Exception as e:  # re-raised by ready()/process() with the original type
            self.setup_error = e

    def ready(self) -> dict[str, Any]:
        if self.setup_error is not None:
            raise self.setup_error
        return {
            "backend": self.stage.backend,
            "version": self.stage.version,
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
        }

    def process(
        self, batch: Batch | Pieces | Split, piece: int = -1, *more: Batch | Split
    ) -> Batch | Pieces | Split:
        """Run the stage on ``batch`` (its piece ``piece``, for a split batch). The stage
        that makes sentence rows returns a result over the bound as its :class:`Pieces`;
        the calls after it pass a :class:`Split` marker on (pipeline/run/pieces.py). ``more``:
        the previous stage ran as slices (pipeline/run/slices.py), ``batch`` and ``more`` are
        their results, joined first."""
        if self.setup_error is not None:
            raise self.setup_error
        if more:
            batch = join((batch, *more))  # type: ignore[arg-type]
        marker = passed_on(batch, piece)
        if marker is not None:
            return marker
        out = run_stage(self.stage, take(batch, piece))
        if self.stage.backend in CUDA_BACKENDS:
            report_gpu_memory(self.stage.name, self.key)
        if self.split_cap and out.table.num_rows > self.split_cap:
            pieces = split(out, self.split_cap)
            if len(pieces) > 1:
                return Pieces(tuple(pieces))
        return out

    def process_slice(
        self, i: int, k: int, piece: int, *parts: Batch | Pieces | Split
    ) -> Batch | Split:
        """Slice ``i`` of ``k`` of one call (a batch spilled to this CPU pool; see
        pipeline/run/slices.py); ``parts``: the input, or its slices when the previous stage
        ran sliced too."""
        if self.setup_error is not None:
            raise self.setup_error
        batch = join(parts) if len(parts) > 1 else parts[0]  # type: ignore[arg-type]
        marker = passed_on(batch, piece)
        if marker is not None:
            return marker
        return run_stage(self.stage, slice_of(take(batch, piece), i, k))
