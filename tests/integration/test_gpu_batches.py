"""Batches sized for GPU pools ("auto" batch size by text bytes) keep every guarantee:
every document exactly once with a poisoned document bisected out of a big batch and a
GPU replica killed mid-run, and resume after that. GPU replicas are modelled ([faults]
gpu_model_s_per_sentence, the sentencizer's too): the session's one logical GPU has no
CUDA, and the guarantees are the executor's, not the models'."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from docintel.actors.cluster import actor_name
from docintel.actors.runner import execute
from tests.conftest import assert_exactly_once, kill_and_await_restart, run_config

pytestmark = pytest.mark.usefixtures("ray_cluster")

DOCS = 6_000
BATCH_BYTES = 64 * 1024  # ~1,000 of these documents per batch: six batches


def _corpus(tmp_path: Path) -> tuple[Path, list[str]]:
    ids = [f"g{i:05d}" for i in range(DOCS)]
    texts = [f"Revenue rose {i % 97}% at unit {i}, the company said." for i in range(DOCS)]
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"doc_id": ids, "text": texts}), path, row_group_size=2_000)
    return path, ids


def _config(run_id: str, **more: object):
    o: dict[str, object] = {
        "run.run_id": run_id,
        "run.batch_size": "auto",
        "run.gpu_batch_bytes": BATCH_BYTES,
        "run.spill": "gpu-only",
        "run.embeddings": False,
        "run.part_target_mb": 0,  # each batch's own parts stay (the resume test drops some)
        "faults.gpu_model_s_per_sentence": 1e-5,
        "faults.gpu_model_rule_based": True,
    }
    for stage in ("sentencize", "embed", "classify"):
        o[f"resources.{stage}.gpu_replicas"] = 1
        o[f"resources.{stage}.gpu_cpus"] = 0.1
    o.update(more)
    return run_config(**o)


def test_big_batches_poison_and_a_killed_gpu_replica(tmp_path: Path) -> None:
    inp, ids = _corpus(tmp_path)
    poison = [ids[1234], ids[4321]]
    cfg = _config("gpubig", **{"faults.poison_stage": "embed", "faults.poison_doc_ids": poison})
    pids: list[int] = []

    def kill_embed_once(_stats: object) -> None:
        if pids:
            return
        old, new = kill_and_await_restart(ray.get_actor(actor_name("gpubig", "embed/gpu/0")))
        pids.extend(p for p in (old, new) if p is not None)

    out = tmp_path / "out"
    summary = execute(cfg, str(inp), str(out), on_batch=kill_embed_once)
    assert len(pids) == 2, "the GPU replica was not replaced"
    tables = assert_exactly_once(out, ids)
    manifest = json.loads((out / "_manifest.json").read_text())
    size = manifest["config"]["run"]["batch_size"]
    assert isinstance(size, int) and 500 <= size <= 2_000  # sized by bytes, recorded
    # batches are cut per row group (three of 2,000 documents)
    assert summary.batches == manifest["counts"]["batches"] == 3 * -(-2_000 // size)
    assert sorted(tables["errors"]["doc_id"]) == sorted(poison)  # bisected out, alone
    assert summary.errors == 2 and summary.documents == DOCS


def test_resume_of_big_batches_redoes_only_the_missing_ones(tmp_path: Path) -> None:
    inp, ids = _corpus(tmp_path)
    out = tmp_path / "out"
    first = execute(_config("gpuresume"), str(inp), str(out))
    assert first.documents == DOCS
    # a crash after some batches: drop the manifest and two committed batches' parts
    (out / "_manifest.json").unlink()
    parts = sorted((out / "documents").glob("*.parquet"))
    assert len(parts) >= 3
    for p in parts[:2]:
        for table in ("documents", "sentences", "errors"):
            (out / table / p.name).unlink(missing_ok=True)
    again = execute(_config("gpuresume"), str(inp), str(out))
    assert again.batches == 2 and again.skipped_batches == len(parts) - 2
    assert_exactly_once(out, ids)


# --- the hard bound on a batch's sentences (pipeline/run/pieces.py) ---------------------------

PIECE_ROWS = 300  # ~1,000-document batches of one-sentence documents: four pieces each


def _bounded(run_id: str, **more: object):
    return _config(
        run_id,
        **{"run.max_batch_sentences": PIECE_ROWS, "sentencize.max_sentences": PIECE_ROWS},
        **more,
    )


def test_batches_over_the_sentence_bound_split_into_pieces_exactly_once(tmp_path: Path) -> None:
    inp, ids = _corpus(tmp_path)
    poison = [ids[17], ids[4999]]
    cfg = _bounded("pieces", **{"faults.poison_stage": "classify", "faults.poison_doc_ids": poison})
    pids: list[int] = []

    def kill_classify_once(_stats: object) -> None:
        if pids:
            return
        old, new = kill_and_await_restart(ray.get_actor(actor_name("pieces", "classify/gpu/0")))
        pids.extend(p for p in (old, new) if p is not None)

    out = tmp_path / "out"
    summary = execute(cfg, str(inp), str(out), on_batch=kill_classify_once)
    assert len(pids) == 2, "the GPU replica was not replaced"
    tables = assert_exactly_once(out, ids)
    assert sorted(tables["errors"]["doc_id"]) == sorted(poison)
    # every committed unit is a piece of at most PIECE_ROWS sentences
    names = [p.stem for p in (out / "documents").glob("*.parquet")]
    assert names and all("-p" in n and "of" in n for n in names), names
    rows = [pq.read_metadata(p).num_rows for p in (out / "sentences").glob("*.parquet")]
    assert len(rows) == len(names) and max(rows) <= PIECE_ROWS
    assert sum(rows) == len(tables["sentences"])
    assert summary.batches == len(names) > DOCS / PIECE_ROWS
    assert summary.documents == DOCS and summary.errors == 2


def test_resume_redoes_only_the_missing_pieces(tmp_path: Path) -> None:
    inp, ids = _corpus(tmp_path)
    out = tmp_path / "out"
    first = execute(_bounded("piecesresume"), str(inp), str(out))
    assert first.documents == DOCS
    (out / "_manifest.json").unlink()
    parts = sorted((out / "documents").glob("*.parquet"))
    # a crash: one piece of the first batch and the whole of the last batch lost
    last = parts[-1].stem.rsplit("-p", 1)[0]
    lost = [parts[1], *(p for p in parts if p.stem.startswith(last + "-p"))]
    for p in lost:
        for table in ("documents", "sentences", "errors"):
            (out / table / p.name).unlink(missing_ok=True)
    again = execute(_bounded("piecesresume"), str(inp), str(out))
    assert again.batches == len(lost)
    assert again.skipped_batches == len(parts) - len(lost)
    assert_exactly_once(out, ids)
