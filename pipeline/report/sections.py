"""The report's sections about documents: which to review first, what changed tonight,
the watch list, and the drill-down of each reviewed document (html.py lays out the page).

Every document value (ids, sentence text, labels) goes through :func:`markup.esc` (ids
through :func:`markup.ident`, bidi-isolated); the drill-down anchors are ``doc-<rank>``,
never built from a document id.
"""

from __future__ import annotations

from typing import Any

from docintel.pipeline.report.entity_sections import entity_changes_html
from docintel.pipeline.report.markup import (
    doc_anchors,
    doc_link,
    esc,
    ident,
    num,
    section,
    table,
)

SHOWN_IDS = 20  # ids listed per kind of change before "and N more"
CHANGED_SHOWN = 10  # changed documents whose added/removed sentences the page shows


def review_section(r: dict[str, Any]) -> str:
    anchors = doc_anchors(r)
    risk = esc(r["risk_label"])
    rows = []
    for d in r.get("review", [])[: r["top_n"]]:
        sents = "".join(
            f'<div class="rs"><span class="score">{num(s["score"], ".3f")}</span> '
            f"<bdi>{esc(s['text'])}</bdi></div>"
            for s in d["sentences"]
        )
        rows.append(
            [
                num(d["rank"]),
                doc_link(d["doc_id"], anchors),
                f'<span class="id">{esc(d["status"] or "—")}</span>',
                num(d["risk_score"], ".3f"),
                f"{d['risk_sentences']:,} / {d['n_sentences']:,}",
                sents or '<span class="note">no sentence labelled ' + risk + "</span>",
            ]
        )
    total = r.get("review_total", 0)
    intro = (
        f"<p>The night's {total:,} documents ranked by risk score <b>S = M² / N</b>: M is "
        f"the summed probability of the document's sentences labelled <b>{risk}</b>, N its "
        f"number of sentences. The first {min(total, r['top_n']):,} are shown; review.csv "
        "beside this report lists them all (report.json the first 1,000).</p>"
    )
    headers = ["#", "document", "status", "risk score", f"{risk} / sentences",
               f"top {risk} sentences (score)"]  # fmt: skip
    body = intro + table("review-table", headers, rows, {0, 3, 4})
    if not rows:
        body += '<p class="note" id="no-review">No document was processed this night.</p>'
    return section("review", "Documents to review first", body)


def _id_list(list_id: str, title: str, ids: list[str], anchors: dict[str, str]) -> str:
    shown = ", ".join(doc_link(d, anchors) for d in ids[:SHOWN_IDS]) or "none"
    more = len(ids) - SHOWN_IDS
    tail = f' <span class="more">and {more:,} more</span>' if more > 0 else ""
    return f'<p id="{list_id}"><b>{esc(title)} ({len(ids):,}):</b> {shown}{tail}</p>'


def _diff_table(k: int, c: dict[str, Any]) -> str:
    pairs = [
        (kind, s)
        for kind, key in (("added", "added_detail"), ("removed", "removed_detail"))
        for s in c.get(key, [])
    ]
    if not pairs:
        return '<p class="note">Same sentences (only spacing or layout changed).</p>'
    rows = [[kind, esc(s["label"]), num(s["score"], ".3f"), esc(s["text"])] for kind, s in pairs]
    headers = ["", "label", "score", "sentence"]
    return table(f"diff-{k}", headers, rows, {2}, [kind for kind, _ in pairs])


def changes_section(r: dict[str, Any]) -> str:
    ch = r.get("changes")
    if ch is None:
        note = '<p class="note">No document-level changes were recorded with this report.</p>'
        return section("changes", "What changed tonight", note)
    anchors = doc_anchors(r)
    changed = ch["changed"]
    body = (
        _id_list("changes-new", "New", ch["new"], anchors)
        + _id_list("changes-changed", "Changed", [c["doc_id"] for c in changed], anchors)
        + _id_list("changes-removed", "Removed", ch["removed"], anchors)
    )
    if ch.get("reprocessed"):
        body += (
            f'<p class="note">{ch["reprocessed"]:,} unchanged documents were processed again '
            "because a model changed.</p>"
        )
    detailed = [c for c in changed if "added" in c][:CHANGED_SHOWN]
    for k, c in enumerate(detailed):
        body += (
            f'<div class="changed-doc"><h3>{doc_link(c["doc_id"], anchors)} <span class="sub">'
            f"sentences added and removed since its version of "
            f"{esc(c['previous_date'])}</span></h3>{_diff_table(k, c)}</div>"
        )
    more = len(changed) - len(detailed)
    if more > 0:
        body += (
            f'<p class="more">and {more:,} more changed documents: every id is in '
            "changes.csv, their added and removed sentences in report.json.</p>"
        )
    body += entity_changes_html(r)  # listed names in new risk sentences, when screened
    body += '<p class="note">Full lists: changes.csv beside this report, and report.json.</p>'
    return section("changes", "What changed tonight", body)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _watch_cell(key: str, value: object) -> str:
    """One watch-list value as HTML: numbers formatted (a score or similarity as 0.987,
    never the float's 17 digits), ids bidi-isolated, the rest escaped."""
    if isinstance(value, float):
        return num(value, ".3f")
    if _is_number(value):
        return format(value, ",")
    return ident(value) if key == "doc_id" else esc(value)


def watch_section(r: dict[str, Any]) -> str:
    """The ``[audit] watch`` list's hits, when the audit recorded them (key ``watch``:
    a list of flat objects, one row each)."""
    hits = r.get("watch")
    if hits is None:
        return ""
    rows_in = [
        h if isinstance(h, dict) else {"hit": h}
        for h in (hits if isinstance(hits, list) else [hits])
    ]
    keys: list[str] = []
    for h in rows_in:
        keys += [k for k in h if k not in keys]
    rows = [[_watch_cell(k, h.get(k)) for k in keys] for h in rows_in]
    present = {k: [h[k] for h in rows_in if h.get(k) is not None] for k in keys}
    numeric = {j for j, k in enumerate(keys) if present[k] and all(map(_is_number, present[k]))}
    body = table("watch-table", keys, rows, numeric) if rows else '<p class="note">No hits.</p>'
    return section("watch", "Watch list", body)


def drilldown_section(r: dict[str, Any]) -> str:
    risk = r["risk_label"]
    added: dict[str, set[str]] = {
        c["doc_id"]: set(c["added"]) for c in (r.get("changes") or {}).get("changed", [])
        if "added" in c
    }  # fmt: skip
    by_id = {d["doc_id"]: d for d in r.get("review", [])}
    parts = []
    for d in r.get("drilldown", []):
        new_here = added.get(d["doc_id"], set())
        rows, classes = [], []
        for s in d["sentences"]:
            tag = ' <span class="tag">added tonight</span>' if s["text"] in new_here else ""
            page = s.get("page")  # paged formats (PDF): where the sentence starts
            where = "" if page is None else f'<span class="page">p. {esc(page)}</span> '
            rows.append([num(s["sent_index"]), esc(s["label"]), num(s["score"], ".3f"),
                         where + esc(s["text"]) + tag])  # fmt: skip
            classes.append("risk" if s["label"] == risk else "")
        html_table = table(f"doc-{d['rank']}-sentences", ["#", "label", "score", "sentence"],
                           rows, {0, 2}, classes)  # fmt: skip
        info = by_id.get(d["doc_id"], {})
        more = f'<p class="more">and {d["more"]:,} more sentences</p>' if d["more"] else ""
        parts.append(
            f'<section class="doc" id="doc-{int(d["rank"])}"><h3>#{int(d["rank"])} '
            f'{ident(d["doc_id"])} <span class="sub">{esc(info.get("status") or "—")}, risk '
            f"score {num(info.get('risk_score'), '.3f')}</span></h3>{html_table}{more}"
            '<p><a href="#review">back to the review table</a></p></section>'
        )
    body = "".join(parts) or '<p class="note">No document to show.</p>'
    return section("drilldown", "Reviewed documents, sentence by sentence", body)
