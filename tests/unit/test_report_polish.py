"""The audit report as people read it (issue 31, item 16): numbers formatted, never a
float's 17 digits; no CSS that breaks words mid-word; trend titles that fit their panels.
tests/browser/test_report_render.py checks the same on the page Chromium lays out."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from docintel.pipeline.report import html, write_report
from tests.unit.test_report import LABELS, RISK, audit_dict, make_run

RAW_FLOAT = re.compile(r"\d\.\d{5,}")  # 0.9865904450416565; the page shows 0.987 or 0.9866


def watch_hits(headlines: list[str], n: int = 6) -> list[dict[str, Any]]:
    """[audit] watch rows as the audit records them: scores and similarities as floats."""
    rng = random.Random(1)
    return [
        {
            "query": q,
            "doc_id": f"d{rng.randint(0, 11):03d}",
            "sent_index": rng.randint(0, 4),
            "text": headlines[rng.randint(0, 300)],
            "label": rng.choice(LABELS),
            "score": rng.uniform(0.3, 1.0),
            "similarity": rng.uniform(0.2, 0.9),
        }
        for q in ("going concern doubt", "dividend suspended after layoffs")
        for _ in range(n // 2)
    ]


def _without_svg(page: str) -> str:
    return re.sub(r"<svg.*?</svg>", "", page, flags=re.DOTALL)


def test_no_raw_float_on_the_page(tmp_path: Path, headlines: list[str]) -> None:
    root = tmp_path / "run_date=2026-03-01"
    make_run(root, headlines)
    hits = watch_hits(headlines)
    audit = {**audit_dict("2026-03-01"), "watch": hits}
    write_report(pafs.LocalFileSystem(), str(root), audit, [], RISK, 5)
    page = _without_svg((root / "report.html").read_text())
    assert RAW_FLOAT.findall(page) == []
    watch = page[page.index('id="watch-table"') :]
    watch = watch[: watch.index("</table>")]
    for h in hits:
        assert f'<td class="num">{h["score"]:.3f}</td>' in watch
        assert f'<td class="num">{h["similarity"]:.3f}</td>' in watch
        assert f'<td class="num">{h["sent_index"]}</td>' in watch


def test_css_never_breaks_a_word_to_share_out_width() -> None:
    """``overflow-wrap: anywhere`` (and ``word-break: break-all``) let a table squeeze a
    column below its longest word ("Bearis h"); break-word does not."""
    css = re.sub(r"/\*.*?\*/", "", html._CSS, flags=re.DOTALL)
    assert "anywhere" not in css and "break-all" not in css
    assert "overflow-wrap: break-word" in css


def _trend_report(nights: int) -> dict[str, Any]:
    shares = {"Bearish": 0.3, "Bullish": 0.3, "Neutral": 0.4}
    trend = [
        {"date": f"2026-03-{d + 1:02d}", "documents": 10, "sentences": 40, "shares": shares,
         "corpus": {"documents": 10, "sentences": 40, "shares": shares}}
        for d in range(nights)
    ]  # fmt: skip
    return {"labels": LABELS, "trend": trend}


def test_trend_titles_fit_their_panels() -> None:
    """Each panel's title ends before the next panel starts and inside the figure (before,
    the first title ran under the second)."""
    for nights in (1, 3, 30):
        fig = html.trend_figure(_trend_report(nights))
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
        left, right = fig.axes[:2]
        t_left, t_right = _title(left, html.TREND_TITLES[0]), _title(right, html.TREND_TITLES[1])
        box_left = t_left.get_window_extent(renderer)
        box_right = t_right.get_window_extent(renderer)
        assert box_left.x1 < right.get_window_extent(renderer).x0, nights
        assert box_left.x1 < box_right.x0, nights
        assert box_right.x1 <= fig.bbox.x1 and box_left.y1 <= fig.bbox.y1, nights


def _title(ax: Any, text: str) -> Text:
    (title,) = [t for t in ax.findobj(Text) if t.get_text() == text]
    return title
