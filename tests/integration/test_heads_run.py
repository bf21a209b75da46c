"""Two extra classifier heads ([classify.heads]) through whole runs on a local Ray: on CPU
pools (ONNX fp32) beside a run without them, and on logical-GPU pools that spill to int8
CPU replicas into Delta tables. The default head's columns do not change; each extra head
adds NAME_label and NAME_score to sentences and documents."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.fs as pafs
import pytest

from docintel.actors.runner import execute
from docintel.pipeline.config import ClassifyConfig
from docintel.pipeline.errors import ConfigError, UsageError
from docintel.pipeline.report import write_report
from docintel.pipeline.search.query import search
from docintel.pipeline.search.source import Filters
from tests.conftest import assert_exactly_once, run_config, write_docs

pytestmark = pytest.mark.usefixtures("ray_cluster")

GPU_STAGES = ("sentencize", "embed", "classify")
HEAD_COLUMNS = ["topic_label", "topic_score", "old_label", "old_score"]


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two copies of the bundled head: ``topic`` as it is, ``old`` as an older docintel
    wrote it (no languages, no calibration record)."""
    root = tmp_path_factory.mktemp("heads")
    src = ClassifyConfig().resolved_model_dir()
    for name in ("topic", "old"):
        shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("encoder"))
    rec = json.loads((root / "old" / "training.json").read_text())
    rec.pop("languages", None)
    rec.pop("calibration", None)
    (root / "old" / "training.json").write_text(json.dumps(rec))
    return {name: str(root / name) for name in ("topic", "old")}


def _corpus(tmp_path: Path, headlines: list[str], n: int) -> tuple[Path, list[str]]:
    ids = [f"h{i:02d}" for i in range(n)] + ["blank"]
    texts = [" ".join(headlines[2 * i : 2 * i + 2]) for i in range(n)] + ["   "]
    return write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=6), ids


def _check_heads(docs: pd.DataFrame, sents: pd.DataFrame) -> None:
    """Copies of the default head label as it does; a document's label is the arg-max of
    its sentences' mean probabilities (the default's top_label, for copies), null without
    sentences."""
    assert sents.topic_label.tolist() == sents.label.tolist()
    assert np.allclose(sents.topic_score, sents.score, atol=1e-6, equal_nan=True)
    assert sents.old_label.tolist() == sents.label.tolist()  # English sentences only
    docs = docs.set_index("doc_id").sort_index()
    assert docs.topic_label.tolist() == docs.top_label.tolist()
    assert np.allclose(docs.topic_score, docs.top_score, atol=1e-6, equal_nan=True)
    assert pd.isna(docs.loc["blank", "topic_label"]) and pd.isna(docs.loc["blank", "old_score"])


def test_two_extra_heads_on_cpu_pools_leave_the_default_columns_alone(
    tmp_path: Path, headlines: list[str], heads: dict[str, str]
) -> None:
    inp, ids = _corpus(tmp_path, headlines, 20)
    plain, with_heads = tmp_path / "plain", tmp_path / "heads"
    execute(run_config(**{"run.run_id": "plain"}), str(inp), str(plain))
    execute(
        run_config(**{"run.run_id": "heads", "classify.heads": heads}), str(inp), str(with_heads)
    )
    a, b = assert_exactly_once(plain, ids), assert_exactly_once(with_heads, ids)
    for table in ("documents", "sentences"):
        key = ["doc_id", "sent_index"] if table == "sentences" else ["doc_id"]
        old = a[table].sort_values(key).reset_index(drop=True)
        new = b[table].sort_values(key).reset_index(drop=True)
        # the default's columns, values and order: unchanged; the heads' four follow
        same = [c for c in old.columns if c != "batch_id"]
        pd.testing.assert_frame_equal(old[same], new[same])
        assert [c for c in new.columns if c not in old.columns] == HEAD_COLUMNS
        assert not [c for c in new.columns if c.startswith("probs")]
    _check_heads(b["documents"], b["sentences"])
    assert set(b["sentences"].classify_backend) == {"cpu-fp32-onnx"}
    manifest = json.loads((with_heads / "_manifest.json").read_text())
    recorded = {h["name"]: h for h in manifest["heads"]}
    assert list(recorded) == ["topic", "old"] and recorded["old"]["dir"] == heads["old"]
    assert recorded["topic"]["labels"] == manifest["labels"]
    assert recorded["topic"]["version"].startswith("topic@")
    assert manifest["plan"]["heads"] == {n: h["version"] for n, h in recorded.items()}
    _search_and_report_by_head(plain, with_heads)


def _search_and_report_by_head(plain: Path, out: Path) -> None:
    """``search --label NAME.label`` and ``[audit] risk_labels`` take an extra head's labels
    in any case; a copy of the default head finds and ranks what the default does; the
    report names the heads; an unknown label is refused naming the heads' labels."""
    query = ["profit warning and falling shares"]
    by_head = search(str(out), query, top=5, filters=Filters(label="TOPIC.bearish"), exact=True)
    by_default = search(str(out), query, top=5, filters=Filters(label="bearish"), exact=True)
    assert [h["doc_id"] for h in by_head.hits[0]] == [h["doc_id"] for h in by_default.hits[0]]
    assert {h["label"] for h in by_head.hits[0]} == {"Bearish"}
    with pytest.raises(UsageError, match=r"topic\.Bearish"):
        search(str(out), query, filters=Filters(label="topic.nope"), exact=True)
    fs, audit = pafs.LocalFileSystem(), {"date": "2026-03-01", "ran": True}
    rep = write_report(fs, str(out), audit, [], ["Topic.BEARISH"], 5)
    base = write_report(fs, str(plain), audit, [], "Bearish", 5)
    assert rep["risk_labels"] == ["topic.Bearish"] and base["risk_labels"] == ["Bearish"]
    assert [h["name"] for h in rep["heads"]] == ["topic", "old"] and base["heads"] == []
    assert rep["heads"][0]["labels"] == rep["labels"]
    ranks = [[(r["doc_id"], r["risk_score"]) for r in x["review"]] for x in (rep, base)]
    assert ranks[0] == ranks[1] and rep["top_risk"] == base["top_risk"]
    with pytest.raises(ConfigError, match=r"old\.Bullish"):
        write_report(fs, str(out), audit, [], ["old.nope"], 5)


def test_two_extra_heads_on_logical_gpu_pools_and_int8_spill(
    tmp_path: Path, headlines: list[str], heads: dict[str, str], int8_encoder: Path
) -> None:
    """GPU replicas (Keras, gpu-sim) saturate and spill to int8 CPU replicas: both label
    every head in the same call; the output is Delta tables (a warehouse's schemas)."""
    from deltalake import DeltaTable

    inp, ids = _corpus(tmp_path, headlines, 24)
    out = tmp_path / "out"
    overrides: dict[str, object] = {
        "embed.int8_dir": str(int8_encoder),
        "run.run_id": "gpuheads",
        "run.spill": "auto",
        "run.batch_size": 2,
        "resources.embed.cpus": 0.5,
        "faults.gpu_delay_s": 0.5,
        "output.format": "delta",
        "classify.heads": heads,
    }
    for stage in GPU_STAGES:
        overrides[f"resources.{stage}.gpu_replicas"] = 1
        overrides[f"resources.{stage}.gpu_cpus"] = 0.1
    execute(run_config(**overrides), str(inp), str(out))
    tables = {t: DeltaTable(str(out / t)).to_pandas() for t in ("documents", "sentences")}
    docs, sents = tables["documents"], tables["sentences"]
    assert sorted(docs.doc_id) == sorted(ids)
    assert set(sents.classify_backend) == {"gpu-sim", "cpu-int8"}
    _check_heads(docs, sents)
    assert docs.topic_score.dtype == np.float32 and sents.old_score.dtype == np.float32


def _warehouse_tables(out: Path, fmt: str) -> dict[str, pd.DataFrame]:
    """The tables as a reader of the warehouse loads them (docs/output-formats.md)."""
    if fmt == "delta":
        from deltalake import DeltaTable

        return {t: DeltaTable(str(out / t)).to_pandas() for t in ("documents", "sentences")}
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("docintel", uri=f"sqlite:///{out}/_catalog.db", warehouse=f"file://{out}")
    return {
        t: cat.load_table(f"docintel.{t}").scan().to_pandas() for t in ("documents", "sentences")
    }


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_head_added_later_adds_its_columns_to_a_warehouse(
    tmp_path: Path, headlines: list[str], heads: dict[str, str], fmt: str
) -> None:
    """A run with extra heads into Iceberg or Delta tables an earlier run without them
    made: the tables gain the heads' columns (null on the earlier run's rows) instead of
    refusing the run."""
    inp, ids = _corpus(tmp_path, headlines, 6)
    later_ids = [f"n{i}" for i in range(6)]
    later_inp = write_docs(tmp_path / "later.parquet", later_ids, headlines[20:26])
    out = tmp_path / "wh"
    execute(run_config(**{"run.run_id": "before", "output.format": fmt}), str(inp), str(out))
    later = {"run.run_id": "after", "output.format": fmt, "classify.heads": heads}
    execute(run_config(**later), str(later_inp), str(out))
    tables = _warehouse_tables(out, fmt)
    assert sorted(tables["documents"].doc_id) == sorted([*ids, *later_ids])
    for table, rows in tables.items():
        assert set(HEAD_COLUMNS) <= set(rows.columns), (table, list(rows.columns))
        after = rows.doc_id.isin(later_ids)
        assert after.sum() >= 6 and (~after).sum() >= 6, table
        assert rows.loc[~after, HEAD_COLUMNS].isna().all().all(), table  # earlier: null
        assert rows.loc[after, HEAD_COLUMNS].notna().all().all(), table
