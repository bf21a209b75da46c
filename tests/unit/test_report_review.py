"""The report's document sections on real Parquet runs: the review ranking (recomputed here
with pandas), the change lists, the CSVs beside the report, escaping of document text."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.fs as pafs
import pytest

from docintel.pipeline.report import review as review_mod
from docintel.pipeline.report import write_report
from docintel.pipeline.report.sections import SHOWN_IDS
from tests.unit.test_report import RISK, SCRIPT_TEXT, audit_dict, make_run

FORMULA = '=HYPERLINK("http://x")'


def changes_for(root: Path, n_new: int = 30) -> dict[str, Any]:
    """Changes for a run made by make_run: d000 changed (one added, one removed sentence,
    the added one the script text), the rest new, ``n_new`` extra removed ids."""
    ids = sorted(pd.read_parquet(root / "documents").doc_id)
    changed = {
        "doc_id": ids[0], "previous_date": "2026-02-28",
        "added": [SCRIPT_TEXT], "removed": ["Old <b>sentence</b>."],
        "added_detail": [{"text": SCRIPT_TEXT, "label": RISK, "score": 0.99}],
        "removed_detail": [{"text": "Old <b>sentence</b>.", "label": "Neutral", "score": 0.5}],
    }  # fmt: skip
    return {
        "new": ids[1:],
        "changed": [changed],
        "removed": [f"gone-{i:03d}" for i in range(n_new)],
        "reprocessed": 0,
        "detail_max": 1000,
    }


@pytest.fixture
def night(tmp_path: Path, headlines: list[str]) -> tuple[Path, dict[str, Any]]:
    root = tmp_path / "run_date=2026-03-01"
    make_run(root, headlines, n_docs=24, n_parts=4)
    audit = {**audit_dict("2026-03-01"), "changes": changes_for(root)}
    rep = write_report(pafs.LocalFileSystem(), str(root), audit, [], RISK, 5)
    return root, rep


def test_review_score_and_order(night: tuple[Path, dict[str, Any]]) -> None:
    root, rep = night
    sents = pd.read_parquet(root / "sentences")
    docs = pd.read_parquet(root / "documents")
    mass = sents.score.where(sents.label == RISK, 0.0).groupby(sents.doc_id).sum()
    n = sents.groupby("doc_id").size()
    score = (mass * mass / n).reindex(docs.doc_id, fill_value=0.0)
    table = pd.DataFrame({"score": score, "mass": mass.reindex(docs.doc_id, fill_value=0.0)})
    table = table.reset_index().sort_values(
        ["score", "mass", "doc_id"], ascending=[False, False, True]
    )
    review = rep["review"]
    assert [r["doc_id"] for r in review] == table.doc_id.tolist()  # every document, ranked
    assert [r["risk_score"] for r in review] == pytest.approx(table.score.tolist(), abs=1e-5)
    assert rep["review_total"] == len(docs)
    first = review[0]
    risky = sents[(sents.doc_id == first["doc_id"]) & (sents.label == RISK)]
    top = risky.sort_values(["score", "sent_index"], ascending=[False, True]).head(3)
    assert [s["text"] for s in first["sentences"]] == top.text.tolist()
    statuses = {r["doc_id"]: r["status"] for r in review}
    assert statuses.pop(sorted(docs.doc_id)[0]) == "changed"
    assert set(statuses.values()) == {"new"}
    assert [d["rank"] for d in rep["drilldown"]] == [1, 2, 3, 4, 5]  # top_n documents
    failed = docs[docs.status == "error"].doc_id.tolist()
    assert all(r["risk_score"] == 0 for r in review if r["doc_id"] in failed)


def test_csvs_beside_the_report(night: tuple[Path, dict[str, Any]]) -> None:
    root, rep = night
    rows = list(csv.DictReader(io.StringIO((root / "review.csv").read_text())))
    assert [r["doc_id"] for r in rows] == [r["doc_id"] for r in rep["review"]]
    assert [int(r["rank"]) for r in rows] == list(range(1, len(rows) + 1))
    changes = list(csv.DictReader(io.StringIO((root / "changes.csv").read_text())))
    assert len(changes) == 24 + 30
    assert {r["change"] for r in changes} == {"new", "changed", "removed"}


def test_csv_cells_never_start_a_formula() -> None:
    import pyarrow as pa

    ranked = pa.table({"rank": [1], "doc_id": ["d"], "doc_status": ["ok"]})
    review = [{"doc_id": "d", "sentences": [{"text": FORMULA}]}]
    text = review_mod.review_csv(ranked, review).decode()
    (row,) = csv.DictReader(io.StringIO(text))
    assert row["top_risk_sentence"] == "'" + FORMULA


def test_page_lists_changes_bounded_and_escaped(night: tuple[Path, dict[str, Any]]) -> None:
    root, rep = night
    page = (root / "report.html").read_text()
    assert "<script" not in page.lower() and "<b>sentence" not in page
    assert "Old &lt;b&gt;sentence&lt;/b&gt;." in page
    assert f"and {30 - SHOWN_IDS:,} more" in page  # removed ids beyond the first 20
    assert page.count("gone-0") == SHOWN_IDS
    assert 'id="review-table"' in page and 'href="#doc-1"' in page and 'id="doc-1"' in page
    assert '<details id="engineering">' in page and 'id="watch"' not in page
    assert json.loads((root / "report.json").read_text()) == rep


def test_watch_hits_get_a_section(tmp_path: Path, headlines: list[str]) -> None:
    root = tmp_path / "night"
    make_run(root, headlines)
    hits = [{"term": "layoffs", "doc_id": "d001", "text": "<i>cut</i> jobs"}]
    audit = {**audit_dict("2026-03-01"), "watch": hits}
    write_report(pafs.LocalFileSystem(), str(root), audit, [], RISK, 3)
    page = (root / "report.html").read_text()
    assert 'id="watch-table"' in page and "&lt;i&gt;cut&lt;/i&gt; jobs" in page
