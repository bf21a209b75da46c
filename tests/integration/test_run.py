"""End-to-end runs on a local Ray (2 CPUs): real Parquet in, real models, real tables out."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from docintel.actors.runner import execute
from docintel.pipeline import registry
from docintel.pipeline.errors import UsageError
from docintel.pipeline.stages.sentencize import joined
from tests.conftest import assert_exactly_once, run_config, write_docs

pytestmark = pytest.mark.usefixtures("ray_cluster")

NO_PUNCT_10K = ("lorem ipsum dolor sit amet " * 400)[:10_000]
ONE_MILLION = "growth " * 142_857 + "x"  # 1,000,000 chars, no sentence punctuation


def test_mixed_corpus_every_document_once(tmp_path: Path, headlines: list[str]) -> None:
    """Normal and hostile documents in a folder of two files: one row each, offsets hold."""
    normal = [" ".join(h.rstrip(".") + "." for h in headlines[i : i + 3]) for i in range(0, 30, 3)]
    hostile = [
        None,
        "",
        "   \n\t  ",
        "ctrl \x00\x07 chars\u200b here. And more!",
        NO_PUNCT_10K,
        ONE_MILLION,
    ]
    ids_a = [f"a{i}" for i in range(len(normal))]
    ids_b = [f"b{i}" for i in range(len(hostile))]
    write_docs(tmp_path / "in" / "part-a.parquet", ids_a, normal)
    write_docs(tmp_path / "in" / "sub" / "part-b.parquet", ids_b, hostile, row_group_size=3)
    out = tmp_path / "out"
    summary = execute(run_config(), str(tmp_path / "in"), str(out))

    tables = assert_exactly_once(out, ids_a + ids_b)
    docs = tables["documents"].set_index("doc_id")
    sents = tables["sentences"]
    assert summary.documents == 16 and summary.errors == 0
    assert (docs.status == "ok").all()
    assert docs.loc[["b0", "b1", "b2"], "n_sentences"].tolist() == [0, 0, 0]
    assert docs.loc[["b0", "b1", "b2"], "top_label"].isna().all()
    assert (docs.loc[ids_a, "n_sentences"] >= 2).all()  # a URL can swallow its full stop
    # the counts in documents/ agree with the rows in sentences/
    per_doc = sents.groupby("doc_id").size()
    assert per_doc.reindex(docs.index, fill_value=0).tolist() == docs.n_sentences.tolist()
    not_labels = ("n_sentences", "n_truncated", "n_unlabelled", "n_pages")
    label_cols = [c for c in docs.columns if c.startswith("n_") and c not in not_labels]
    assert sorted(label_cols) == ["n_bearish", "n_bullish", "n_neutral"]
    # each sentence counted once: under its label, or unlabelled (a language not trained on)
    assert (docs[label_cols].sum(axis=1) + docs.n_unlabelled == docs.n_sentences).all()
    # character offsets point into the original text (its line breaks joined when stored)
    originals = dict(zip(ids_a + ids_b, normal + hostile, strict=True))
    for row in sents.itertuples():
        assert joined(originals[row.doc_id][row.start_char : row.end_char]) == row.text
    # the 1M-char and the 10k-char "sentences" were cut to the model's 256 tokens, flagged
    assert docs.loc["b5", "n_sentences"] >= 10 and docs.loc["b5", "n_truncated"] >= 10
    assert docs.loc["b4", "n_truncated"] == 1
    assert sents.loc[sents.truncated, "n_tokens"].eq(256).all()
    # every row says how it was made
    assert set(sents.embed_backend) == {"cpu-fp32-onnx"}  # the fused fp32 graph
    assert set(sents.classify_backend) == {"cpu-fp32-onnx"}  # the head without TF
    assert sents.embed_model.str.startswith("encoder@").all()  # the fine-tuned default
    assert len(sents.embedding.iloc[0]) == 384
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["counts"]["documents"] == 16
    assert manifest["counts"]["sentences"] == len(sents)
    assert "committed_batches" not in manifest  # small: the documents/ listing is the record
    # the 5 small batches were merged into one file per table at the end of the run
    assert manifest["parts"]["merged_batches"] == manifest["counts"]["batches"] == 5
    for table in ("documents", "sentences", "errors"):
        names = [p.name for p in (out / table).iterdir()]
        assert len(names) == 1 and names[0].startswith("part-merged-"), names
        assert manifest["parts"]["tables"][table]["files"] == 1
    assert docs.batch_id.nunique() == 5  # each row still names the batch that made it
    assert manifest["backends"]["embed"] == {"cpu-fp32-onnx": manifest["counts"]["batches"]}


def test_undecodable_and_non_string_text_become_error_rows(tmp_path: Path) -> None:
    """Binary text with bad UTF-8 and an int64 text column: error rows, batch-mates fine."""
    inp = tmp_path / "in"
    write_docs(
        inp / "bytes.parquet",
        ["ok1", "bad", "ok2"],
        [b"Shares rose.", b"\xff\xfe broken", b"Fine text."],
        text_type=pa.binary(),
    )
    write_docs(inp / "ints.parquet", ["n1", "n2"], [1, 2])
    out = tmp_path / "out"
    cfg = run_config(**{"run.embeddings": False, "run.max_error_fraction": 1.0})
    summary = execute(cfg, str(inp), str(out))
    tables = assert_exactly_once(out, ["ok1", "bad", "ok2", "n1", "n2"])
    errors = tables["errors"].set_index("doc_id")
    assert sorted(errors.index) == ["bad", "n1", "n2"]
    assert errors.loc["bad", "error_type"] == "UnicodeDecodeError"
    assert "bytes.parquet" in errors.loc["bad", "message"]
    assert errors.loc["n1", "error_type"] == "TypeError"
    assert "'text'" in errors.loc["n1", "message"] and "int64" in errors.loc["n1", "message"]
    docs = tables["documents"].set_index("doc_id")
    assert docs.loc["ok1", "n_sentences"] == 1 and docs.loc["ok2", "n_sentences"] == 1
    assert "embedding" not in tables["sentences"].columns
    assert summary.errors == 3


def test_integer_ids_and_custom_columns(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"uuid": [10, 11, 12], "body": ["A.", "B c.", "D e f."]}), path)
    out = tmp_path / "out"
    execute(
        run_config(**{"input.id_column": "uuid", "input.text_column": "body"}), str(path), str(out)
    )
    assert_exactly_once(out, ["10", "11", "12"])


def test_rerun_and_resume_redo_only_missing_batches(tmp_path: Path, headlines: list[str]) -> None:
    ids = [f"d{i:02d}" for i in range(24)]
    inp = write_docs(tmp_path / "in.parquet", ids, headlines[:24], row_group_size=8)
    out = tmp_path / "out"
    # one part per batch (no compaction), so a crash can be staged by deleting parts
    cfg = run_config(**{"run.run_id": "r1", "run.embeddings": False, "run.part_target_mb": 0})
    first = execute(cfg, str(inp), str(out))
    assert first.batches == 6 and first.skipped_batches == 0
    before = assert_exactly_once(out, ids)

    again = execute(cfg, str(inp), str(out))  # completed: a no-op that says so
    assert again.already_complete and again.documents == 24

    # simulate a crash after 4 of 6 batches: no manifest, two documents parts missing
    (out / "_manifest.json").unlink()
    lost = sorted((out / "documents").iterdir())[:2]
    for p in lost:
        p.unlink()
    with pytest.raises(UsageError, match="unfinished run 'r1'"):
        execute(run_config(**{"run.embeddings": False}), str(inp), str(out))
    resumed = execute(cfg, str(inp), str(out))
    assert resumed.batches == 2 and resumed.skipped_batches == 4
    # every batch of the run is counted per backend, the resumed ones from their rows
    assert set(resumed.backends) == set(registry.chain(cfg).names)
    for stage in resumed.backends:
        assert sum(resumed.backends[stage].values()) == 6, resumed.backends
    after = assert_exactly_once(out, ids)
    key = ["doc_id", "sent_index"]
    assert (
        after["sentences"].sort_values(key).label.tolist()
        == before["sentences"].sort_values(key).label.tolist()
    )


def test_refuses_other_runs_output(tmp_path: Path, headlines: list[str]) -> None:
    inp = write_docs(tmp_path / "in.parquet", ["x", "y"], headlines[:2])
    out = tmp_path / "out"
    execute(run_config(**{"run.run_id": "first"}), str(inp), str(out))
    with pytest.raises(UsageError, match="already holds completed run 'first'"):
        execute(run_config(**{"run.run_id": "second"}), str(inp), str(out))


def test_corrupt_text_pages_become_error_rows(tmp_path: Path) -> None:
    """A row group whose text pages are corrupt (footer and ids intact): its documents are
    error rows naming the file and row group; the other row group is processed."""
    import pyarrow.parquet as pq

    path = tmp_path / "corrupt.parquet"
    ids = [f"c{i}" for i in range(8)]
    texts = [f"Revenue rose {i}%. Costs fell." for i in range(8)]
    pq.write_table(
        pa.table({"doc_id": ids, "text": texts}), path, row_group_size=4, compression="none"
    )
    offset = pq.ParquetFile(path).metadata.row_group(1).column(1).data_page_offset
    raw = bytearray(path.read_bytes())
    raw[offset : offset + 12] = b"\xff" * 12  # smash the page header of row group 1's text
    path.write_bytes(bytes(raw))
    out = tmp_path / "out"
    cfg = run_config(**{"run.max_error_fraction": 1.0, "run.embeddings": False})
    summary = execute(cfg, str(path), str(out))
    tables = assert_exactly_once(out, ids)
    errors = tables["errors"].set_index("doc_id")
    assert sorted(errors.index) == ids[4:]
    assert set(errors.error_type) == {"CorruptData"}
    assert "corrupt.parquet (row group 1)" in errors.message.iloc[0]
    docs = tables["documents"].set_index("doc_id")
    assert (docs.loc[ids[:4], "n_sentences"] == 2).all()
    assert summary.errors == 4


def test_driver_and_ray_workers_import_the_same_modules() -> None:
    """Ray workers unpickle stage classes by module name: they must resolve the docintel.*
    namespace to the very files the driver (and pytest, and ruff) use. A user's own
    `pipeline/` folder next to the driver cannot shadow them: no name is bare."""
    import ray

    from docintel.pipeline.stages import embed

    @ray.remote(num_cpus=0.1)
    def where() -> str:
        import docintel.pipeline.stages.embed as worker_embed

        return str(worker_embed.__file__)

    assert ray.get(where.remote()) == embed.__file__
