"""The audit report (pipeline/report/) on real Parquet run outputs built in tmp_path.

Every expected number is computed here independently, with pandas over the same tables,
not by calling the report's own helpers.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from docintel.pipeline.errors import ConfigError, InputError, UsageError
from docintel.pipeline.report import aggregate, write_report
from docintel.pipeline.report.keys import NO_TOP_LABEL
from docintel.pipeline.schema import (
    ERRORS_SCHEMA,
    documents_schema,
    label_count_column,
    sentences_schema,
)

LABELS = ["Bearish", "Bullish", "Neutral"]
RISK = "Bearish"
STAGES = ("sentencize", "embed", "classify")  # the chain that made the run, in order
SCRIPT_TEXT = "Shares crash <script>alert('x')</script> & more"
BACKENDS = {
    "sentencize": {"gpu-sim": 3, "cpu-fp32": 1},
    "embed": {"gpu-sim": 2, "cpu-int8": 2},
    "classify": {"gpu-sim": 4},
}
EXTERNAL_URL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def make_run(
    root: Path,
    headlines: list[str],
    n_docs: int = 12,
    n_parts: int = 3,
    seed: int = 0,
    with_script: bool = True,
    doc_ids: list[str] | None = None,
) -> dict[str, Any]:
    """A committed docintel run in ``root``: parts with the pipeline's schemas + manifest.
    Documents are d000, d001... unless ``doc_ids`` names them (at least ``n_docs``).

    Labels and scores are drawn with a seeded RNG over real headlines; the last document
    of the first part fails (status error, an errors row). Returns the manifest.
    """
    rng = random.Random(seed)
    docs_schema = documents_schema(LABELS)
    per_part = -(-n_docs // n_parts)
    texts = iter(headlines)
    n_sent_total = n_tok_total = n_err = 0
    for part in range(n_parts):
        batch_id = f"abcd-{part:05d}-00000"
        ids = [
            doc_ids[i] if doc_ids else f"d{i:03d}"
            for i in range(part * per_part, min(n_docs, (part + 1) * per_part))
        ]
        sents: list[dict[str, Any]] = []
        docs: list[dict[str, Any]] = []
        errs: list[dict[str, Any]] = []
        for k, doc_id in enumerate(ids):
            failed = part == 0 and k == len(ids) - 1
            n = 0 if failed else rng.randint(1, 5)
            labels = [rng.choice(LABELS) for _ in range(n)]
            if with_script and part == 1 and k == 0:
                labels[0] = RISK  # the first sentence of this document is the script one
            for j, lb in enumerate(labels):
                text = next(texts)
                if with_script and part == 1 and k == 0 and j == 0:
                    text = SCRIPT_TEXT
                score = 0.99 if text == SCRIPT_TEXT else round(rng.uniform(0.34, 0.98), 2)
                n_tok = len(text.split()) + 2
                sents.append(
                    {
                        "doc_id": doc_id,
                        "sent_index": j,
                        "start_char": 0,
                        "end_char": len(text),
                        "text": text,
                        "label": lb,
                        "score": score,
                        "n_tokens": n_tok,
                        "truncated": False,
                        **{f"{s}_backend": "gpu-sim" for s in STAGES},
                        **{f"{s}_model": f"{s}-v1" for s in STAGES},
                    }
                )
                n_tok_total += n_tok
            n_sent_total += n
            top = max(LABELS, key=labels.count) if labels else None
            docs.append(
                {
                    "doc_id": doc_id,
                    "status": "error" if failed else "ok",
                    "n_sentences": n,
                    "n_truncated": 0,
                    **{label_count_column(lb): labels.count(lb) for lb in LABELS},
                    "top_label": top,
                    "top_score": 0.7 if top else None,
                    "batch_id": batch_id,
                }
            )
            if failed:
                n_err += 1
                errs.append(
                    {
                        "doc_id": doc_id,
                        "stage": "embed",
                        "error_type": "ValueError",
                        "message": "bad <b>input</b> in doc",
                        "batch_id": batch_id,
                    }
                )
        for table, rows, schema in (
            ("errors", errs, ERRORS_SCHEMA),
            ("sentences", sents, sentences_schema(None, STAGES)),
            ("documents", docs, docs_schema),
        ):
            (root / table).mkdir(parents=True, exist_ok=True)
            pq.write_table(
                pa.Table.from_pylist(rows, schema=schema),
                root / table / f"part-{batch_id}.parquet",
            )
    # a hidden temporary left by an interrupted write: readers must skip it
    (root / "documents" / ".part-x.parquet.tmp").write_bytes(b"not parquet")
    manifest = {
        "run_id": f"run-{seed}",
        "finished": "2026-01-02T03:04:05+00:00",
        "labels": LABELS,
        "models": {"embed": "minilm-abc", "classify": "finsent-def"},
        "counts": {
            "documents": n_docs,
            "sentences": n_sent_total,
            "errors": n_err,
            "tokens": n_tok_total,
            "batches": n_parts,
        },
        "resumed_batches": 0,
        "timings": {
            "wall_seconds": 4.0,
            "startup_seconds": 1.5,
            "processing_seconds": 2.5,
            "stage_seconds": {"read": 0.1, "sentencize": 0.3, "embed": 1.2, "classify": 0.4},
        },
        "backends": BACKENDS,
        "warnings": [],
        "partial": False,
        "skipped_files": [],
    }
    (root / "_manifest.json").write_text(json.dumps(manifest))
    return manifest


def audit_dict(date: str, ran: bool = True, run_id: str = "run-0") -> dict[str, Any]:
    return {
        "date": date,
        "run_id": run_id if ran else None,
        "source": "s3://corpus/news/",
        "output": "s3://audits/news/",
        "partition": f"run_date={date}",
        "new": 7 if ran else 0,
        "changed": 5 if ran else 0,
        "removed": 1,
        "unchanged": 30,
        "models_changed": False,
        "models": {"embed": "minilm-abc", "classify": "finsent-def"},
        "ran": ran,
        "started": f"{date}T02:00:00+00:00",
        "finished": f"{date}T02:01:00+00:00",
    }


def _report(tmp_path: Path, root: Path, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "audit": audit_dict("2026-03-01"),
        "history": [],
        "risk_label": RISK,
        "top_n": 5,
    }
    args.update(kw)
    return write_report(pafs.LocalFileSystem(), str(root), **args)


@pytest.fixture
def run_root(tmp_path: Path, headlines: list[str]) -> Path:
    root = tmp_path / "run_date=2026-03-01"
    make_run(root, headlines)
    return root


def test_report_json_matches_the_tables(
    run_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # small record batches: the running top-N must merge across batches and files
    monkeypatch.setattr(aggregate, "READ_BATCH_ROWS", 4)
    rep = _report(tmp_path, run_root)
    sents = pd.read_parquet(
        run_root / "sentences",
        columns=["doc_id", "sent_index", "text", "label", "score", "n_tokens"],
    )
    docs = pd.read_parquet(run_root / "documents")
    errs = pd.read_parquet(run_root / "errors")

    assert json.loads((run_root / "report.json").read_text()) == rep
    assert rep["date"] == "2026-03-01" and rep["new"] == 7 and rep["ran"] is True
    assert rep["counts"] == {
        "documents": len(docs),
        "sentences": len(sents),
        "errors": len(errs),
        "tokens": int(sents["n_tokens"].sum()),
        "unlabelled": int(sents["label"].isna().sum()),  # counted beside the labels
    }
    assert rep["label_distribution"] == {lb: int((sents.label == lb).sum()) for lb in LABELS}
    assert sum(rep["label_shares"].values()) == pytest.approx(1.0)
    top_labels = docs["top_label"].fillna(NO_TOP_LABEL).value_counts().to_dict()
    assert rep["top_label_distribution"] == top_labels
    assert rep["documents_by_status"] == docs["status"].value_counts().sort_index().to_dict()

    expected = (
        sents[sents.label == RISK]
        .sort_values(["score", "doc_id", "sent_index"], ascending=[False, True, True])
        .head(5)
    )
    got = rep["top_risk"]
    assert [(r["doc_id"], r["sent_index"], r["text"]) for r in got] == list(
        expected[["doc_id", "sent_index", "text"]].itertuples(index=False, name=None)
    )
    assert [r["score"] for r in got] == pytest.approx(expected["score"].tolist(), abs=1e-6)
    assert got[0]["text"] == SCRIPT_TEXT  # the highest score: untrusted text kept verbatim

    assert rep["errors"]["count"] == 1
    assert rep["errors"]["by_type"] == [{"stage": "embed", "error_type": "ValueError", "count": 1}]
    assert rep["errors"]["samples"][0]["doc_id"] == errs.doc_id.iloc[0]

    assert rep["backends"] == BACKENDS
    assert rep["backend_share"]["embed"] == {
        "batches": 4,
        "gpu": 0.5,
        "cpu_int8": 0.5,
        "cpu_other": 0.0,
    }
    assert rep["backend_share"]["sentencize"]["gpu"] == 0.75
    assert rep["backend_share"]["classify"]["gpu"] == 1.0
    assert rep["throughput"]["documents_per_s"] == pytest.approx(len(docs) / 4.0)
    assert rep["throughput"]["sentences_per_s"] == pytest.approx(len(sents) / 4.0)
    assert rep["warnings"] == []  # manifest counts agree with the tables

    assert len(rep["trend"]) == 1
    assert rep["trend"][0]["shares"] == rep["label_shares"]


@pytest.mark.parametrize(
    ("stages", "order"),
    [
        (
            ["sentencize", "embed", "keywords", "classify"],
            ["sentencize", "embed", "keywords", "classify"],
        ),
        (None, ["keywords", "classify", "embed", "sentencize"]),
    ],
    ids=["manifest-stages", "recorded-order"],
)
def test_backend_share_follows_the_chain(
    run_root: Path, tmp_path: Path, stages: list[str] | None, order: list[str]
) -> None:
    """Stages are reported in the run's chain order (the manifest's ``stages``); an older
    manifest without it keeps the order its backends were recorded in."""
    path = run_root / "_manifest.json"
    manifest = json.loads(path.read_text())
    manifest["backends"] = {
        "keywords": {"cpu-fp32": 4},
        **{s: BACKENDS[s] for s in reversed(STAGES[1:])},
        "sentencize": BACKENDS["sentencize"],
    }
    if stages is not None:
        manifest["stages"] = stages
    path.write_text(json.dumps(manifest))
    rep = _report(tmp_path, run_root)
    assert list(rep["backend_share"]) == order
    assert rep["backend_share"]["keywords"] == {
        "batches": 4, "gpu": 0.0, "cpu_int8": 0.0, "cpu_other": 1.0,
    }  # fmt: skip


def test_html_is_self_contained_and_escaped(run_root: Path, tmp_path: Path) -> None:
    _report(tmp_path, run_root)
    page = (run_root / "report.html").read_text(encoding="utf-8")
    # the untrusted sentence is shown as text, never as markup
    assert "<script" not in page.lower()
    assert "Shares crash &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in page
    assert "bad &lt;b&gt;input&lt;/b&gt; in doc" in page
    assert not EXTERNAL_URL.search(page), EXTERNAL_URL.search(page)
    assert "@import" not in page
    assert not re.search(r"url\((?!\s*['\"]?#)", page)  # only in-page refs: url(#clip)
    for chart in ("label-chart", "trend-chart", "backend-chart"):
        assert re.search(rf'<div id="{chart}" class="chart"><svg[ >]', page), chart
    assert '<table id="top-risk">' in page
    assert page.count("</svg>") == 3
    assert "Only one audit so far" in page


def test_trend_has_one_point_per_audit(tmp_path: Path, headlines: list[str]) -> None:
    history: list[dict[str, Any]] = []
    dates = ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04"]
    for night, date in enumerate(dates):
        root = tmp_path / f"run_date={date}"
        ran = night != 2  # the third night had nothing new
        if ran:
            make_run(root, headlines[night * 40 :], seed=night, with_script=False)
        rep = _report(
            tmp_path, root, audit=audit_dict(date, ran, f"run-{night}"), history=list(history)
        )
        assert len(rep["trend"]) == len(history) + 1
        history.append(rep)
    trend = history[-1]["trend"]
    assert [p["date"] for p in trend] == dates
    assert [p["ran"] for p in trend] == [True, True, False, True]
    for point, rep in zip(trend, history, strict=True):
        assert point["shares"] == rep["label_shares"]
        assert point["sentences"] == rep["counts"]["sentences"]
    sents = pd.read_parquet(tmp_path / "run_date=2026-03-02" / "sentences")
    assert trend[1]["shares"]["Neutral"] == pytest.approx((sents.label == "Neutral").mean())
    page = (tmp_path / "run_date=2026-03-04" / "report.html").read_text()
    assert "over the last 4 audits" in page
    assert "Only one audit so far" not in page


def test_nothing_ran(tmp_path: Path, run_root: Path) -> None:
    root = tmp_path / "audits" / "run_date=2026-03-05"  # not created: nothing was written
    rep = _report(tmp_path, root, audit=audit_dict("2026-03-05", ran=False))
    zeros = {"documents": 0, "sentences": 0, "errors": 0, "tokens": 0, "unlabelled": 0}
    assert rep["counts"] == zeros and rep["heads"] == []
    ran = _report(tmp_path, run_root)  # a night that ran: the same keys, at both levels
    assert set(rep) == set(ran) and set(rep["counts"]) == set(ran["counts"])
    assert rep["top_risk"] == [] and rep["label_distribution"] == {}
    assert rep["trend"] == [
        {"date": "2026-03-05", "run_id": None, "ran": False, "documents": 0, "sentences": 0,
         "shares": {}, "corpus": None}
    ]  # fmt: skip
    assert json.loads((root / "report.json").read_text()) == rep
    page = (root / "report.html").read_text()
    assert 'id="nothing-ran"' in page and "Nothing was processed this night" in page
    assert 'id="top-risk"' in page and not EXTERNAL_URL.search(page)


def test_works_on_a_non_local_filesystem(tmp_path: Path, headlines: list[str]) -> None:
    make_run(tmp_path / "base" / "night", headlines)
    fs = pafs.SubTreeFileSystem(str(tmp_path / "base"), pafs.LocalFileSystem())
    rep = write_report(fs, "night", audit_dict("2026-03-01"), [], RISK, 3)
    assert len(rep["top_risk"]) == 3
    assert json.loads((tmp_path / "base" / "night" / "report.json").read_text()) == rep
    assert (tmp_path / "base" / "night" / "report.html").stat().st_size > 10_000
    # nothing ran, on the non-local filesystem: the partition folder does not exist yet
    empty = write_report(fs, "empty", audit_dict("2026-03-02", ran=False), [rep], RISK, 3)
    assert [p["date"] for p in empty["trend"]] == ["2026-03-01", "2026-03-02"]
    assert (tmp_path / "base" / "empty" / "report.html").is_file()


def test_bad_usage_names_what_to_fix(run_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"risk_label 'Panic'.*Bearish, Bullish, Neutral"):
        _report(tmp_path, run_root, risk_label="Panic")
    with pytest.raises(ConfigError, match="top_n"):
        _report(tmp_path, run_root, top_n=0)
    with pytest.raises(UsageError, match=r"history\[0\] lacks"):
        _report(tmp_path, run_root, history=[{"date": "2026-02-28"}])
    uncommitted = tmp_path / "uncommitted"
    (uncommitted / "documents").mkdir(parents=True)
    with pytest.raises(InputError, match=r"_manifest.json is missing"):
        _report(tmp_path, uncommitted)
    assert not (uncommitted / "report.json").exists()
