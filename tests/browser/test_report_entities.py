"""The report's "Watch-listed names" as an auditor sees it: headless Chromium's DOM of a
night screened against watch lists (the runs of tests/unit/test_report_entities.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.browser.test_report_render import body_rows, chromium, parse_dom, run_chromium
from tests.unit.test_report_entities import EVIL_NAME, EVIL_TEXT, NIGHT_ONE, report_of, write_night

pytestmark = pytest.mark.browser
__all__ = ["chromium"]  # the fixture, imported for pytest


def test_watch_listed_names_render(chromium: str, tmp_path: Path) -> None:
    root = tmp_path / "run_date=2026-03-01"
    write_night(root, NIGHT_ONE)
    changes = {"new": list(NIGHT_ONE), "changed": [], "removed": [], "reprocessed": 0}
    rep = report_of(root, changes)
    assert rep == json.loads((root / "report.json").read_text())
    dom = parse_dom(run_chromium(chromium, tmp_path, root / "report.html", "--dump-dom"))
    assert dom.find("script") == [] and dom.find("img") == []  # hostile text stayed text

    table = dom.by_id("entities-table")
    rows = body_rows(table)
    shown = rep["entities"][:3]  # top_n
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert [r[2] for r in rows] == [f"{e['risk_score']:.3f}" for e in shown]
    assert rows[0][1].startswith("Acme Corporation") and "sanctions" in rows[0][1]
    assert rows[1][1].startswith(EVIL_NAME.replace("\u202e", "\\u202e"))
    links = [a.attrs["href"] for a in table.find("a") if a.attrs.get("class") == "entity-link"]
    assert links == ["#entity-1", "#entity-2", "#entity-3"]
    for k, e in enumerate(shown, start=1):  # each link has its drill-down, every sentence
        drill = dom.by_id(f"entity-{k}")
        assert len(body_rows(drill.find("table")[0])) == len(e["sentences"])
        marks = {m.content() for m in drill.find("mark")}
        assert marks == {s["text"][s["start"] : s["end"]].replace("\u202e", "\\u202e")
                         for s in e["sentences"]}  # fmt: skip
    # shown literally (content() lists a cell's own text before its <mark>'s)
    cell = body_rows(dom.by_id("entity-2").find("table")[0])[0][3]
    before, after = EVIL_TEXT.split(EVIL_NAME)
    assert cell == f"{before}{after}{EVIL_NAME}".replace("\u202e", "\\u202e")
    assert "Acme Corporation" in dom.by_id("changes-entities").content()
