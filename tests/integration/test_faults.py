"""Failures on purpose, against real parts: poison documents, killed actors, a killed driver."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import ray

from docintel.actors.cluster import actor_name
from docintel.actors.runner import execute
from docintel.pipeline.errors import RunFailed
from tests.conftest import (
    assert_exactly_once,
    kill_and_await_restart,
    run_config,
    sigkill_after_parts,
    write_docs,
)

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _corpus(tmp_path: Path, headlines: list[str], n: int, row_group: int = 4) -> tuple[Path, list]:
    ids = [f"d{i:03d}" for i in range(n)]
    texts = [" ".join(h.rstrip(".") + "." for h in headlines[i * 2 : i * 2 + 2]) for i in range(n)]
    return write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=row_group), ids


def test_poison_document_is_isolated(tmp_path: Path, headlines: list[str]) -> None:
    """A stage that raises for one document: one error row, full results for batch-mates."""
    inp, ids = _corpus(tmp_path, headlines, 9, row_group=9)
    cfg = run_config(
        **{"run.batch_size": 16, "faults.poison_stage": "embed", "faults.poison_doc_ids": ["d004"]}
    )
    out = tmp_path / "out"
    summary = execute(cfg, str(inp), str(out))
    tables = assert_exactly_once(out, ids)
    err = tables["errors"]
    assert err.doc_id.tolist() == ["d004"]
    assert err.stage.tolist() == ["embed"] and err.error_type.tolist() == ["InjectedFault"]
    assert "d004" in err.message.iloc[0]
    docs = tables["documents"].set_index("doc_id")
    assert docs.loc["d004", "status"] == "error" and docs.loc["d004", "n_sentences"] == 0
    ok = docs.drop(index="d004")
    assert (ok.status == "ok").all() and (ok.n_sentences >= 1).all()
    assert set(tables["sentences"].doc_id) == set(ids) - {"d004"}
    assert summary.errors == 1


def test_flood_of_errors_fails_the_run(tmp_path: Path, headlines: list[str]) -> None:
    inp, ids = _corpus(tmp_path, headlines, 6)
    cfg = run_config(**{"faults.poison_stage": "classify", "faults.poison_doc_ids": ids[:4]})
    out = tmp_path / "out"
    with pytest.raises(RunFailed, match=r"4 of 6 documents failed .*max_error_fraction"):
        execute(cfg, str(inp), str(out))
    assert not (out / "_manifest.json").exists()


def test_killed_stage_actor_is_restarted_and_nothing_is_lost(
    tmp_path: Path, headlines: list[str]
) -> None:
    inp, ids = _corpus(tmp_path, headlines, 24)
    cfg = run_config(**{"run.run_id": "kill1", "run.batch_size": 2})
    pids: list[int] = []

    def kill_embed_once(stats: object) -> None:
        if pids:
            return
        old, new = kill_and_await_restart(ray.get_actor(actor_name("kill1", "embed/cpu/0")))
        pids.extend(p for p in (old, new) if p is not None)

    out = tmp_path / "out"
    summary = execute(cfg, str(inp), str(out), on_batch=kill_embed_once)
    assert len(pids) == 2, "the embed actor was not replaced"
    assert summary.batches == 12 and summary.errors == 0
    assert_exactly_once(out, ids)


def test_sigkill_driver_then_resume_redoes_only_uncommitted(
    tmp_path: Path, headlines: list[str]
) -> None:
    inp, ids = _corpus(tmp_path, headlines, 80)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "docintel.jobs.cli",
        "run",
        str(inp),
        str(out),
        "--run-id",
        "crash1",
        "--batch-size",
        "2",
        "--num-cpus",
        "2",
        "--no-progress",
    ]
    parts = out / "documents"
    done_before = sigkill_after_parts(cmd, parts, 5)
    assert not (out / "_manifest.json").exists()
    assert 5 <= done_before < 40

    summary = execute(
        run_config(**{"run.run_id": "crash1", "run.batch_size": 2}), str(inp), str(out)
    )
    assert summary.skipped_batches == done_before
    assert summary.batches == 40 - done_before  # only uncommitted batches were redone
    assert_exactly_once(out, ids)
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["resumed_batches"] == done_before
    assert manifest["counts"]["batches"] == 40
    # all 40 small batches, both invocations', were merged into one part per table
    assert manifest["parts"]["merged_batches"] == 40
    assert [p.name[:12] for p in (out / "documents").iterdir()] == ["part-merged-"]
