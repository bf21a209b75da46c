"""Rendering the audit report: the report dict as one self-contained ``report.html``.

Only the dict is read here, never the run's Parquet tables (aggregate.py builds the dict,
then calls ``render_html``), so a report can be re-rendered from its report.json. The page
opens offline in any browser (inline CSS, charts as inline SVG, no scripts, no external
URLs), because reports are mailed, archived and opened on locked-down machines.
"""

from __future__ import annotations

import io
import math
import re
from typing import Any

from docintel.pipeline.report.entity_sections import entities_section, entity_drilldown_section
from docintel.pipeline.report.keys import AUDIT_COUNTS, SHARE_KEYS, SHARE_NAMES
from docintel.pipeline.report.markup import esc as _e
from docintel.pipeline.report.markup import ident as _id
from docintel.pipeline.report.markup import num as _num
from docintel.pipeline.report.markup import section as _section
from docintel.pipeline.report.markup import table as _table
from docintel.pipeline.report.markup import yes_no as _yes_no
from docintel.pipeline.report.sections import (
    changes_section,
    drilldown_section,
    review_section,
    watch_section,
)

# One colour per label/family, stable across charts and nights (matplotlib's tab10).
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
SHARE_COLOURS = {"gpu": "#2ca02c", "cpu_int8": "#1f77b4", "cpu_other": "#bbbbbb"}


# --- charts --------------------------------------------------------------------------------

_SVG_RC = {
    "svg.fonttype": "path",  # glyphs as paths: no font files or font names needed offline
    "text.parse_math": False,  # a label like "$AAPL$" is text, not mathtext
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def _svg(fig: Any) -> str:
    """A matplotlib figure as an inline <svg> element (no XML prolog, no metadata)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.DOTALL)


def _figure(width: float, height: float) -> Any:
    # Figure() without pyplot: no GUI backend or global state; savefig(format="svg")
    # renders with matplotlib's SVG backend, whatever backend is configured.
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _colour(labels: list[str], label: str) -> str:
    return PALETTE[labels.index(label) % len(PALETTE)]


def label_chart(report: dict[str, Any]) -> str:
    import matplotlib as mpl

    dist = report["label_distribution"]
    labels = list(dist)
    total = sum(dist.values()) or 1
    with mpl.rc_context(_SVG_RC):
        fig = _figure(7, 0.45 * len(labels) + 0.9)
        ax = fig.add_subplot()
        ys = range(len(labels))
        ax.barh(list(ys), [dist[lb] for lb in labels], color=[_colour(labels, lb) for lb in labels])
        ax.set_yticks(list(ys), labels)
        ax.invert_yaxis()
        for y, lb in zip(ys, labels, strict=True):
            ax.annotate(
                f" {dist[lb]:,} ({dist[lb] / total:.1%})",
                (dist[lb], y),
                va="center",
                fontsize=8,
            )
        ax.set_xlabel("sentences")
        ax.margins(x=0.2)
        return _svg(fig)


def _trend_labels(report: dict[str, Any]) -> list[str]:
    labels = list(report["labels"])
    for p in report["trend"]:
        shares = [p["shares"], *([p["corpus"]["shares"]] if p.get("corpus") else [])]
        labels += [lb for sh in shares for lb in sh if lb not in labels]
    return labels


def _corpus_shares(p: dict[str, Any]) -> dict[str, float | None]:
    return p["corpus"]["shares"] if p.get("corpus") else {}


# The trend panels' titles: two short lines each, so that side by side neither runs into
# the other panel (test_report_render checks the drawn extents).
TREND_TITLES = (
    "Whole corpus after the night\n(latest version of every document)",
    "Processed that night\n(new and changed documents)",
)


def trend_figure(report: dict[str, Any]) -> Any:
    """The trend chart as a matplotlib figure: two panels, one line per label: the whole
    corpus after each night (latest/), and what was processed that night."""
    import matplotlib as mpl

    points = report["trend"]
    labels = _trend_labels(report)
    xs = list(range(len(points)))
    panels = zip(TREND_TITLES, (_corpus_shares, lambda p: p["shares"]), strict=True)
    with mpl.rc_context(_SVG_RC):
        fig = _figure(9.5, 3.6)
        axes = fig.subplots(1, 2, sharey=True)
        for ax, (title, shares_of) in zip(axes, panels, strict=True):
            for lb in labels:
                ys = [
                    100 * s if (s := shares_of(p).get(lb)) is not None else math.nan for p in points
                ]
                ax.plot(xs, ys, marker="o", markersize=4, label=lb, color=_colour(labels, lb))
            ax.set_title(title, fontsize=9, loc="left")
            ax.set_xticks(xs, [p["date"] for p in points], rotation=45, ha="right")
            ax.set_ylim(0, 100)
            if len(xs) == 1:
                ax.set_xlim(-1, 1)
        axes[0].set_ylabel("share of sentences (%)")
        if labels:
            axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
        return fig


def trend_chart(report: dict[str, Any]) -> str:
    import matplotlib as mpl

    with mpl.rc_context(_SVG_RC):
        return _svg(trend_figure(report))


def backend_chart(report: dict[str, Any]) -> str:
    import matplotlib as mpl

    share = report["backend_share"]
    stages = list(share)
    with mpl.rc_context(_SVG_RC):
        fig = _figure(7, 0.45 * len(stages) + 1.0)
        ax = fig.add_subplot()
        left = [0.0] * len(stages)
        for key in SHARE_KEYS:
            widths = [100 * share[s][key] for s in stages]
            ax.barh(stages, widths, left=left, label=SHARE_NAMES[key], color=SHARE_COLOURS[key])
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.invert_yaxis()
        ax.set_xlim(0, 100)
        ax.set_xlabel("share of batches (%)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
        return _svg(fig)


# --- HTML ------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto;
       max-width: 1100px; padding: 0 1rem; color: #222; line-height: 1.4; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem;
     border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
.sub { color: #666; margin-top: 0; } .note { color: #555; font-style: italic; }
.warn { background: #fff4e5; border-left: 4px solid #f0a020; padding: .4rem .8rem; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .9rem; }
th, td { border: 1px solid #ddd; padding: .25rem .6rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
/* break-word, not anywhere: a word still breaks only when it alone is wider than its cell,
   and it keeps its width when the table shares out space ("Bearis h" in a squeezed column) */
td.text { max-width: 640px; overflow-wrap: break-word; }
.cards { display: flex; flex-wrap: wrap; gap: .6rem; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: .5rem .9rem; min-width: 80px; }
.card b { display: block; font-size: 1.3rem; } .card span { color: #666; font-size: .8rem; }
.chart svg { max-width: 100%; height: auto; }
h3 { font-size: 1rem; margin: 1.2rem 0 .3rem; } h3 .sub { font-weight: normal; font-size: .85rem; }
.rs { margin: .1rem 0; } .score { font-variant-numeric: tabular-nums; color: #a01010; }
.page { color: #666; font-size: .8rem; white-space: nowrap; }
.more { color: #555; } tr.risk td { background: #fdecea; } tr.added td { background: #e9f7ec; }
tr.removed td { background: #f4f4f4; color: #666; text-decoration: line-through; }
.tag { font-size: .72rem; background: #2ca02c; color: #fff; border-radius: 3px;
       padding: 0 .3rem; white-space: nowrap; }
.doc { border-left: 4px solid transparent; padding-left: .6rem; }
.doc:target { border-left-color: #f0a020; background: #fff4e5; }
details { margin-top: 2rem; border-top: 1px solid #ddd; padding-top: .5rem; }
summary { cursor: pointer; font-weight: 600; }
.id { white-space: nowrap; }
mark { background: #ffe08a; padding: 0 .1rem; } .entity-link { font-weight: 600; }
"""


def _summary(r: dict[str, Any]) -> str:
    c = r["counts"]
    cards = [
        ("documents", c["documents"]),
        ("sentences", c["sentences"]),
        ("errors", c["errors"]),
        *((k, r.get(k)) for k in AUDIT_COUNTS),
        # documents re-run although unchanged (the models changed), when the audit says
        *((k, r[k]) for k in ("reprocessed",) if k in r),
    ]
    html_cards = "".join(
        f'<div class="card" data-key="{_e(k)}"><b>{_e(_num(v))}</b><span>{_e(k)}</span></div>'
        for k, v in cards
    )
    body = f'<div class="cards" id="summary-counts">{html_cards}</div>'
    if not r["ran"]:
        body += (
            '<p class="note" id="nothing-ran">Nothing was processed this night: no document '
            "was new or changed, so every count is zero.</p>"
        )
    details = [
        ("date", r.get("date")),
        ("run id", r.get("run_id")),
        ("source", r.get("source")),
        ("output", r.get("output")),
        ("partition", r.get("partition")),
        ("started", r.get("started")),
        ("finished", r.get("finished")),
        ("models changed", _yes_no(r.get("models_changed"))),
    ]
    rows = [[_e(k), _e(v)] for k, v in details if v is not None]
    body += _table("summary-table", [], rows, set())
    if r["partial"]:
        files = ", ".join(_id(f.get("uri", f), "path") for f in r["skipped_files"])
        body += f'<p class="warn">Partial run: unreadable input files were skipped: {files}</p>'
    body += "".join(f'<p class="warn">{_e(w)}</p>' for w in r["warnings"])
    return _section("summary", "Summary", body)


def _labels_section(r: dict[str, Any]) -> str:
    if not r["counts"]["sentences"]:
        return _section(
            "labels",
            "Label distribution",
            '<div id="label-chart" class="chart"><p class="note">No sentences were '
            "classified this night.</p></div>",
        )
    rows = [
        [_e(lb), _num(n), _num(r["label_shares"][lb], ".1%")]
        for lb, n in r["label_distribution"].items()
    ]
    docs = [[_e(lb), _num(n)] for lb, n in r["top_label_distribution"].items()]
    body = (
        f'<div id="label-chart" class="chart">{label_chart(r)}</div>'
        + _table("label-table", ["label", "sentences", "share"], rows, {1, 2})
        + "<p>Documents by top label (the label with the highest mean probability):</p>"
        + _table("top-label-table", ["top label", "documents"], docs, {1})
    )
    return _section("labels", "Label distribution", body)


def _delta(now: float | None, before: float | None, fmt: str, unit: str = "") -> str:
    """``now`` with its change since ``before`` (night over night), e.g. ``31.2% (+0.4 pp)``."""
    if now is None:
        return "—"
    text = format(now, fmt)
    if before is None:
        return text
    return f"{text} ({format(now - before, '+' + fmt)}{unit})"


def _trend_rows(points: list[dict[str, Any]], labels: list[str], corpus: bool) -> list[list[str]]:
    rows, prev = [], None
    for p in points:
        cur = p.get("corpus") if corpus else p
        if cur is None:
            rows.append([_e(p["date"]), *(["—"] * (2 + len(labels)))])
            prev = None
            continue
        docs = [_delta(cur["documents"], prev and prev["documents"], ",")]
        sents = [_delta(cur["sentences"], prev and prev["sentences"], ",")]
        shares = [
            _delta(
                None if (v := cur["shares"].get(lb)) is None else 100 * v,
                None if not prev or prev["shares"].get(lb) is None else 100 * prev["shares"][lb],
                ".1f",
                " pp",
            )
            for lb in labels
        ]
        rows.append([_e(p["date"]), *docs, *sents, *shares])
        prev = cur
    return rows


def _trend_section(r: dict[str, Any]) -> str:
    points = r["trend"]
    note = ""
    if len(points) == 1:
        note = '<p class="note" id="trend-note">Only one audit so far: the trend starts here.</p>'
    elif not any(p["sentences"] for p in points):
        note = '<p class="note" id="trend-note">No sentences in any of these audits.</p>'
    labels = _trend_labels(r)
    cols = ["date", "documents", "sentences", *(f"{lb} %" for lb in labels)]
    nums = set(range(1, len(cols)))
    body = (
        note
        + f'<div id="trend-chart" class="chart">{trend_chart(r)}</div>'
        + "<h3>Whole corpus after each night</h3><p>The latest version of every current "
        "document (the <code>latest/</code> view), in brackets the change since the night "
        "before.</p>"
        + _table("corpus-trend-table", cols, _trend_rows(points, labels, True), nums)
        + "<h3>Processed each night</h3><p>Only the new and changed documents of that night "
        "(all documents on a night whose models changed).</p>"
        + _table("trend-table", cols, _trend_rows(points, labels, False), nums)
    )
    title = (
        f"Corpus trend and tonight, over the last {len(points)} audits"
        if len(points) > 1
        else "Corpus trend and tonight (one audit so far)"
    )
    return _section("trend", title, body)


def _risk_section(r: dict[str, Any]) -> str:
    rows = [
        [
            _num(i + 1),
            _id(s["doc_id"]),
            _num(s["sent_index"]),
            _e(s["text"]),
            _num(s["score"], ".4f"),
        ]
        for i, s in enumerate(r["top_risk"])
    ]
    risk = _e(r["risk_label"])
    intro = (
        f"<p>The {r['top_n']} sentences labelled <b>{risk}</b> with the highest scores "
        f"({len(rows)} found).</p>"
    )
    table = _table("top-risk", ["#", "doc_id", "sentence", "text", "score"], rows, {0, 2, 4})
    if not rows:
        table += f'<p class="note" id="no-risk">No sentence was labelled {risk} this night.</p>'
    return _section("risk", "Highest-risk sentences", intro + table)


def _backend_section(r: dict[str, Any]) -> str:
    share = r["backend_share"]
    if not share:
        return _section(
            "backends",
            "GPU vs CPU-int8 share per stage",
            '<div id="backend-chart" class="chart"><p class="note">No batches were '
            "processed this night.</p></div>",
        )
    rows = [
        [_e(stage), _num(s["batches"])]
        + [_num(s[k], ".1%") for k in SHARE_KEYS]
        + [_e(", ".join(f"{b}: {n}" for b, n in sorted(r["backends"].get(stage, {}).items())))]
        for stage, s in share.items()
    ]
    body = f'<div id="backend-chart" class="chart">{backend_chart(r)}</div>' + _table(
        "backend-table",
        ["stage", "batches", *(SHARE_NAMES[k] for k in SHARE_KEYS), "batches by backend"],
        rows,
        {1, 2, 3, 4},
    )
    if r["resumed_batches"]:
        body += (
            f'<p class="note">{r["resumed_batches"]} batches were committed by an earlier '
            "invocation of this run (resumed); they are counted from their committed "
            "rows.</p>"
        )
    return _section("backends", "GPU vs CPU-int8 share per stage", body)


def _throughput_section(r: dict[str, Any]) -> str:
    t = r["throughput"]
    if not t:
        return _section("throughput", "Throughput", '<p class="note">Nothing ran.</p>')
    rows = [
        ["documents/s", _num(t["documents_per_s"], ",.1f")],
        ["sentences/s", _num(t["sentences_per_s"], ",.1f")],
        ["tokens/s", _num(t["tokens_per_s"], ",.0f")],
        # without start-up (Ray and model loading), which dominates small nights
        ["sentences/s while processing", _num(t["sentences_per_processing_s"], ",.1f")],
        ["wall time (s)", _num(t["wall_seconds"], ",.1f")],
        ["start-up: checks, Ray, models (s)", _num(t["startup_seconds"], ",.1f")],
        ["processing (s)", _num(t["processing_seconds"], ",.1f")],
    ]
    rows += [[_e(f"time in {s} (s)"), _num(v, ",.1f")] for s, v in t["stage_seconds"].items()]
    return _section("throughput", "Throughput", _table("throughput-table", [], rows, {1}))


def _errors_section(r: dict[str, Any]) -> str:
    e = r["errors"]
    if not e["count"]:
        return _section("errors", "Errors", '<p id="no-errors">No document failed.</p>')
    by_type = [[_e(x["stage"]), _e(x["error_type"]), _num(x["count"])] for x in e["by_type"]]
    samples = [
        [_id(x["doc_id"]), _e(x["stage"]), _e(x["error_type"]), _e(x["message"])]
        for x in e["samples"]
    ]
    body = (
        f"<p>{e['count']:,} document{'s' if e['count'] > 1 else ''} failed; each is a row "
        "of the run's errors/ table.</p>"
        + _table("errors-table", ["stage", "error type", "documents"], by_type, {2})
        + "<p>Examples:</p>"
        + _table("error-samples", ["doc_id", "stage", "error type", "message"], samples, set())
    )
    return _section("errors", "Errors", body)


def _engineering(r: dict[str, Any]) -> str:
    """Backends, throughput, tokens and model versions: collapsed, at the end."""
    rows = [["tokens", _num(r["counts"].get("tokens"))]]
    rows += [[_e(f"model: {s}"), _e(v)] for s, v in (r.get("models") or {}).items()]
    return (
        '<details id="engineering"><summary>Engineering detail: backends, throughput, '
        "tokens, models</summary>"
        + _table("engineering-table", [], rows, {1})
        + _backend_section(r)
        + _throughput_section(r)
        + "</details>"
    )


def render_html(report: dict[str, Any]) -> str:
    """One self-contained page: inline CSS and SVG, no scripts, no external resources."""
    title = f"docintel audit {report.get('date', '')}"
    sections = [
        _summary(report),
        changes_section(report),  # short and bounded: what is new tonight, at a glance
        review_section(report),
        entities_section(report),  # watch-listed names in risk sentences, when screened
        watch_section(report),  # [audit] watch hits, when the audit recorded them
        _risk_section(report),
        _trend_section(report),
        _labels_section(report),
        drilldown_section(report),
        entity_drilldown_section(report),
        _errors_section(report),
        _engineering(report),
    ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        f'<p class="sub">run {_id(report.get("run_id") or "—")} · generated '
        f"{_e(report['generated'])}</p>" + "".join(sections) + "</body></html>\n"
    )
