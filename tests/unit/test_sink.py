"""Sink: the documents table contract, writing a batch, and reading it back as users do;
the Parquet-parts sink's run protocol (start, resume, finish, commit) without Ray.

The batch is made by the real chain: a real Parquet file read with read_unit (so a read
error is a real one), then sentencize, embed and classify through run_stage.
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from docintel.pipeline.batch import Batch
from docintel.pipeline.config import StorageConfig
from docintel.pipeline.errors import UsageError
from docintel.pipeline.formats.parquet import (
    ParquetPartsSink,
    part_files,
    part_path,
    read_batch_stats,
    write_batch,
)
from docintel.pipeline.input.source import plan, read_unit, resolve_input
from docintel.pipeline.output.sink import (
    atomic_write,
    documents_table,
    in_process,
    read_manifest,
    resolve_output,
    sentences_table,
    write_manifest,
)
from docintel.pipeline.schema import (
    DOC_ID,
    ERRORS_SCHEMA,
    TEXT,
    documents_schema,
    label_count_column,
    sentences_schema,
)
from docintel.pipeline.stages import run_stage
from docintel.pipeline.stages.base import Stage

STORAGE = StorageConfig()  # defaults: these tests write local files only
CHAIN = ("sentencize", "embed", "classify")  # the built-in stages, in chain order

DOCS = {
    "multi": b"Revenue rose 5% in Q2. Margins fell sharply. Guidance was cut! Shares dropped.",
    "blank": b"   \n\t  ",
    "bad_utf8": b"Profit \xff\xfe warning.",
    "null": None,
    "one": b"Strong quarter for $AAPL, beats on EPS",
    "long": (" ".join(["Sales grew in every region and every segment"] * 60) + ".").encode(),
    "empty": b"",
}


@pytest.fixture(scope="module")
def finished_batch(tmp_path_factory, sentencizer, embedder, classifier) -> Batch:
    path = tmp_path_factory.mktemp("sink_in") / "docs.parquet"
    pq.write_table(
        pa.table({DOC_ID: list(DOCS), TEXT: pa.array(list(DOCS.values()), pa.binary())}), path
    )
    fs, files = resolve_input(str(path), STORAGE)
    (unit,) = plan(fs, files, DOC_ID, TEXT, 100)
    (batch,) = read_unit(fs, unit, DOC_ID, TEXT, 100)
    for stage in (sentencizer, embedder, classifier):
        batch = run_stage(stage, batch)
    return batch


def test_documents_table_one_row_per_doc(finished_batch, classifier):
    labels = classifier.labels
    docs = documents_table(finished_batch, labels)
    assert docs.schema == documents_schema(labels)
    assert docs[DOC_ID].to_pylist() == list(DOCS)  # input order, every doc exactly once
    rows = {r[DOC_ID]: r for r in docs.to_pylist()}

    assert rows["bad_utf8"]["status"] == "error"
    assert [d for d, r in rows.items() if r["status"] == "error"] == ["bad_utf8"]

    sent_counts = pd.Series(finished_batch.table[DOC_ID].to_pylist()).value_counts().to_dict()
    for doc, r in rows.items():
        assert r["n_sentences"] == sent_counts.get(doc, 0), doc
        assert sum(r[label_count_column(lb)] for lb in labels) == r["n_sentences"], doc
        assert r["batch_id"] == finished_batch.batch_id
    assert rows["multi"]["n_sentences"] == 4
    assert rows["one"]["n_sentences"] == 1
    assert rows["long"]["n_truncated"] == 1
    assert rows["multi"]["n_truncated"] == 0

    for doc in ("blank", "bad_utf8", "null", "empty"):
        assert rows[doc]["n_sentences"] == 0
        assert rows[doc]["top_label"] is None, doc
        assert rows[doc]["top_score"] is None, doc
    for doc in ("multi", "one", "long"):
        assert rows[doc]["top_label"] in labels
        assert 0 < rows[doc]["top_score"] <= 1

    # a one-sentence document's top label and score are its sentence's
    sent = finished_batch.table.filter(pa.compute.equal(finished_batch.table[DOC_ID], "one"))
    assert rows["one"]["top_label"] == sent["label"][0].as_py()
    assert math.isclose(rows["one"]["top_score"], sent["score"][0].as_py(), rel_tol=1e-6)
    assert rows["one"][label_count_column(rows["one"]["top_label"])] == 1


def test_documents_table_top_label_is_the_mean_probability_argmax(finished_batch, classifier):
    labels = classifier.labels
    docs = {r[DOC_ID]: r for r in documents_table(finished_batch, labels).to_pylist()}
    t = finished_batch.table.filter(pa.compute.equal(finished_batch.table[DOC_ID], "multi"))
    probs = t["probs"].combine_chunks().flatten().to_numpy().reshape(-1, len(labels))
    mean = probs.mean(axis=0)
    assert docs["multi"]["top_label"] == labels[int(mean.argmax())]
    assert math.isclose(docs["multi"]["top_score"], float(mean.max()), rel_tol=1e-5)
    per_label = {lb: int((probs.argmax(axis=1) == j).sum()) for j, lb in enumerate(labels)}
    for lb, n in per_label.items():
        assert docs["multi"][label_count_column(lb)] == n


def test_errors_carry_the_read_failure(finished_batch):
    (err,) = finished_batch.errors.to_pylist()
    assert err[DOC_ID] == "bad_utf8"
    assert err["stage"] == "read"
    assert err["error_type"] == "UnicodeDecodeError"


def test_write_batch_and_read_back(tmp_path, finished_batch, classifier):
    labels = classifier.labels
    fs, root = resolve_output(str(tmp_path / "out"), STORAGE)
    stats = write_batch(fs, root, finished_batch, labels, embeddings=True)
    bid = finished_batch.batch_id
    for table in ("documents", "sentences", "errors"):
        assert Path(part_path(root, table, bid)).is_file()

    assert stats.batch_id == bid
    assert stats.documents == len(DOCS)
    assert stats.sentences == finished_batch.table.num_rows
    assert stats.errors == 1
    assert set(stats.backends) == {"sentencize", "embed", "classify"}
    assert "write" in stats.seconds
    assert stats.tokens == sum(finished_batch.table["n_tokens"].to_pylist()) > 0
    # a resumed run learns this batch from the documents part's footer alone
    again = read_batch_stats(fs, root, bid)
    assert (again.documents, again.sentences, again.errors, again.tokens, again.backends) == (
        stats.documents, stats.sentences, stats.errors, stats.tokens, stats.backends,
    )  # fmt: skip

    documents = ds.dataset(str(tmp_path / "out" / "documents"), format="parquet").to_table()
    sentences = ds.dataset(str(tmp_path / "out" / "sentences"), format="parquet").to_table()
    errors = ds.dataset(str(tmp_path / "out" / "errors"), format="parquet").to_table()
    assert documents.schema.equals(documents_schema(labels), check_metadata=False)
    assert sentences.schema.equals(sentences_schema(384, CHAIN), check_metadata=False)
    assert errors.schema.equals(ERRORS_SCHEMA, check_metadata=False)
    assert documents[DOC_ID].to_pylist() == list(DOCS)
    assert sentences.num_rows == finished_batch.table.num_rows
    assert errors[DOC_ID].to_pylist() == ["bad_utf8"]
    # every sentence row says how it was made
    for stage in ("sentencize", "embed", "classify"):
        assert set(sentences[f"{stage}_backend"].to_pylist()) == {finished_batch.backends[stage]}
        assert set(sentences[f"{stage}_model"].to_pylist()) == {finished_batch.versions[stage]}
    # offsets still point into the original text
    for row in sentences.select([DOC_ID, "start_char", "end_char", TEXT]).to_pylist():
        original = DOCS[row[DOC_ID]].decode()
        assert original[row["start_char"] : row["end_char"]] == row[TEXT]

    pdocs = pd.read_parquet(tmp_path / "out" / "documents")
    psents = pd.read_parquet(tmp_path / "out" / "sentences")
    perrs = pd.read_parquet(tmp_path / "out" / "errors")
    assert list(pdocs[DOC_ID]) == list(DOCS)
    assert len(psents) == finished_batch.table.num_rows
    assert len(perrs) == 1
    assert np.asarray(psents["embedding"].iloc[0]).shape == (384,)
    assert pd.isna(pdocs.set_index(DOC_ID).loc["blank", "top_label"])
    assert pd.isna(pdocs.set_index(DOC_ID).loc["blank", "top_score"])

    # nothing hidden or temporary left behind
    leftovers = [
        p for p in (tmp_path / "out").rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"
    ]
    assert leftovers == []


def test_write_batch_without_embeddings(tmp_path, finished_batch, classifier):
    fs, root = resolve_output(str(tmp_path / "out"), STORAGE)
    write_batch(fs, root, finished_batch, classifier.labels, embeddings=False)
    sentences = pq.read_table(part_path(root, "sentences", finished_batch.batch_id))
    assert "embedding" not in sentences.column_names
    assert "probs" not in sentences.column_names
    assert sentences.schema.equals(sentences_schema(None, CHAIN), check_metadata=False)


def test_atomic_write_leaves_no_temp_files(tmp_path):
    fs = pafs.LocalFileSystem()
    folder = tmp_path / "deep" / "er"
    table = pa.table({"a": [1, 2, 3]})
    atomic_write(fs, str(folder / "t.parquet"), table)
    atomic_write(fs, str(folder / "b.json"), b'{"x": 1}')
    assert sorted(p.name for p in folder.iterdir()) == ["b.json", "t.parquet"]
    assert pq.read_table(folder / "t.parquet").equals(table)
    # overwriting replaces the file, still without leftovers
    atomic_write(fs, str(folder / "t.parquet"), pa.table({"a": [9]}))
    atomic_write(fs, str(folder / "b.json"), b'{"x": 2}')
    assert sorted(p.name for p in folder.iterdir()) == ["b.json", "t.parquet"]
    assert pq.read_table(folder / "t.parquet")["a"].to_pylist() == [9]
    assert (folder / "b.json").read_bytes() == b'{"x": 2}'


def test_manifest_round_trip(tmp_path):
    fs, root = resolve_output(str(tmp_path / "out"), STORAGE)
    assert read_manifest(fs, root) is None
    write_manifest(fs, root, {"run_id": "r1", "batches": ["b1", "b2"], "path": tmp_path})
    got = read_manifest(fs, root)
    assert got == {"run_id": "r1", "batches": ["b1", "b2"], "path": str(tmp_path)}
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["_manifest.json"]


def test_documents_table_for_a_batch_of_blank_documents(
    sentencizer, embedder, classifier, docs_batch
):
    batch = docs_batch(["x", "y"], ["", None])
    for stage in (sentencizer, embedder, classifier):
        batch = run_stage(stage, batch)
    docs = documents_table(batch, classifier.labels).to_pylist()
    assert [d[DOC_ID] for d in docs] == ["x", "y"]
    for d in docs:
        assert d["status"] == "ok"
        assert d["n_sentences"] == 0
        assert d["top_label"] is None
        assert d["top_score"] is None


def test_documents_table_after_a_stage_error(sentencizer, embedder, classifier, docs_batch):
    """A document that fails in a stage (here a test-only stage before sentencize) is one
    'error' row with no sentences; its neighbours, re-assembled from bisected calls, are
    complete."""
    from .test_stage_base import PoisonStage

    poison = PoisonStage()
    poison.setup()
    ids = ["a", "b", "poison", "c", "d"]
    texts = ["First one. Second one.", "Only one here.", "Never read.", "", "Three. Two. One."]
    batch = docs_batch(ids, texts)
    for stage in (poison, sentencizer, embedder, classifier):
        batch = run_stage(stage, batch)
    docs = {r[DOC_ID]: r for r in documents_table(batch, classifier.labels).to_pylist()}
    assert list(docs) == ids
    assert {d: r["status"] for d, r in docs.items()} == {
        "a": "ok",
        "b": "ok",
        "poison": "error",
        "c": "ok",
        "d": "ok",
    }
    assert {d: r["n_sentences"] for d, r in docs.items()} == {
        "a": 2,
        "b": 1,
        "poison": 0,
        "c": 0,
        "d": 3,
    }
    assert batch.errors[DOC_ID].to_pylist() == ["poison"]
    assert batch.errors["stage"].to_pylist() == ["poison_test"]


def test_sentences_schema_of_the_built_in_chain_is_unchanged(finished_batch):
    """The three built-in stages write exactly the contract's columns, in its order: no
    column of the flowing table leaks out as a user-defined one."""
    assert list(finished_batch.backends) == list(CHAIN)
    sents = sentences_table(finished_batch, embeddings=True)
    assert sents.schema.equals(sentences_schema(384, CHAIN), check_metadata=False)
    assert sents.schema.names[-6:] == [f"{s}_backend" for s in CHAIN] + [
        f"{s}_model" for s in CHAIN
    ]


class KeywordStage(Stage):
    """Test-only user-defined stage after classify: counts keyword hits per sentence."""

    name: ClassVar[str] = "keywords"
    input_columns: ClassVar[tuple[str, ...]] = (TEXT,)
    output_columns: ClassVar[tuple[str, ...]] = ("keyword_hits",)

    def setup(self) -> None:
        self.backend = "cpu-fp32"
        self.version = "keywords@2"

    def __call__(self, table: pa.Table) -> pa.Table:
        hits = [t.lower().count("sales") for t in table[TEXT].to_pylist()]
        return table.append_column("keyword_hits", pa.array(hits, pa.int32()))


def test_a_user_stage_column_and_its_backend_are_written(tmp_path, finished_batch, classifier):
    stage = KeywordStage()
    stage.setup()
    batch = run_stage(stage, finished_batch)
    fs, root = resolve_output(str(tmp_path / "out"), STORAGE)
    write_batch(fs, root, batch, classifier.labels, embeddings=False)
    got = pq.read_table(part_path(root, "sentences", batch.batch_id))
    chain = (*CHAIN, "keywords")
    extra = [pa.field("keyword_hits", pa.int32())]
    assert got.schema.equals(sentences_schema(None, chain, extra), check_metadata=False)
    assert got.schema.field("keyword_hits").type == pa.int32()
    assert got.schema.names[-8:] == [f"{s}_backend" for s in chain] + [f"{s}_model" for s in chain]
    assert set(got["keywords_backend"].to_pylist()) == {"cpu-fp32"}
    assert set(got["keywords_model"].to_pylist()) == {"keywords@2"}
    expected = [t.lower().count("sales") for t in got[TEXT].to_pylist()]
    assert got["keyword_hits"].to_pylist() == expected
    assert max(expected) > 1  # the long document repeats it


def _sink(tmp_path: Path, labels: list[str], target: int = 0) -> ParquetPartsSink:
    fs, root = resolve_output(str(tmp_path / "out"), STORAGE)
    return ParquetPartsSink(fs, root, tuple(labels), True, target)


def _renamed(batch: Batch, batch_id: str) -> Batch:
    return Batch(batch_id, batch.doc_ids, batch.table, batch.errors, {}, batch.backends,
                 batch.versions)  # fmt: skip


def test_parquet_parts_sink_run_protocol(tmp_path, finished_batch, classifier):
    """start -> write -> resume (an earlier invocation's batches, from footers) -> finish
    (merged) -> commit, all through the RunSink interface, in this process."""
    sink = _sink(tmp_path, classifier.labels, target=10 * 2**20)
    assert len(pickle.dumps(sink)) < 2_000  # travels to every write task
    assert sink.open().manifest is None and sink.open().state is None
    sink.start({"run_id": "r1", "input": "x"})
    assert sink.open().state == {"run_id": "r1", "input": "x"}
    ids = ["aaaa-00000-00000", "aaaa-00000-00001", "aaaa-00001-00000"]
    written = {b: sink.write(_renamed(finished_batch, b)) for b in ids}
    again = sink.resume()
    assert set(again) == set(ids)
    assert {b: (s.documents, s.errors, s.backends) for b, s in again.items()} == {
        b: (s.documents, s.errors, s.backends) for b, s in written.items()
    }
    did = sink.finish(in_process)
    assert (did["merged_groups"], did["merged_batches"], did["parts_removed"]) == (1, 3, 9)
    files = sink.table_files()
    assert {t: f["files"] for t, f in files.items()} == dict.fromkeys(files, 1)
    assert set(sink.resume()) == set(ids)  # the merged footer holds every member's stats
    docs = ds.dataset(part_files(sink.fs, sink.root, "documents"), format="parquet")
    assert docs.to_table()[DOC_ID].to_pylist() == list(DOCS) * 3
    sink.commit({"run_id": "r1"})
    assert sink.open().manifest == {"run_id": "r1"}
    assert json.loads((tmp_path / "out" / "_manifest.json").read_text()) == {"run_id": "r1"}


def test_parquet_parts_sink_refuses_foreign_tables(tmp_path, finished_batch, classifier):
    sink = _sink(tmp_path, classifier.labels)
    sink.write(finished_batch)  # tables, but no run state: not a run of ours
    with pytest.raises(UsageError, match="already holds docintel tables"):
        sink.start({"run_id": "r2", "input": "x"})
    sink.abort()  # nothing to undo: the batch stays, whole
    assert read_batch_stats(sink.fs, sink.root, finished_batch.batch_id).documents == len(DOCS)
