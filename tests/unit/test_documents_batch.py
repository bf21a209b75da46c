"""The documents a parse-like stage makes travel with the batch (issue 32): run_stage moves
its document columns into Batch.documents and adds the documents it found inside others
(attachments, as rows or error rows) to doc_ids; pieces and slices carry them; the
documents table and the page column read them; a Parquet batch has none."""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa

from docintel.pipeline.batch import Batch
from docintel.pipeline.errors import DocumentsRejected
from docintel.pipeline.input.documents import _formats
from docintel.pipeline.output.documents import document_columns, found_documents, page_column
from docintel.pipeline.run.pieces import split
from docintel.pipeline.run.slices import join, slice_of
from docintel.pipeline.schema import (
    CONTENT,
    DOC_ID,
    DOCUMENT_COLUMNS,
    SENT_INDEX,
    START_CHAR,
    TEXT,
)
from docintel.pipeline.stages.base import Stage, run_stage


class FakeParse(Stage):
    """Each file's text is its bytes; ``m.eml`` also holds ``a.txt`` (a document) and
    ``bad.pdf`` (refused); ``x.pdf`` has two pages."""

    name: ClassVar[str] = "parse"
    input_columns: ClassVar[tuple[str, ...]] = (DOC_ID, CONTENT)
    output_columns: ClassVar[tuple[str, ...]] = (DOC_ID, TEXT, *DOCUMENT_COLUMNS)
    keeps_input: ClassVar[bool] = False
    document_columns: ClassVar[tuple[str, ...]] = DOCUMENT_COLUMNS

    def setup(self) -> None:
        self.backend, self.version = "cpu-fp32", "fake"

    def __call__(self, table: pa.Table) -> pa.Table:
        rows, rejected = [], {}
        for doc, data in zip(table[DOC_ID].to_pylist(), table[CONTENT].to_pylist(), strict=True):
            pages = [0, 5] if doc == "x.pdf" else None
            rows.append(_row(doc, data.decode(), "pdf" if pages else "txt", pages))
            if doc == "m.eml":
                rows.append(_row("m.eml/a.txt", "inner", "txt", None))
                rejected["m.eml/bad.pdf"] = ("CorruptFile", "m.eml/bad.pdf: corrupt")
        out = pa.Table.from_pylist(rows)
        if rejected:
            raise DocumentsRejected(rejected, out)
        return out


def _row(doc: str, text: str, fmt: str, pages: list[int] | None) -> dict:
    return {DOC_ID: doc, TEXT: text, "source_format": fmt, "n_pages": len(pages or []) or None,
            "title": f"T {doc}", "page_starts": pages}  # fmt: skip


def _read_batch(ids: list[str]) -> Batch:
    docs = pa.array(ids, pa.string())
    content = pa.array([f"text {d}".encode() for d in ids], pa.binary())
    table = pa.table({DOC_ID: docs, CONTENT: content})
    return Batch("b1", docs, table, documents=_formats(docs))


def _parsed() -> Batch:
    stage = FakeParse()
    stage.setup()
    return run_stage(stage, _read_batch(["x.pdf", "m.eml", "n.txt"]))


def test_found_documents_join_the_batch_and_the_columns_leave_the_rows() -> None:
    out = _parsed()
    assert out.doc_ids.to_pylist() == ["x.pdf", "m.eml", "n.txt", "m.eml/a.txt", "m.eml/bad.pdf"]
    assert out.table.column_names == [DOC_ID, TEXT]
    assert out.errors[DOC_ID].to_pylist() == ["m.eml/bad.pdf"]
    assert found_documents(out) == 2
    cols = document_columns(out)
    # the stage's formats replace the read task's ("eml" by name); a refused attachment's
    # is its name's
    assert cols["source_format"].to_pylist() == ["pdf", "txt", "txt", "txt", "pdf"]
    assert cols["title"].to_pylist()[0] == "T x.pdf" and cols["n_pages"].to_pylist()[0] == 2


def test_pages_come_from_the_page_starts() -> None:
    out = _parsed()
    sents = pa.table({DOC_ID: ["x.pdf", "x.pdf", "x.pdf", "n.txt"], START_CHAR: [0, 4, 5, 0]})
    assert page_column(out, sents).to_pylist() == [1, 1, 2, None]


def test_pieces_and_slices_carry_the_documents() -> None:
    out = _parsed()
    sents = pa.table({DOC_ID: ["x.pdf", "x.pdf", "m.eml", "n.txt", "m.eml/a.txt"],
                      SENT_INDEX: [0, 1, 0, 0, 0]})  # fmt: skip
    pieces = split(Batch("b1", out.doc_ids, sents, documents=out.documents), cap=2)
    assert len(pieces) > 1
    assert sum(found_documents(p) for p in pieces) == 2
    for p in pieces:
        assert set(p.documents[DOC_ID].to_pylist()) == set(p.doc_ids.to_pylist())
    # a parse call spilled as two slices: each slice's own documents win, found ones join
    stage = FakeParse()
    stage.setup()
    read = _read_batch(["x.pdf", "m.eml", "n.txt"])
    joined = join(tuple(run_stage(stage, slice_of(read, i, 2)) for i in range(2)))
    assert isinstance(joined, Batch)
    assert sorted(joined.doc_ids.to_pylist()) == sorted(out.doc_ids.to_pylist())
    assert document_columns(joined)["title"].to_pylist()[:3] == ["T x.pdf", "T m.eml", "T n.txt"]
    assert found_documents(joined) == 2


def test_a_parquet_batch_has_parquet_documents_and_no_pages() -> None:
    b = Batch("b", pa.array(["a", "b"]), pa.table({DOC_ID: ["a"], START_CHAR: [0]}))
    assert document_columns(b)["source_format"].to_pylist() == ["parquet", "parquet"]
    assert page_column(b, b.table).to_pylist() == [None]
    assert found_documents(b) == 0
