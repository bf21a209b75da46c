"""DOCX files with python-docx: body paragraphs and tables in document order.

Each non-empty paragraph is a paragraph of the text (headings included, as their own);
each table row is one paragraph, its cells joined with " | " (a merged cell once).
The title is the document's core ``title`` property, else its first heading. Page
headers, footers, footnotes and text boxes are not body text and are left out. The zip
is checked for bombs first (:mod:`.zipguard`); python-docx parses the XML with entity
resolution off, so an XML entity bomb does not expand either.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from docintel.pipeline.parse.detect import WORD_MAIN_PART
from docintel.pipeline.parse.errors import CorruptFile, EmptyFile, NotAWordDocument
from docintel.pipeline.parse.model import DOCX, ParsedDocument, ParseLimits
from docintel.pipeline.parse.zipguard import checked_zip

if TYPE_CHECKING:
    from docx.document import Document as WordDocument
    from docx.oxml.xmlchemy import BaseOxmlElement
    from docx.table import Table
    from docx.text.paragraph import Paragraph

CELL_SEPARATOR = " | "
_SPACES = re.compile(r"[^\S\n]+")


def _clean(text: str) -> str:
    return "\n".join(_SPACES.sub(" ", line).strip() for line in text.split("\n")).strip()


def _rows(table: Table) -> Iterator[str]:
    for row in table.rows:
        seen: set[int] = set()
        cells = []
        for cell in row.cells:
            if id(cell._tc) in seen:
                continue  # a merged cell repeats in every column it spans
            seen.add(id(cell._tc))
            cells.append(_clean(cell.text).replace("\n", " "))
        if any(cells):
            yield CELL_SEPARATOR.join(cells)


def _is_heading(paragraph: Paragraph) -> bool:
    style = paragraph.style
    name = ((style.name if style is not None else None) or "").lower()
    return name.startswith("heading") or name == "title"


def _body_blocks(element: BaseOxmlElement, parent: WordDocument) -> Iterator[Paragraph | Table]:
    """The paragraphs and tables under ``element`` in order, inside content controls
    (``w:sdt``: cover pages and tables of contents of Word's templates) too."""
    from docx.oxml.ns import qn
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    for child in element.iterchildren():
        if child.tag == qn("w:p"):
            yield Paragraph(child, parent)
        elif child.tag == qn("w:tbl"):
            yield Table(child, parent)
        elif child.tag == qn("w:sdt"):
            content = child.find(qn("w:sdtContent"))
            if content is not None:
                yield from _body_blocks(content, parent)


def _paragraphs(document: WordDocument) -> tuple[list[str], str | None]:
    from docx.table import Table

    out: list[str] = []
    heading: str | None = None
    for block in _body_blocks(document.element.body, document):
        if isinstance(block, Table):
            out.extend(_rows(block))
            continue
        text = _clean(block.text)
        if text:
            out.append(text)
            if heading is None and _is_heading(block):
                heading = text
    return out, heading


def parse_docx(name: str, data: bytes, limits: ParseLimits) -> ParsedDocument:
    """A DOCX file as one document."""
    from docx import Document
    from docx.opc.exceptions import PackageNotFoundError

    zf = checked_zip(name, data, limits.max_uncompressed_bytes)
    if WORD_MAIN_PART not in zf.namelist():
        raise NotAWordDocument(
            name,
            f"a zip archive without {WORD_MAIN_PART}, so not a Word document",
            "check the file's real type (an .xlsx or .pptx renamed?)",
        )
    try:
        document = Document(io.BytesIO(data))
        paragraphs, heading = _paragraphs(document)
        core_title = document.core_properties.title
    except (PackageNotFoundError, KeyError, ValueError, zipfile.BadZipFile, SyntaxError) as e:
        raise CorruptFile(
            name, f"not a readable Word document ({e})", "re-save it from Word"
        ) from None
    if not paragraphs:
        raise EmptyFile(name, "the document has no text", "remove it from the input")
    title = (core_title or "").strip() or heading
    return ParsedDocument("", "\n\n".join(paragraphs), DOCX, title=title)
