"""A user-defined stage from an out-of-tree package runs as its own pool, on CPU pools
and on (logical) GPU pools: its column lands in every sentence row, with its backend and
version, and every document is written exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from docintel.actors.runner import execute
from docintel.pipeline import registry
from tests.conftest import assert_exactly_once, run_config, write_docs
from tests.userstage import ENTRY, PACKAGE

pytestmark = pytest.mark.usefixtures("ray_cluster")

BUILTIN = ("sentencize", "embed", "classify")
TEXTS = [
    "Profit rose. The loss narrowed.",
    "Shares were flat.",
    "A loss, then a profit, then a loss.",
    "Revenue grew in every region. Profit margins held.",
]


def _expected_hits(text: str) -> int:
    lower = text.lower()
    return lower.count("profit") + lower.count("loss")


def _check(out: Path, ids: list[str], backend: str, stages: list[str]) -> None:
    tables = assert_exactly_once(out, ids)
    sents = tables["sentences"]
    assert len(sents) > 0
    assert (sents["keyword_hits"] == sents["text"].map(_expected_hits)).all()
    assert set(sents["keywords_backend"]) == {backend}
    assert set(sents["keywords_model"]) == {f"{PACKAGE}.keywords:Keywords"}
    schema = pq.read_schema(next((out / "sentences").glob("*.parquet")))
    assert str(schema.field("keyword_hits").type) == "int32"
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["backends"]["keywords"] == {backend: manifest["counts"]["batches"]}
    assert manifest["stages"] == stages
    names = schema.names  # the user's column after the contract's, then per-stage columns
    assert names.index("keyword_hits") < names.index("sentencize_backend")
    assert [n for n in names if n.endswith("_backend")] == [f"{s}_backend" for s in stages]


def _corpus(tmp_path: Path, n: int = 12) -> tuple[Path, list[str]]:
    ids = [f"u{i:02d}" for i in range(n)]
    texts = [TEXTS[i % len(TEXTS)] for i in range(n)]
    return write_docs(tmp_path / "in.parquet", ids, texts), ids


def test_user_stage_on_cpu_pools(tmp_path: Path, user_package: Path) -> None:
    inp, ids = _corpus(tmp_path)
    out = tmp_path / "out"
    cfg = run_config(
        **{
            "pipeline.stages": [*BUILTIN, ENTRY],
            "stages.keywords.words": ["profit", "loss"],
            "run.run_id": "user-cpu",
        }
    )
    summary = execute(cfg, str(inp), str(out))
    assert summary.documents == len(ids) and summary.replicas["keywords"] == {"cpu": 1}
    stages = registry.chain(cfg).names  # the listed ones plus the always-on built-ins
    assert stages[-1] == "keywords"
    _check(out, ids, "cpu-fp32", stages)


def test_user_stage_on_logical_gpu_pools(tmp_path: Path, user_package: Path) -> None:
    """Every stage on the session's one logical GPU (no CUDA: the replicas say gpu-sim),
    the user stage between sentencize and embed, with its own GPU fraction."""
    inp, ids = _corpus(tmp_path)
    out = tmp_path / "out"
    overrides: dict[str, object] = {
        "pipeline.stages": ["sentencize", ENTRY, "embed", "classify"],
        "stages.keywords.words": ["profit", "loss"],
        "run.run_id": "user-gpu",
        "run.spill": "gpu-only",
        "resources.keywords.gpu_fraction": 0.1,
        "resources.keywords.gpu_cpus": 0.1,
        # the session's GPU is declared to its Ray only: the plan sees no card, so the
        # GPU pools are fixed at one replica, as for the built-in stages below
        "resources.keywords.gpu_replicas": 1,
    }
    for stage, fraction in (("sentencize", 0.2), ("embed", 0.4), ("classify", 0.2)):
        overrides[f"resources.{stage}.gpu_replicas"] = 1
        overrides[f"resources.{stage}.gpu_fraction"] = fraction
        overrides[f"resources.{stage}.gpu_cpus"] = 0.1
    cfg = run_config(**overrides)
    summary = execute(cfg, str(inp), str(out))
    assert summary.replicas["keywords"] == {"gpu": 1}
    tables = assert_exactly_once(out, ids)
    assert set(tables["sentences"]["embed_backend"]) == {"gpu-sim"}
    stages = registry.chain(cfg).names
    assert stages.index("sentencize") < stages.index("keywords") < stages.index("embed")
    _check(out, ids, "gpu-sim", stages)
