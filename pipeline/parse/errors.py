"""Why a file could not be parsed: one :class:`ParseError` subclass per case.

Each message names the file, says what is wrong and how to fix it; ``reason`` is a short
stable code for the error row (the documents table's error column, the errors table's
error_type is the class name). A parser raises these and nothing else for a bad file:
an exception of another type out of a parser is a bug in docintel, not in the file.
"""

from __future__ import annotations

from typing import ClassVar

from docintel.pipeline.errors import DocintelError


class ParseError(DocintelError):
    """A file that cannot be parsed. ``name`` is the file (or attachment) name."""

    reason: ClassVar[str] = "unparseable"

    def __init__(self, name: str, problem: str, fix: str = "") -> None:
        self.name = name
        self.problem = problem
        self.fix = fix
        super().__init__(f"{name}: {problem}" + (f"; {fix}" if fix else ""))


class EmptyFile(ParseError):
    reason = "empty"


class FileTooLarge(ParseError):
    reason = "too_large"


class TooManyPages(ParseError):
    reason = "too_many_pages"


class CorruptFile(ParseError):
    """Truncated or damaged bytes: the format is recognised but cannot be read."""

    reason = "corrupt"


class TruncatedFile(CorruptFile):
    reason = "truncated"


class PasswordProtected(ParseError):
    reason = "password_protected"


class NotAZip(ParseError):
    """A .docx that is not a zip archive at all."""

    reason = "not_a_zip"


class NotAWordDocument(ParseError):
    """A zip archive without word/document.xml."""

    reason = "not_a_word_document"


class ZipBomb(ParseError):
    reason = "zip_bomb"


class NoTextLayer(ParseError):
    """A PDF whose pages carry no text (a scan) and OCR is off."""

    reason = "no_text_layer"


class OcrUnavailable(ParseError):
    reason = "ocr_unavailable"


class OcrFailed(ParseError):
    reason = "ocr_failed"


class NotText(ParseError):
    """A .txt or .md file whose bytes are binary."""

    reason = "not_text"


class UnsupportedFormat(ParseError):
    reason = "unsupported_format"
