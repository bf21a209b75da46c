"""HTML pages with trafilatura: the main content, without navigation, cookie banners,
asides, footers, scripts or styles; the page's ``<title>`` is the title, not text.

trafilatura's XML output keeps the structure, so each paragraph, heading, list item,
quote and table row becomes a paragraph of its own (separated by blank lines); table
cells are joined with " | " and a ``<br>`` stays a line break. Nothing is fetched: the
page's bytes are all that is read (no URL is given, so no link is followed).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import lxml.html
import trafilatura
from lxml import etree

from docintel.pipeline.parse.errors import EmptyFile
from docintel.pipeline.parse.model import HTML, ParsedDocument

_LINE_BREAK = "\u2028"  # stands for <br> while whitespace is collapsed
_SPACES = re.compile(r"[^\S\u2028]+")
_BLOCK_TAGS = {"p", "head", "list", "table", "quote", "code"}


def _extract(content: object, recall: bool) -> str | None:
    return trafilatura.extract(
        content,
        output_format="xml",
        include_comments=False,
        include_tables=True,
        include_images=False,
        include_links=False,
        deduplicate=False,
        favor_recall=recall,
    )


def _inline(el: etree._Element) -> str:
    """An element's text, whitespace collapsed, ``<lb/>`` as a line break."""
    parts = []
    for node in el.iter():
        if node.tag == "lb":
            parts.append(_LINE_BREAK)
        elif node.text:
            parts.append(node.text)
        if node is not el and node.tail:
            parts.append(node.tail)
    text = _SPACES.sub(" ", "".join(parts))
    return "\n".join(line.strip() for line in text.split(_LINE_BREAK)).strip()


def _blocks(el: etree._Element) -> Iterator[str]:
    """The paragraphs under ``el``, in document order."""
    for child in el:
        if child.tag == "table":
            for row in child.iter("row"):
                cells = [_inline(c) for c in row if c.tag == "cell"]
                if any(cells):
                    yield " | ".join(cells)
        elif any(c.tag in _BLOCK_TAGS for c in child):
            if child.text and child.text.strip():
                yield _SPACES.sub(" ", child.text).strip()
            yield from _blocks(child)
        elif child.tag != "comments":
            text = _inline(child)
            if text:
                yield text


def _load(name: str, content: bytes | str) -> etree._Element:
    try:
        tree = trafilatura.load_html(content)
        if tree is None:  # trafilatura declines fragments (an e-mail's HTML part often is)
            tree = lxml.html.document_fromstring(content)
    except (ValueError, etree.ParserError) as e:
        raise EmptyFile(name, f"no HTML content ({e})", "remove it from the input") from None
    return tree


def _main_text(tree: etree._Element) -> tuple[str, str | None]:
    """(the main text, its first heading or None)."""
    xml = _extract(tree, recall=False) or _extract(tree, recall=True)
    if xml is None:  # too little text for trafilatura's heuristics (a short e-mail)
        body = tree.find(".//body")  # not the <head>: its <title> is not text
        return (trafilatura.html2txt(body).strip() if body is not None else ""), None
    main = etree.fromstring(xml.encode("utf-8")).find("main")
    if main is None:
        return "", None
    heading = main.find(".//head")
    first = _inline(heading) if heading is not None else ""
    return "\n\n".join(_blocks(main)), first or None


def html_text(name: str, content: bytes | str) -> str:
    """The main text of an HTML page or fragment (an e-mail's HTML part)."""
    return _main_text(_load(name, content))[0]


def html_title(tree: etree._Element) -> str | None:
    """The page's ``<title>``, whitespace collapsed; None when it has none."""
    node = tree.find(".//title")
    if node is None:
        return None
    return " ".join("".join(node.itertext()).split()) or None


def parse_html(name: str, data: bytes) -> ParsedDocument:
    """An HTML file as one document; its title is the ``<title>``, else the main
    content's first heading."""
    tree = _load(name, data)
    title = html_title(tree)  # first: extraction prunes the tree it is given
    text, heading = _main_text(tree)
    if not text.strip():
        raise EmptyFile(name, "the page has no main text", "check it renders text, not only script")
    return ParsedDocument("", text, HTML, title=title or heading)
