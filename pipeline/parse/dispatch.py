"""``parse_file``: one file's bytes to its documents, by the parser its format needs."""

from __future__ import annotations

from dataclasses import replace

from docintel.pipeline.parse import detect
from docintel.pipeline.parse.errors import CorruptFile, EmptyFile, FileTooLarge, ParseError
from docintel.pipeline.parse.model import (
    DOCX,
    EML,
    HTML,
    PDF,
    ParsedDocument,
    ParseLimits,
)

DEFAULT_LIMITS = ParseLimits()


def parse_file(
    name: str, data: bytes, limits: ParseLimits = DEFAULT_LIMITS
) -> list[ParsedDocument]:
    """The documents in one file: the file's own first, then (e-mail) its attachments'.

    ``name`` is the file's name or path (its extension chooses the parser, checked
    against the content); ``data`` its bytes. A file that cannot be parsed raises a
    :class:`~docintel.pipeline.parse.errors.ParseError` subclass; an attachment that cannot
    be is returned as a document with ``error`` set.
    """
    return _parse(name, data, limits, 0)


def _parse(name: str, data: bytes, limits: ParseLimits, depth: int) -> list[ParsedDocument]:
    if len(data) > limits.max_bytes:
        raise FileTooLarge(
            name,
            f"{len(data):,} bytes, over the {limits.max_bytes:,}-byte limit",
            "split it, or raise `max_bytes` in the [parse] section of the config",
        )
    if not data.strip():
        raise EmptyFile(name, "the file is empty", "remove it from the input, or fill it")
    fmt, note = "unknown", None
    try:
        fmt, note = detect.choose(name, data)
        docs = _by_format(name, data, fmt, limits, depth)
    except (ParseError, MemoryError):
        raise
    except Exception as e:  # a library tripping on a malformed file: the file's fault
        raise CorruptFile(
            name,
            f"the {fmt} parser could not read it ({type(e).__name__}: {e})",
            "check the file, or re-export it",
        ) from e
    if note:
        docs[0] = replace(docs[0], notes=(note, *docs[0].notes))
    return docs


def _by_format(
    name: str, data: bytes, fmt: str, limits: ParseLimits, depth: int
) -> list[ParsedDocument]:
    if fmt == PDF:
        from docintel.pipeline.parse.pdf import parse_pdf

        return [parse_pdf(name, data, limits)]
    if fmt == HTML:
        from docintel.pipeline.parse.html_page import parse_html

        return [parse_html(name, data)]
    if fmt == DOCX:
        from docintel.pipeline.parse.word import parse_docx

        return [parse_docx(name, data, limits)]
    if fmt == EML:
        from docintel.pipeline.parse.eml import parse_eml

        return parse_eml(name, data, depth, lambda n, d, k: _parse(n, d, limits, k))
    from docintel.pipeline.parse.text import parse_text

    return [parse_text(name, data, fmt)]
