"""What a parser returns (:class:`ParsedDocument`) and the bounds it works under
(:class:`ParseLimits`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from docintel.pipeline.parse.errors import ParseError

# Formats a parser produces (the documents table's source_format, less "parquet").
PDF, HTML, DOCX, EML, TXT, MD = "pdf", "html", "docx", "eml", "txt", "md"
FORMATS = (PDF, HTML, DOCX, EML, TXT, MD)

# A file larger than this is refused before it is parsed: a 300-page annual report with
# photographs is 10-50 MiB, so 128 MiB is a generous ceiling, and a CPU replica holds the
# bytes, the parser's copy of them and the text at once (a few times this) comfortably.
DEFAULT_MAX_BYTES = 128 * 1024 * 1024
# A PDF with more pages than this is refused: a long filing (a 10-K with its exhibits) runs
# to a few hundred pages; beyond 2,000 it is a scan archive or a concatenation to split, and
# one document must not hold a replica for long (OCR takes seconds per page).
DEFAULT_MAX_PAGES = 2_000
# OCR is off by default: it needs the tesseract binary (Debian package tesseract-ocr) and
# takes seconds per page, so a PDF without a text layer is an error row unless asked for.
DEFAULT_OCR = False
# The most a DOCX (a zip) may hold once decompressed, counted before and while reading:
# Word's XML compresses 5-20x, so a 128 MiB document stays well below 1 GiB, while a zip
# bomb (a few KiB that inflate to GBs) is refused without being inflated.
DEFAULT_MAX_UNCOMPRESSED_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True)
class ParseLimits:
    """The bounds one file is parsed under (the ``[parse]`` config section's values)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_pages: int = DEFAULT_MAX_PAGES
    ocr: bool = DEFAULT_OCR
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES


@dataclass(frozen=True)
class ParsedDocument:
    """One document's text as a parser extracted it.

    ``doc_id_suffix`` is "" for the file itself and the attachment's name (``a.pdf``, or
    ``inner.eml/a.pdf`` for an attachment of an attached e-mail) for a document found
    inside it: its doc_id is ``doc_id(path)``. ``pages`` maps each page (1-based page =
    index + 1) to its ``[start, end)`` character range in ``text`` (PDF only, else None).
    Paragraphs are separated by a blank line (``"\\n\\n"``), never anything else.
    ``notes`` says what the parser noticed but did not refuse (a mislabelled file, pages
    without a text layer, attachments skipped). ``error`` is set, and ``text`` empty, only
    for an attachment that could not be parsed: it becomes its own error row, the e-mail
    and its other attachments do not fail with it.
    """

    doc_id_suffix: str
    text: str
    source_format: str
    pages: list[tuple[int, int]] | None = None
    title: str | None = None
    n_pages: int | None = None
    notes: tuple[str, ...] = ()
    error: ParseError | None = field(default=None, compare=False)

    def doc_id(self, path: str) -> str:
        """The document's id, given the file's (the path relative to the input root)."""
        return f"{path}/{self.doc_id_suffix}" if self.doc_id_suffix else path

    def page_of(self, char: int) -> int | None:
        """The 1-based page a character offset falls on (None without a page map)."""
        if self.pages is None:
            return None
        for number, (start, end) in enumerate(self.pages, start=1):
            if start <= char < end:
                return number
        return None
