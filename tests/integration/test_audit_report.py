"""What the nightly audit reports, on real runs: the documents to review first, what changed
tonight (with a changed document's added sentences), the latest/ view and the corpus trend,
and a failed audit that leaves no half-made state. Uses test_audit.py's three nights."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from typer.testing import CliRunner

from docintel.actors.runner import execute
from docintel.jobs.cli import app
from docintel.pipeline.audit import run_audit
from docintel.pipeline.errors import DocintelError
from docintel.pipeline.schema import UNLABELLED
from tests.integration import test_audit
from tests.integration.test_audit import D1, D2, D3, Nights, _cfg, _texts, _write

pytestmark = pytest.mark.usefixtures("ray_cluster")
nights = test_audit.nights  # the three nights (a fixture of this module too)

ADDED = "Shares fell sharply after the warning."


def _report(n: Nights, day: str) -> dict:
    return json.loads((n.out / f"run_date={day}" / "report.json").read_text())


def _csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def test_changes_name_every_document_and_the_added_sentence(nights: Nights) -> None:
    n = nights
    ch = _report(n, D2)["changes"]
    assert ch["new"] == sorted(n.c) and ch["removed"] == ["b9"]
    (b3,) = ch["changed"]
    assert b3["doc_id"] == "b3" and b3["previous_date"] == D1
    assert b3["added"] == [ADDED] and b3["removed"] == []
    # the added sentence's label is the one the night's run gave it
    sents = pd.read_parquet(n.out / f"run_date={D2}" / "sentences")
    label = sents[(sents.doc_id == "b3") & (sents.text == ADDED)].label.item()
    assert b3["added_detail"][0]["label"] == label
    rows = _csv(n.out / f"run_date={D2}" / "changes.csv")
    assert sorted((r["doc_id"], r["change"]) for r in rows) == sorted(
        [*((c, "new") for c in n.c), ("b3", "changed"), ("b9", "removed")]
    )
    assert _report(n, D1)["changes"]["new"] == sorted(n.a + n.b)
    assert _report(n, D3)["changes"] == {
        "new": [], "changed": [], "removed": [], "reprocessed": 0, "detail_max": 1000,
    }  # fmt: skip
    page = (n.out / f"run_date={D2}" / "report.html").read_text()
    assert ADDED in page and 'id="changes-removed"' in page


def test_review_ranks_the_nights_documents_by_risk(nights: Nights) -> None:
    n = nights
    rep = _report(n, D2)
    risk = rep["risk_label"]
    sents = pd.read_parquet(n.out / f"run_date={D2}" / "sentences")
    # the score, computed here from the sentences: M = sum of risk scores, S = M*M/N
    mass = sents.score.where(sents.label == risk, 0.0).groupby(sents.doc_id).sum()
    count = sents.groupby("doc_id").size()
    expected = (mass * mass / count).to_dict()
    review = rep["review"]
    assert rep["review_total"] == len(review) == 6
    assert {r["doc_id"]: r["status"] for r in review} == {
        **dict.fromkeys(n.c, "new"), "b3": "changed",
    }  # fmt: skip
    for r in review:
        assert r["risk_score"] == pytest.approx(expected[r["doc_id"]], abs=1e-5)
        assert all(s["label"] == risk for s in r["sentences"])
    scores = [r["risk_score"] for r in review]
    assert scores == sorted(scores, reverse=True)
    rows = _csv(n.out / f"run_date={D2}" / "review.csv")
    assert [r["doc_id"] for r in rows] == [r["doc_id"] for r in review]
    drill = {d["doc_id"]: d for d in rep["drilldown"]}
    assert len(drill["b3"]["sentences"]) == int(count["b3"])


def test_latest_view_holds_each_current_document_once(nights: Nights) -> None:
    n = nights
    latest = n.out / "latest"
    current = sorted(n.a + n.b[:9] + n.c)
    docs = pd.read_parquet(latest / "documents")
    assert sorted(docs.doc_id) == current  # b3 once (its night-2 version), b9 gone
    assert docs.set_index("doc_id").run_date.astype(str).to_dict()["b3"] == D2
    sents = pd.read_parquet(latest / "sentences")
    assert ADDED in set(sents[sents.doc_id == "b3"].text)
    assert "embedding" not in sents.columns
    # all partitions hold b3 twice; the documented DuckDB query over latest/ does not
    glob = f"{latest}/sentences/*.parquet"
    q = f"SELECT label, count(*) FROM read_parquet('{glob}') GROUP BY label"
    # null labels (sentences in a language the head does not read) are the report's
    # "(unlabelled)"
    counts = {UNLABELLED if k is None else k: v for k, v in duckdb.sql(q).fetchall()}
    corpus = _report(n, D3)["corpus"]
    assert corpus["label_counts"] == counts and corpus["documents"] == len(current)
    every = pd.read_parquet(n.out / f"run_date={D1}" / "sentences")
    assert corpus["sentences"] != len(every) + len(
        pd.read_parquet(n.out / f"run_date={D2}" / "sentences")
    )
    marker = json.loads((latest / "_latest.json").read_text())
    assert marker["date"] == D3 and marker["documents"] == len(current)
    trend = _report(n, D3)["trend"]
    assert [p["corpus"]["documents"] for p in trend] == [20, 24, 24]
    assert [p["documents"] for p in trend] == [20, 6, 0]


def test_latest_view_is_rebuilt_when_missing(nights: Nights, tmp_path: Path,
                                             headlines: list[str]) -> None:  # fmt: skip
    out = tmp_path / "copy"
    shutil.copytree(nights.out, out)
    shutil.rmtree(out / "latest")  # an audit root from before the view existed
    src = tmp_path / "source"
    shutil.copytree(nights.source, src)
    _write(src / "d.parquet", ["d0"], _texts(headlines, 30, 1))
    run_audit(_cfg(), str(src), str(out), "2026-01-04", execute)
    docs = pd.read_parquet(out / "latest" / "documents")
    assert sorted(docs.doc_id) == sorted([*nights.a, *nights.b[:9], *nights.c, "d0"])


@pytest.mark.parametrize("kind", ["missing", "not-parquet", "duplicate-ids"])
def test_a_failed_audit_leaves_no_half_made_state(
    tmp_path: Path, headlines: list[str], kind: str
) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    if kind == "not-parquet":
        (src).mkdir()
        (src / "notes.csv").write_text("hello")  # neither Parquet nor a document file
    elif kind == "duplicate-ids":
        _write(src / "x.parquet", ["x0", "x1"], _texts(headlines, 0, 2))
        _write(src / "y.parquet", ["x1", "y1"], _texts(headlines, 2, 2))
    with pytest.raises(DocintelError):
        run_audit(_cfg(), str(src / "*" if kind == "missing" else src), str(out), D1, execute)
    assert not out.exists()  # the audit made it, and took it away again
    out.mkdir()
    result = CliRunner().invoke(
        app, ["audit", "--source", str(src), "--output", str(out), "--date", D1]
    )
    assert result.exit_code == 2, result.output
    assert list(out.iterdir()) == []  # an existing root stays, without an empty _audit/


def test_watch_list_shows_each_saved_querys_top_sentences_of_the_night(
    tmp_path: Path, headlines: list[str]
) -> None:
    """[audit] watch: each saved query's top sentences among the night's documents are in
    report.json (key ``watch``) and the page's watch list, the same hits `docintel search`
    gives on the night's partition."""
    from docintel.pipeline.search.query import search

    src, out = tmp_path / "source", tmp_path / "out"
    ids = [f"w{i}" for i in range(8)]
    _write(src / "w.parquet", ids, [*_texts(headlines, 0, 7), ADDED])
    queries = ["shares fell sharply", "profit rose"]
    cfg = _cfg(**{"run.embeddings": True, "audit.watch": queries, "audit.watch_top": 3})
    run_audit(cfg, str(src), str(out), D1, execute)
    rows = json.loads((out / f"run_date={D1}" / "report.json").read_text())["watch"]
    assert [r["query"] for r in rows] == [queries[0]] * 3 + [queries[1]] * 3
    keys = {"query", "doc_id", "sent_index", "text", "label", "score", "similarity", "bm25"}
    assert set(rows[0]) == keys  # ranked as `docintel search` ranks (hybrid: bm25 beside)
    assert rows[0]["doc_id"] == "w7" and rows[0]["text"] == ADDED  # the closest sentence
    night = search(str(out / f"run_date={D1}"), queries, top=3, exact=True)
    pairs = zip(queries, night.hits, strict=True)
    want = [(q, h["doc_id"], h["sent_index"]) for q, hits in pairs for h in hits]
    assert [(r["query"], r["doc_id"], r["sent_index"]) for r in rows] == want
    page = (out / f"run_date={D1}" / "report.html").read_text()
    assert 'id="watch"' in page and "Watch list" in page and ADDED in page


def test_watch_list_without_embeddings_is_refused_before_any_work() -> None:
    with pytest.raises(DocintelError, match=r"\[audit\] watch.*embeddings"):
        _cfg(**{"audit.watch": ["going concern"]})
