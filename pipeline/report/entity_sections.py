"""The report's "Watch-listed names" section, its drill-down and the new mentions of the
changes (entities.py builds the dict keys they read; html.py lays out the page).

Only a run screened against watch lists (``entities_screened``) gets them. Every name,
list, id and sentence goes through :func:`markup.esc` (names and ids through
:func:`markup.ident`, bidi-isolated); the matched name in a sentence is marked by escaping
the text before, in and after the match separately. Anchors are ``entity-<rank>``, never
built from an entity id.
"""

from __future__ import annotations

from typing import Any

from docintel.pipeline.report.entities import ENTITIES
from docintel.pipeline.report.markup import doc_anchors, doc_link, esc, ident, num, section, table

ENTITY_INLINE = 3  # risk sentences per entity in the section's table (all in its drill-down)
SHOWN_NAMES = 20  # names listed with new mentions in "What changed tonight" before "and N more"


def marked(text: str, start: object, end: object) -> str:
    """The sentence escaped, the entity's match (``text[start:end]``) in ``<mark>``."""
    if isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(text):
        return f"{esc(text[:start])}<mark>{esc(text[start:end])}</mark>{esc(text[end:])}"
    return esc(text)


def _shown(r: dict[str, Any]) -> list[dict[str, Any]]:
    return list(r.get(ENTITIES) or [])[: r["top_n"]]


def _name_link(e: dict[str, Any], top_n: int) -> str:
    name = ident(e["name"], "name")
    if e["rank"] <= top_n:
        return f'<a class="entity-link" href="#entity-{int(e["rank"])}">{name}</a>'
    return name


def _listed_as(e: dict[str, Any]) -> str:
    kind = f", {esc(e['type'])}" if e.get("type") else ""
    return f'<div class="sub">{ident(e["list"], "list")} · {ident(e["entity_id"])}{kind}</div>'


def _sentence_lines(e: dict[str, Any], anchors: dict[str, str]) -> str:
    return "".join(
        f'<div class="rs"><span class="score">{num(s["score"], ".3f")}</span> '
        f"{doc_link(s['doc_id'], anchors)}: <bdi>{marked(s['text'], s['start'], s['end'])}</bdi>"
        "</div>"
        for s in e["sentences"][:ENTITY_INLINE]
    )


def entities_section(r: dict[str, Any]) -> str:
    """Each listed entity named in a risk sentence tonight, ranked by its risk score."""
    if not r.get("entities_screened"):
        return ""
    risk, anchors, top_n = esc(r["risk_label"]), doc_anchors(r), r["top_n"]
    rows = [
        [
            num(e["rank"]),
            _name_link(e, top_n) + _listed_as(e),
            num(e["risk_score"], ".3f"),
            f"{e['risk_sentences']:,} in {e['documents']:,}",
            num(e.get("new_mentions")),
            num(e.get("previous_risk_sentences")),
            _sentence_lines(e, anchors),
        ]
        for e in _shown(r)
    ]
    total = r.get("entities_total", 0)
    intro = (
        f"<p>The {total:,} listed names that tonight's sentences labelled <b>{risk}</b> name, "
        f"ranked by risk score <b>E</b>: the summed score of those sentences (each counted "
        f"once per name). The first {min(total, top_n):,} are shown; entities.csv beside this "
        f"report lists them all, report.json the first 1,000 with their sentences.</p>"
    )
    headers = ["#", "name", "risk score", f"{risk} sentences in documents", "new tonight",
               "last audit", f"top {risk} sentences (score)"]  # fmt: skip
    body = intro + table("entities-table", headers, rows, {0, 2, 3, 4, 5})
    if not rows:
        body += (
            f'<p class="note" id="no-entities">No listed name was named in a sentence '
            f"labelled {risk} this night.</p>"
        )
    return section(ENTITIES, "Watch-listed names", body)


def entity_drilldown_section(r: dict[str, Any]) -> str:
    """Every kept risk sentence of each shown entity, with the name marked."""
    shown = _shown(r) if r.get("entities_screened") else []
    if not shown:
        return ""
    anchors, parts = doc_anchors(r), []
    for e in shown:
        rank = int(e["rank"])
        rows = [
            [doc_link(s["doc_id"], anchors), num(s["sent_index"]), num(s["score"], ".3f"),
             marked(s["text"], s["start"], s["end"])]
            for s in e["sentences"]
        ]  # fmt: skip
        headers = ["document", "#", "score", "sentence"]
        more = e["risk_sentences"] - len(e["sentences"])
        tail = f'<p class="more">and {more:,} more sentences</p>' if more > 0 else ""
        parts.append(
            f'<section class="doc" id="entity-{rank}"><h3>#{rank} {ident(e["name"], "name")} '
            f'<span class="sub">{ident(e["list"], "list")} · {ident(e["entity_id"])}, risk '
            f"score {num(e['risk_score'], '.3f')}</span></h3>"
            + table(f"entity-{rank}-sentences", headers, rows, {1, 2})
            + tail
            + '<p><a href="#entities">back to the watch-listed names</a></p></section>'
        )
    return section("entity-drilldown", "Watch-listed names, sentence by sentence", "".join(parts))


def _last_audit(e: dict[str, Any]) -> str:
    before = e.get("previous_risk_sentences")
    if before is None:
        return ""
    return " (not named last audit)" if before == 0 else f" (last audit {before:,})"


def entity_changes_html(r: dict[str, Any]) -> str:
    """The changes' listed names with new risk mentions tonight (key ``changes.entities``);
    nothing for a run that was not screened."""
    named = (r.get("changes") or {}).get(ENTITIES)
    if named is None:
        return ""
    total = (r.get("changes") or {}).get("entities_total", len(named))
    shown = ", ".join(
        f"{_name_link(e, r['top_n'])} ({ident(e['list'], 'list')}) "
        f"+{e['new_mentions']:,}{esc(_last_audit(e))}"
        for e in named[:SHOWN_NAMES]
    )
    more = total - min(len(named), SHOWN_NAMES)
    tail = f' <span class="more">and {more:,} more</span>' if more > 0 else ""
    return (
        f'<p id="changes-entities"><b>Watch-listed names in new {esc(r["risk_label"])} '
        f"sentences ({total:,}):</b> {shown or 'none'}{tail}</p>"
    )
