"""The audit report as an auditor sees it: report.html rendered by headless Chromium.

Chromium loads the file offline (file://, no network), then we read back the DOM it built
and a screenshot. This catches what string checks on the HTML cannot: SVG that the browser
does not parse as SVG, tables that collapse, an escaped sentence that still runs as markup.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.fs as pafs
import pytest

from docintel.pipeline.report import write_report
from tests.unit.test_report import RISK, SCRIPT_TEXT, audit_dict, make_run

pytestmark = pytest.mark.browser

CHROMIUM_TIMEOUT_S = 120  # a cold start on a loaded 2-core machine takes a few seconds
WINDOW = (1280, 4000)  # tall enough to reach the label chart below the review
INSTALL_HINT = (
    "headless Chromium is needed for the browser tests (tests/browser) but `chromium` is "
    "not on PATH; install it with `sudo apt-get update && sudo apt-get install -y "
    "--no-install-recommends chromium` (Debian package chromium, binary /usr/bin/chromium)"
)
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source"}


@pytest.fixture(scope="module")
def chromium() -> str:
    """The Chromium binary; missing fails under CI (CI=1) and skips elsewhere."""
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(INSTALL_HINT)
        pytest.skip(INSTALL_HINT)
    return path


def run_chromium(chromium: str, tmp_path: Path, page: Path, *args: str) -> str:
    profile = tmp_path / "chromium-profile"
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",  # tests run as root in containers, where the sandbox cannot start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *args,
        page.as_uri(),
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"chromium failed ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    def walk(self) -> Any:
        yield self
        for c in self.children:
            yield from c.walk()

    def find(self, tag: str) -> list[Node]:
        return [n for n in self.walk() if n.tag == tag]

    def by_id(self, element_id: str) -> Node:
        found = [n for n in self.walk() if n.attrs.get("id") == element_id]
        assert len(found) == 1, f"expected one element #{element_id}, found {len(found)}"
        return found[0]

    def content(self) -> str:
        return "".join("".join(n.text) for n in self.walk())


class DomBuilder(HTMLParser):
    """A small tree from Chromium's serialised DOM (stdlib only)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].text.append(data)


def parse_dom(dom: str) -> Node:
    b = DomBuilder()
    b.feed(dom)
    b.close()
    return b.root


def body_rows(table: Node) -> list[list[str]]:
    (tbody,) = table.find("tbody")
    return [[td.content().strip() for td in tr.find("td")] for tr in tbody.find("tr")]


@pytest.fixture(scope="module")
def report_page(tmp_path_factory: pytest.TempPathFactory, headlines: list[str]) -> Path:
    """Three nights of audits; the page of the third, whose trend holds three points."""
    base = tmp_path_factory.mktemp("audits")
    history: list[dict[str, Any]] = []
    for night, date in enumerate(["2026-03-01", "2026-03-02", "2026-03-03"]):
        root = base / f"run_date={date}"
        make_run(root, headlines[night * 50 :], seed=night)
        history.append(
            write_report(
                pafs.LocalFileSystem(), str(root), audit_dict(date), list(history), RISK, 6
            )
        )
    return base / "run_date=2026-03-03" / "report.html"


def test_rendered_dom_has_charts_and_tables(
    chromium: str, report_page: Path, tmp_path: Path
) -> None:
    dom = parse_dom(run_chromium(chromium, tmp_path, report_page, "--dump-dom"))
    root = report_page.parent

    assert dom.find("script") == []  # the <script> sentence stayed text
    for chart in ("label-chart", "trend-chart", "backend-chart"):
        svgs = dom.by_id(chart).find("svg")
        assert len(svgs) == 1, chart
        assert len(svgs[0].find("path")) > 10, f"#{chart} has an empty SVG"
    trend_lines = [
        n for n in dom.by_id("trend-chart").walk() if n.attrs.get("id", "").startswith("line2d")
    ]
    assert trend_lines, "the trend chart has no lines"

    cols = ["doc_id", "sent_index", "text", "label", "score"]
    sents = pd.read_parquet(root / "sentences", columns=cols)
    expected = (
        sents[sents.label == RISK]
        .sort_values(["score", "doc_id", "sent_index"], ascending=[False, True, True])
        .head(6)
    )
    rows = body_rows(dom.by_id("top-risk"))
    assert [(r[1], r[3]) for r in rows] == list(
        expected[["doc_id", "text"]].itertuples(index=False, name=None)
    )
    assert rows[0][3] == SCRIPT_TEXT  # shown literally, as the auditor must see it
    assert [r[0] for r in rows] == [str(i) for i in range(1, 7)]

    labels = body_rows(dom.by_id("label-table"))
    assert {r[0]: int(r[1]) for r in labels} == sents.label.value_counts().to_dict()
    assert [r[0] for r in body_rows(dom.by_id("trend-table"))] == [
        "2026-03-01",
        "2026-03-02",
        "2026-03-03",
    ]
    backend = {r[0]: r for r in body_rows(dom.by_id("backend-table"))}
    assert backend["embed"][2:4] == ["50.0%", "50.0%"]  # GPU, CPU int8
    assert body_rows(dom.by_id("errors-table")) == [["embed", "ValueError", "1"]]
    cards = {
        c.attrs["data-key"]: c.find("b")[0].content() for c in dom.by_id("summary-counts").children
    }
    docs = pd.read_parquet(root / "documents", columns=["doc_id"])
    assert cards["documents"] == str(len(docs))
    assert cards["sentences"] == f"{len(sents):,}"


def test_screenshot_is_not_blank(chromium: str, report_page: Path, tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    shot = tmp_path / "report.png"
    run_chromium(
        chromium,
        tmp_path,
        report_page,
        f"--screenshot={shot}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    )
    assert shot.is_file() and shot.stat().st_size > 20_000
    img = mpimg.imread(shot)[..., :3]  # floats in [0, 1]
    assert img.shape[:2] == (WINDOW[1], WINDOW[0])
    assert float(img.std()) > 0.05
    ink = (img < 0.9).any(axis=2).mean()
    assert ink > 0.02, f"only {ink:.1%} of the page is not white"
    # the label chart's first bar (matplotlib's tab:blue, #1f77b4) was painted
    blue = np.abs(img - np.array([0x1F, 0x77, 0xB4]) / 255).max(axis=2) < 0.03
    assert blue.sum() > 2_000, f"{blue.sum()} chart-blue pixels"


# --- the review table, the change lists and the drill-down links, as a reader uses them --


@pytest.fixture(scope="module")
def night_page(tmp_path_factory: pytest.TempPathFactory, headlines: list[str]) -> Path:
    """One audit night whose changed document d000 gained the <script> sentence."""
    from tests.unit.test_report_review import changes_for

    root = tmp_path_factory.mktemp("night") / "run_date=2026-03-01"
    make_run(root, headlines, n_docs=30, n_parts=3)
    audit = {**audit_dict("2026-03-01"), "changes": changes_for(root)}
    write_report(pafs.LocalFileSystem(), str(root), audit, [], RISK, 8)
    return root / "report.html"


def test_review_table_and_change_lists_render(
    chromium: str, night_page: Path, tmp_path: Path
) -> None:
    import json

    rep = json.loads((night_page.parent / "report.json").read_text())
    dom = parse_dom(run_chromium(chromium, tmp_path, night_page, "--dump-dom"))
    assert dom.find("script") == []
    rows = body_rows(dom.by_id("review-table"))
    assert [r[1] for r in rows] == [d["doc_id"] for d in rep["review"][:8]]
    assert [r[3] for r in rows] == [f"{d['risk_score']:.3f}" for d in rep["review"][:8]]
    links = [a.attrs["href"] for a in dom.by_id("review-table").find("a")]
    assert links == [f"#doc-{k}" for k in range(1, 9)]
    for k in range(1, 9):  # every link has its drill-down section, with every sentence
        doc = dom.by_id(f"doc-{k}")
        assert len(body_rows(doc.find("table")[0])) == len(rep["drilldown"][k - 1]["sentences"])
    removed = dom.by_id("changes-removed").content()
    assert "gone-000" in removed and "and 10 more" in removed
    diff = body_rows(dom.by_id("diff-0"))
    assert [(r[0], r[3]) for r in diff] == [
        ("added", SCRIPT_TEXT), ("removed", "Old <b>sentence</b>."),
    ]  # fmt: skip


def test_drilldown_link_navigates_when_clicked(
    chromium: str, night_page: Path, tmp_path: Path
) -> None:
    from tests.browser.cdp import Browser

    browser = Browser(chromium, tmp_path / "profile", CHROMIUM_TIMEOUT_S)
    try:
        browser.load(night_page.as_uri())
        title = browser.evaluate("document.title")
        box = browser.evaluate(
            "(() => { const a = document.querySelectorAll('#review-table a.doc-link')[2];"
            " a.scrollIntoView({block: 'center'}); const r = a.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2, a.getAttribute('href')]; })()"
        )
        browser.click(box[0], box[1])
        deadline = time.monotonic() + 10
        while browser.evaluate("location.hash") != box[2] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert browser.evaluate("location.hash") == box[2] == "#doc-3"
        top = browser.evaluate("document.querySelector('#doc-3').getBoundingClientRect().top")
        assert abs(top) < 5  # scrolled to the drill-down section
        style = "getComputedStyle(document.querySelector(':target')).backgroundColor"
        assert browser.evaluate(style) == "rgb(255, 244, 229)"  # highlighted as the target
        # the document text with <script> stayed text: nothing ran, nothing was parsed
        assert browser.evaluate("document.scripts.length") == 0
        assert browser.evaluate("document.title") == title
        assert SCRIPT_TEXT in browser.evaluate("document.body.innerText")
    finally:
        browser.close()


# --- what people see: whole words, formatted numbers (issue 31, item 16) ------------------

# Every word of every table cell (up to 24 characters; a longer token such as a URL may
# wrap inside itself) on one line: the words whose characters lie on two lines.
BROKEN_WORDS_JS = r"""(() => {
  const broken = [];
  for (const cell of document.querySelectorAll('td, th')) {
    const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      for (const m of n.data.matchAll(/\S+/g)) {
        if (m[0].length > 24) continue;
        const r = document.createRange();
        r.setStart(n, m.index);
        r.setEnd(n, m.index + m[0].length);
        const tops = new Set([...r.getClientRects()].map(b => Math.round(b.top)));
        if (tops.size > 1) broken.push(m[0]);
      }
    }
  }
  return broken;
})()"""


@pytest.fixture(scope="module")
def watch_page(tmp_path_factory: pytest.TempPathFactory, headlines: list[str]) -> Path:
    """A night with [audit] watch hits: seven columns, float scores and similarities."""
    from tests.unit.test_report_polish import watch_hits

    root = tmp_path_factory.mktemp("watch") / "run_date=2026-03-01"
    make_run(root, headlines, n_docs=30)
    audit = {**audit_dict("2026-03-01"), "watch": watch_hits(headlines)}
    write_report(pafs.LocalFileSystem(), str(root), audit, [], RISK, 6)
    return root / "report.html"


def test_words_stay_whole_and_numbers_short(
    chromium: str, watch_page: Path, tmp_path: Path
) -> None:
    """At a desktop and a narrow width, no word of a table breaks across lines (it was
    "Bearis h" in the watch list) and no number shows a float's 17 digits."""
    from tests.browser.cdp import Browser
    from tests.unit.test_report_polish import RAW_FLOAT

    browser = Browser(chromium, tmp_path / "profile", CHROMIUM_TIMEOUT_S)
    try:
        for width in (1280, 900):
            browser.call("Emulation.setDeviceMetricsOverride", session=True, width=width,
                         height=900, deviceScaleFactor=1, mobile=False)  # fmt: skip
            browser.load(watch_page.as_uri())
            assert browser.evaluate("document.querySelectorAll('#watch-table tr').length") == 7
            assert browser.evaluate(BROKEN_WORDS_JS) == [], width
            text = browser.evaluate("document.body.innerText")
            assert RAW_FLOAT.findall(text) == [], width
    finally:
        browser.close()
