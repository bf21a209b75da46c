"""Spill calls sized for the CPU replica that runs them: a batch cut into slices for one
stage, and joined again before the next step.

The commit unit is a batch sized for a GPU call (``run.batch_size = "auto"``: about
``run.gpu_batch_bytes`` of text, ~0.3 s of a card's work). A CPU replica of the same stage
is 30-100x slower: the whole batch as one spilled call would hold that replica for tens of
seconds, and the dispatcher, comparing a GPU queue with that call's length, would rarely
spill at all. So when the dispatcher sends a batch to a stage's CPU pool and the stage also
has GPU replicas, the driver cuts the call into ``k`` slices (``slice_of``: row ranges cut
at document boundaries), each its own call on whichever CPU replica is free, and the step
after the stage gets the ``k`` results and joins them (``join``) before it works. The
joined batch is the batch the unsliced call would have returned, rows in the same order,
so nothing downstream of the join (the write, the commit, exactly-once, resume) knows a
batch was sliced: the commit unit never changes, only the call unit does. A failed slice
fails the joining call, so the batch is retried from its read like any failed chain.

``k`` adapts per stage (:class:`SliceSizer`): the CPU time of a whole batch is measured
from each slice (slice time x slices), and the next spilled batch gets enough slices for
each to take about one GPU call's time (the stage's measured GPU service, at least
``MIN_TARGET_S``), at most ``MAX_SLICES``. The stage that makes sentence rows is never
sliced (its result may split into pieces: pipeline/run/pieces.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from docintel.pipeline.batch import Batch
from docintel.pipeline.run.pieces import Split
from docintel.pipeline.schema import DOC_ID, empty_errors

# A spilled call's target length when the stage's GPU calls are not measured yet, and its
# floor: below ~0.25 s the per-call cost (driver, Ray, the replica's fixed work) shows.
MIN_TARGET_S = 0.25
# At most this many slices per spilled call: a batch of 16,384 short sentences is then at
# least 256 rows a slice, and the driver's cost of a spilled batch stays ~64 calls.
MAX_SLICES = 64
# Slices of a stage's first spilled batch, before any CPU call of it is measured.
FIRST_SLICES = 8
# At least this many documents a slice: batches sized for CPU replicas (128 documents, the
# CPU default) are cut in two at most, and tiny batches never.
MIN_SLICE_DOCS = 64


def _cuts(doc_ids: pa.ChunkedArray | pa.Array, k: int) -> list[int]:
    """``k + 1`` row offsets (0 first, the row count last) that cut ``doc_ids`` into ``k``
    runs of about equal rows, each cut moved forward to where a new document starts."""
    n = len(doc_ids)
    if n == 0 or k <= 1:
        return [0, n]
    ids = doc_ids.combine_chunks() if isinstance(doc_ids, pa.ChunkedArray) else doc_ids
    starts = np.flatnonzero(
        np.asarray(pc.not_equal(ids.slice(1), ids.slice(0, n - 1)).to_numpy(zero_copy_only=False))
    )
    starts = np.append(starts + 1, n)  # rows where a document starts (and the end)
    cuts = [0]
    for j in range(1, k):
        at = int(starts[np.searchsorted(starts, math.ceil(n * j / k))])
        cuts.append(max(at, cuts[-1]))
    cuts.append(n)
    return cuts


def slice_of(batch: Batch, i: int, k: int) -> Batch:
    """Slice ``i`` of ``k`` of ``batch``'s rows for one stage call. The batch's errors and
    earlier stages' seconds ride on slice 0 only, so ``join`` adds them up once."""
    cuts = _cuts(batch.table.column(DOC_ID), k)
    table = batch.table.slice(cuts[i], cuts[i + 1] - cuts[i])
    if i == 0:
        return replace(batch, table=table)
    return replace(batch, table=table, errors=empty_errors(), seconds={})


def join(parts: tuple[Batch | Split, ...]) -> Batch | Split:
    """The stage's result for the whole batch from its slices' results, in slice order:
    rows and errors concatenated, the stage's seconds summed (CPU seconds of all slices)."""
    first = parts[0]
    if isinstance(first, Split) or len(parts) == 1:
        return first  # a batch that split into pieces: every slice passed the marker on
    batches = [p for p in parts if isinstance(p, Batch)]
    if len(batches) != len(parts):
        raise RuntimeError(f"batch {first.batch_id}: slices disagree on whether it split")
    seconds: dict[str, float] = {}
    for b in batches:
        for stage, s in b.seconds.items():
            seconds[stage] = seconds.get(stage, 0.0) + s
    doc_ids, documents = _documents(batches)
    return replace(
        first,
        doc_ids=doc_ids,
        documents=documents,
        table=pa.concat_tables([b.table for b in batches]),
        errors=pa.concat_tables([b.errors for b in batches]),
        seconds=seconds,
        backends={k: v for b in reversed(batches) for k, v in b.backends.items()},
        versions={k: v for b in reversed(batches) for k, v in b.versions.items()},
    )


def _documents(batches: list[Batch]) -> tuple[pa.Array, pa.Table | None]:
    """The batch's doc_ids and document columns from its slices. A slice of the stage that
    makes documents (parse) replaced the columns of the documents it parsed (those of its
    rows) and added the ones it found inside them (e-mail attachments); the others' are
    the read task's in every slice."""
    first = batches[0]
    if first.documents is None or len(batches) == 1:
        return first.doc_ids, first.documents
    ids = list(dict.fromkeys(d for b in batches for d in b.doc_ids.to_pylist()))
    rows: dict[str, dict] = {}
    for b in batches:
        assert b.documents is not None
        own = set(b.table.column(DOC_ID).to_pylist())
        for row in b.documents.to_pylist():
            if row[DOC_ID] in own or row[DOC_ID] not in rows:
                rows[row[DOC_ID]] = row
    table = pa.Table.from_pylist([rows[d] for d in ids if d in rows], first.documents.schema)
    return pa.array(ids, pa.string()), table


@dataclass
class SliceSizer:
    """How many slices a stage's next spilled batch gets (see the module docstring).

    ``note(stage, seconds, k)``: a slice of a batch cut in ``k`` took ``seconds`` on a CPU
    replica; ``gpu_s``: the stage's GPU service per call now (None: not measured)."""

    max_slices: int = MAX_SLICES
    whole_cpu_s: dict[str, float] = field(default_factory=dict)  # EWMA per stage
    alpha: float = 0.3

    def note(self, stage: str, seconds: float, k: int) -> None:
        whole = seconds * k
        old = self.whole_cpu_s.get(stage)
        a = self.alpha
        self.whole_cpu_s[stage] = whole if old is None else a * whole + (1 - a) * old

    def slices(self, stage: str, gpu_s: float | None, docs: int) -> int:
        """Slices for the stage's next spilled batch of ``docs`` documents."""
        cap = max(1, min(self.max_slices, docs // MIN_SLICE_DOCS))
        whole = self.whole_cpu_s.get(stage)
        if whole is None:
            return min(FIRST_SLICES, cap)
        target = max(MIN_TARGET_S, gpu_s or 0.0)
        return max(1, min(cap, math.ceil(whole / target)))
