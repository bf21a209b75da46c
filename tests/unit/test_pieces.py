"""The hard bound on a batch's sentences: pieces at document boundaries, exactly once."""

from __future__ import annotations

import pyarrow as pa
import pytest

from docintel.pipeline.batch import Batch
from docintel.pipeline.config import Config, ConfigError
from docintel.pipeline.run.pieces import (
    Pieces,
    Split,
    completed,
    parent,
    passed_on,
    piece_id,
    split,
    take,
)
from docintel.pipeline.schema import DOC_ID, SENT_INDEX, error_table


def _batch(sentences: dict[str, int], errors: tuple[str, ...] = ()) -> Batch:
    docs = list(sentences)
    rows = [(d, k) for d in docs for k in range(sentences[d])]
    table = pa.table(
        {
            DOC_ID: pa.array([d for d, _ in rows], pa.string()),
            SENT_INDEX: pa.array([k for _, k in rows], pa.int32()),
        }
    )
    errs = error_table(
        [
            {"doc_id": d, "stage": "sentencize", "error_type": "X", "message": "m", "batch_id": "b"}
            for d in errors
        ]
    )
    return Batch("f-00000-00001", pa.array(docs, pa.string()), table, errs, seconds={"s": 10.0})


def test_a_batch_within_the_bound_is_not_split() -> None:
    b = _batch({"a": 3, "b": 4})
    assert split(b, 7) == [b]


def test_pieces_cut_at_document_boundaries_and_keep_every_document() -> None:
    sizes = {"a": 3, "b": 0, "c": 4, "d": 2, "e": 5, "f": 1}
    b = _batch(sizes, errors=("b", "e"))
    pieces = split(b, 6)
    assert [p.batch_id for p in pieces] == [piece_id(b.batch_id, i, 3) for i in range(3)]
    assert [p.doc_ids.to_pylist() for p in pieces] == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert all(p.table.num_rows <= 6 for p in pieces)
    assert sum(p.table.num_rows for p in pieces) == b.table.num_rows
    for p in pieces:  # each piece holds exactly its documents' rows and errors
        assert set(p.table.column(DOC_ID).to_pylist()) <= set(p.doc_ids.to_pylist())
        assert set(p.errors.column(DOC_ID).to_pylist()) <= set(p.doc_ids.to_pylist())
    assert [p.errors.num_rows for p in pieces] == [1, 0, 1]
    assert pieces[2].errors.column("batch_id").to_pylist() == [pieces[2].batch_id]
    assert sum(p.seconds["s"] for p in pieces) == pytest.approx(10.0)
    assert [p.batch_id for p in split(b, 6)] == [p.batch_id for p in pieces]  # deterministic


def test_a_document_over_the_bound_is_kept_whole_alone() -> None:
    pieces = split(_batch({"a": 2, "big": 9, "c": 1}), 4)
    assert [p.doc_ids.to_pylist() for p in pieces] == [["a"], ["big"], ["c"]]


def test_a_batch_is_done_when_all_its_pieces_are() -> None:
    b = "f-00000-00001"
    assert parent(piece_id(b, 2, 3)) == (b, 2, 3) and parent(b) is None
    some = {piece_id(b, 0, 3), piece_id(b, 2, 3), "g-00000-00000"}
    assert b not in completed(some)
    assert b in completed({*some, piece_id(b, 1, 3)})
    assert completed(some) >= some


def test_take_refuses_a_piece_of_a_batch_that_did_not_split() -> None:
    b = _batch({"a": 1, "b": 1})
    pieces = split(b, 1)
    assert take(Pieces(tuple(pieces)), 1).doc_ids.to_pylist() == ["b"]
    assert take(b, -1) is b
    with pytest.raises(RuntimeError, match="deterministic"):
        take(b, 0)


def test_a_document_bound_over_the_batch_bound_is_refused_naming_both_keys() -> None:
    with pytest.raises(ConfigError, match=r"max_sentences.*max_batch_sentences"):
        Config().with_overrides({"run.max_batch_sentences": 1000})
    ok = Config().with_overrides(
        {"run.max_batch_sentences": 1000, "sentencize.max_sentences": 1000}
    )
    assert ok.run.max_batch_sentences == 1000


def test_pieces_keep_the_tables_schemas() -> None:
    b = _batch({"a": 2, "b": 2}, errors=("a",))
    for p in split(b, 2):
        assert p.errors.schema == b.errors.schema and p.table.schema == b.table.schema


def test_calls_after_a_split_pass_the_marker_on_until_the_driver_hands_out_pieces() -> None:
    pieces = Pieces(tuple(split(_batch({"a": 2, "b": 2, "c": 2}), 2)))
    assert passed_on(pieces, -1) == Split(3)  # the step after the split, not yet handed out
    assert passed_on(Split(3), -1) == Split(3)  # the later steps pass it on
    assert passed_on(pieces, 1) is None  # a piece: the call works on it
    assert passed_on(_batch({"a": 1}), -1) is None
