"""HTML building blocks of the report page, shared by html.py and sections.py: escaping
(every value from a document is untrusted), numbers, tables and sections.

Untrusted text is HTML-escaped and its control characters (C0 but tab and newline, C1,
bidi overrides, isolates and marks; docintel.pipeline.untrusted) shown as visible escapes
such as ``\\u202e``; ids and other names are also bidi-isolated (``<bdi>``), so a
right-to-left name cannot reorder the text around it."""

from __future__ import annotations

import html
from typing import Any

from docintel.pipeline.untrusted import visible


def esc(value: object) -> str:
    """Escape anything for HTML text or attribute context (sentence text is untrusted):
    markup characters as entities, control characters as visible escapes."""
    return html.escape("" if value is None else visible(value, multiline=True), quote=True)


def ident(value: object, cls: str = "id") -> str:
    """A doc id, run id, path or file name as HTML: escaped (:func:`esc`), one line (no
    newline or tab), in its own bidi isolate."""
    text = "" if value is None else visible(value)
    return f'<bdi class="{cls}">{html.escape(text, quote=True)}</bdi>'


def num(value: float | None, fmt: str = ",") -> str:
    return "—" if value is None else format(value, fmt)


def table(
    table_id: str,
    headers: list[str],
    rows: list[list[str]],
    nums: set[int],
    row_classes: list[str] | None = None,
) -> str:
    """An HTML table; cells are already escaped, column indexes in ``nums`` right-aligned.
    No ``headers``: a key/value table without a header row. ``row_classes``: a CSS class
    per row (plain words)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    classes = row_classes or [""] * len(rows)
    body = "".join(
        (f'<tr class="{esc(cls)}">' if cls else "<tr>")
        + "".join(
            f'<td class="{"num" if j in nums else "text"}">{c}</td>' for j, c in enumerate(row)
        )
        + "</tr>"
        for row, cls in zip(rows, classes, strict=True)
    )
    return f'<table id="{table_id}">{thead}<tbody>{body}</tbody></table>'


def yes_no(value: object) -> str | None:
    return None if value is None else ("yes" if value else "no")


def section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{esc(title)}</h2>{body}</section>'


def doc_anchors(r: dict[str, Any]) -> dict[str, str]:
    """The drill-down anchor (``doc-<rank>``, never built from an id) of each document the
    report shows sentence by sentence."""
    return {d["doc_id"]: f"doc-{int(d['rank'])}" for d in r.get("drilldown", [])}


def doc_link(doc_id: str, anchors: dict[str, str]) -> str:
    """A document id, linked to its drill-down when the report has one."""
    if doc_id in anchors:
        return f'<a class="doc-link" href="#{anchors[doc_id]}">{ident(doc_id)}</a>'
    return ident(doc_id)
