"""Spill calls cut into slices for CPU replicas (pipeline/run/slices.py) and how the dispatcher
counts them: slices cut at document boundaries, joined back into exactly the unsliced
result, and a sizer that aims each slice at one GPU call's time."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from docintel.actors.stages import StageActor
from docintel.pipeline.batch import Batch
from docintel.pipeline.run.dispatch import Dispatcher, Replica
from docintel.pipeline.run.pieces import Pieces, Split, split
from docintel.pipeline.run.slices import (
    FIRST_SLICES,
    MAX_SLICES,
    MIN_SLICE_DOCS,
    MIN_TARGET_S,
    SliceSizer,
    join,
    slice_of,
)
from docintel.pipeline.schema import DOC_ID, empty_errors
from docintel.pipeline.stages.base import Stage


def _batch(sentences_per_doc: list[int]) -> Batch:
    docs = [f"d{i}" for i in range(len(sentences_per_doc))]
    rows = [(d, j) for d, n in zip(docs, sentences_per_doc, strict=True) for j in range(n)]
    table = pa.table(
        {
            DOC_ID: [d for d, _ in rows],
            "sent_index": [j for _, j in rows],
            "x": list(range(len(rows))),
        }
    )
    err = empty_errors()
    errors = pa.concat_tables([err, err.schema.empty_table()])
    return Batch("b1", pa.array(docs), table, errors, seconds={"sentencize": 2.0})


def _stage(b: Batch, name: str = "embed", seconds: float = 0.5) -> Batch:
    """What run_stage makes of a batch: the table unchanged, this stage's seconds added."""
    return Batch(
        b.batch_id,
        b.doc_ids,
        b.table,
        b.errors,
        {**b.seconds, name: seconds},
        {**b.backends, name: "cpu-int8"},
        {**b.versions, name: "v1"},
    )


@pytest.mark.parametrize("k", [1, 2, 3, 7, 40])
def test_slices_cut_at_document_boundaries_and_join_back_exactly(k: int) -> None:
    batch = _batch([3, 1, 7, 2, 2, 5, 1, 1, 9, 4])
    parts = [slice_of(batch, i, k) for i in range(k)]
    # every row in exactly one slice, no document across two
    assert sum(p.table.num_rows for p in parts) == batch.table.num_rows
    owners: dict[str, int] = {}
    for i, p in enumerate(parts):
        for doc in set(p.table.column(DOC_ID).to_pylist()):
            assert owners.setdefault(doc, i) == i, f"{doc} split across slices"
    joined = join(tuple(_stage(p) for p in parts))
    assert isinstance(joined, Batch)
    assert joined.table.equals(batch.table)  # rows in the unsliced order
    assert joined.doc_ids.equals(batch.doc_ids)  # every document of the batch, once
    # earlier stages' seconds counted once; this stage's summed over the slices
    assert joined.seconds == {"sentencize": 2.0, "embed": 0.5 * k}
    assert joined.backends == {"embed": "cpu-int8"} and joined.versions == {"embed": "v1"}


def test_errors_of_the_batch_ride_once_and_slices_add_theirs_in_order() -> None:
    batch = _batch([2, 2, 2, 2])
    e = empty_errors()
    row = {c: [None] for c in e.schema.names}
    row.update({DOC_ID: ["d0"], "batch_id": ["b1"], "stage": ["sentencize"]})
    batch.errors = pa.table(row, schema=e.schema)
    parts = [slice_of(batch, i, 4) for i in range(4)]
    assert [p.errors.num_rows for p in parts] == [1, 0, 0, 0]
    later = dict(row, **{DOC_ID: ["d3"], "stage": ["embed"]})
    parts[3].errors = pa.concat_tables([parts[3].errors, pa.table(later, schema=e.schema)])
    joined = join(tuple(parts))
    assert isinstance(joined, Batch)
    assert joined.errors.column(DOC_ID).to_pylist() == ["d0", "d3"]


def test_one_long_document_leaves_the_other_slices_empty_not_cut() -> None:
    batch = _batch([50, 1])
    parts = [slice_of(batch, i, 5) for i in range(5)]
    sizes = [p.table.num_rows for p in parts]
    assert sum(sizes) == 51 and max(sizes) == 50  # the 50 sentences stay together
    assert join(tuple(parts)).table.equals(batch.table)  # type: ignore[union-attr]


def test_split_markers_pass_through_and_a_disagreement_fails() -> None:
    assert join((Split(3), Split(3))) == Split(3)
    with pytest.raises(RuntimeError, match="disagree"):
        join((_batch([1]), Split(2)))


def test_sizer_aims_each_slice_at_one_gpu_call() -> None:
    sizer = SliceSizer()
    docs = 16_384
    assert sizer.slices("embed", gpu_s=0.3, docs=docs) == FIRST_SLICES  # nothing measured
    sizer.note("embed", seconds=3.0, k=8)  # a whole batch: 24 s of one CPU replica
    assert sizer.slices("embed", gpu_s=0.4, docs=docs) == 60  # 24 s / 0.4 s
    assert sizer.slices("embed", gpu_s=0.1, docs=docs) == MAX_SLICES  # floor 0.25 s, cap
    assert sizer.slices("embed", gpu_s=None, docs=docs) == MAX_SLICES  # 24 / MIN_TARGET_S
    sizer.note("classify", seconds=0.02, k=8)  # a fast stage: not sliced
    assert sizer.slices("classify", gpu_s=0.3, docs=docs) == 1
    # small batches (CPU-sized) are cut at most into MIN_SLICE_DOCS-document slices
    assert sizer.slices("embed", gpu_s=0.3, docs=128) == 128 // MIN_SLICE_DOCS
    assert sizer.slices("embed", gpu_s=0.3, docs=2) == 1
    assert MIN_TARGET_S > 0


def _pools(cpu_service: float, gpu_service: float, n_cpu: int = 2) -> Dispatcher:
    gpu = Replica("embed", 0, "gpu", max_in_flight=2, service_s=gpu_service)
    cpus = [
        Replica("embed", i, "cpu", max_in_flight=1, service_s=cpu_service) for i in range(n_cpu)
    ]
    return Dispatcher({"embed": [gpu, *cpus]})


def test_rule_one_counts_every_slice_of_a_spilled_batch() -> None:
    # GPU busy: one call of 1 s running, one queued; a CPU slice takes 0.3 s
    d = _pools(cpu_service=0.3, gpu_service=1.0)
    gpu = d.pools["embed"][0]
    gpu.submitted.extend([0.0, 0.0])
    gpu.max_in_flight = 3
    # whole batch as one CPU call (no slices): 0.3 s < the GPU's 2 s wait -> spill
    assert d._choose("embed", now=0.0).pool == "cpu"  # type: ignore[union-attr]
    # as 20 slices on two CPU replicas: 10 x 0.3 = 3 s > 2 s -> the GPU is not saturated
    d.slices["embed"] = 20
    assert d._choose("embed", now=0.0).pool == "gpu"  # type: ignore[union-attr]
    # as 4 slices: 0.6 s -> spill
    d.slices["embed"] = 4
    assert d._choose("embed", now=0.0).pool == "cpu"  # type: ignore[union-attr]


def test_slices_take_cpu_slots_without_counting_as_batches() -> None:
    d = _pools(cpu_service=0.3, gpu_service=1.0)
    d.set_outlook(True, {"embed": 3})
    first = d.acquire_slice("embed", now=0.0)
    second = d.acquire_slice("embed", now=0.0)
    assert first is not None and second is not None and {first.pool, second.pool} == {"cpu"}
    assert first is not second  # the free one, not a queue behind a busy one
    assert d.acquire_slice("embed", now=0.0) is None  # both CPU slots taken: wait
    assert d.remaining["embed"] == 3  # slices are not batches still to come
    assert d.release(first, now=0.25) == pytest.approx(0.25)  # the measured service time


class _Double(Stage):
    """A row-wise stage: doubles column x; fails for document d3 (isolated per document)."""

    name = "double"
    input_columns = ("x",)
    output_columns = ("y",)

    def setup(self) -> None:
        self.backend, self.version = "cpu-test", "v1"

    def __call__(self, table: pa.Table) -> pa.Table:
        if "d3" in table.column(DOC_ID).to_pylist():
            raise ValueError("bad document d3")
        return table.append_column("y", pc.multiply(table.column("x"), 2))


def test_the_actor_s_slices_joined_equal_its_whole_call_pieces_and_errors_included() -> None:
    actor = StageActor(_Double())
    batch = _batch([3, 1, 7, 2, 2, 5, 1, 1, 9, 4])
    whole = actor.process(batch)
    for k in (2, 5):
        parts = tuple(actor.process_slice(i, k, -1, batch) for i in range(k))
        joined = join(parts)
        assert isinstance(whole, Batch) and isinstance(joined, Batch)
        assert joined.table.equals(whole.table)  # d3's rows left out, the rest doubled
        assert joined.errors.column(DOC_ID).to_pylist() == ["d3"]  # one error row
        # the next stage's call joins the slices itself
        again = actor.process(*parts[:1], -1, *parts[1:])
        assert isinstance(again, Batch)
        assert again.errors.column(DOC_ID).to_pylist() == ["d3"]  # carried once, not k times
        assert again.table.num_rows == whole.table.num_rows
    # a batch that split into pieces: a first pass passes the marker on, slice by slice;
    # a piece's slices serve that piece
    pieces = Pieces(tuple(split(batch, 12)))
    assert len(pieces.pieces) > 1
    assert join(tuple(actor.process_slice(i, 3, -1, pieces) for i in range(3))) == Split(
        len(pieces.pieces)
    )
    one = join(tuple(actor.process_slice(i, 3, 1, pieces) for i in range(3)))
    ref = actor.process(pieces, 1)
    assert isinstance(one, Batch) and isinstance(ref, Batch)
    assert one.batch_id == ref.batch_id and one.table.equals(ref.table)


def test_slices_go_to_the_gpu_only_when_the_stage_has_no_cpu_replica_left() -> None:
    d = _pools(cpu_service=0.3, gpu_service=1.0)
    gpu = d.pools["embed"][0]
    first = d.acquire_slice("embed", now=0.0)
    assert first is not None and first.pool == "cpu"
    d.pools["embed"] = [gpu]  # the CPU replicas left with their node
    again = d.acquire_slice("embed", now=0.0)
    assert again is gpu
