"""Document files to text: PDF, HTML, DOCX, e-mail, plain text and Markdown.

``parse_file(name, data, limits)`` returns the file's documents (:class:`ParsedDocument`:
text with blank lines between paragraphs, a page map for PDFs, a title, the format) or
raises a :class:`ParseError` subclass saying what is wrong with the file and how to fix
it. No Ray and no I/O here besides the ``tesseract`` subprocess for OCR: the caller reads
the bytes and enforces the per-document time limit.
"""

from __future__ import annotations

from docintel.pipeline.parse.dispatch import DEFAULT_LIMITS, parse_file
from docintel.pipeline.parse.errors import ParseError
from docintel.pipeline.parse.model import FORMATS, ParsedDocument, ParseLimits
from docintel.pipeline.parse.recall import word_recall

__all__ = [
    "DEFAULT_LIMITS",
    "FORMATS",
    "ParseError",
    "ParseLimits",
    "ParsedDocument",
    "parse_file",
    "word_recall",
]
