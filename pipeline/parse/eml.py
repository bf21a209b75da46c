"""E-mail files (RFC 822 / MIME) with the standard library's ``email`` (policy=default).

The body is the plain-text part, else the HTML part read through the HTML path; the
subject is the title. Each attachment of a supported type becomes a document of its own
(doc_id ``<path>/<attachment name>``), parsed by the same dispatcher, attached e-mails
included (down to MAX_DEPTH); an attachment that fails is its own error, not the
e-mail's. Other attachments (images, spreadsheets) are skipped and noted.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import PurePosixPath
from typing import cast

from docintel.pipeline.parse.detect import EXTENSIONS
from docintel.pipeline.parse.errors import EmptyFile, ParseError, UnsupportedFormat
from docintel.pipeline.parse.html_page import html_text
from docintel.pipeline.parse.model import EML, ParsedDocument

# Attached e-mails are parsed to this depth (a forward of a forward of a forward); deeper
# ones are skipped and noted, so a crafted nesting cannot recurse without bound.
MAX_DEPTH = 3
# More attachments than this are skipped and noted: bulk mail with thousands of parts is
# not correspondence, and each attachment is a parse of its own.
MAX_ATTACHMENTS = 100
_UNSAFE_NAME = re.compile(r"[/\\\x00-\x1f]")

# (name, bytes, depth) -> the documents in it; raises ParseError
ParseAttachment = Callable[[str, bytes, int], list[ParsedDocument]]


def _content(part: EmailMessage) -> str:
    try:
        content = part.get_content()
    except (LookupError, ValueError, AssertionError):  # unknown charset, bad encoding
        content = (part.get_payload(decode=True) or b"").decode("utf-8", errors="replace")
    return content if isinstance(content, str) else ""


def body_text(name: str, msg: EmailMessage) -> str:
    """The message's text: its plain part, else its HTML part's main text."""
    body = msg.get_body(preferencelist=("plain", "html"))
    if body is None:
        return ""
    content = _content(body).replace("\r\n", "\n")
    if body.get_content_subtype() == "html":
        return html_text(name, content) if content.strip() else ""
    return content.strip()


def _attachment_name(part: EmailMessage, index: int, taken: set[str]) -> str:
    raw = part.get_filename() or (
        f"attachment-{index}.eml" if part.get_content_type() == "message/rfc822" else ""
    )
    base = _UNSAFE_NAME.sub("_", raw).strip(". ") or f"attachment-{index}"
    stem, suffix = base[: len(base) - len(PurePosixPath(base).suffix)], PurePosixPath(base).suffix
    name, n = base, 2
    while name in taken:  # two attachments of one name: report.pdf, report (2).pdf
        name, n = f"{stem} ({n}){suffix}", n + 1
    taken.add(name)
    return name


def _payload(part: EmailMessage) -> bytes:
    if part.get_content_type() == "message/rfc822":
        inner = part.get_content()
        return inner.as_bytes() if isinstance(inner, EmailMessage) else b""
    return part.get_payload(decode=True) or b""


def attachments(
    name: str, msg: EmailMessage, depth: int, parse: ParseAttachment, notes: list[str]
) -> list[ParsedDocument]:
    """The documents of the message's attachments; skipped ones are noted."""
    out: list[ParsedDocument] = []
    taken: set[str] = set()
    for index, part in enumerate(msg.iter_attachments(), start=1):
        att = _attachment_name(part, index, taken)
        if index > MAX_ATTACHMENTS or depth >= MAX_DEPTH:
            why = f"over {MAX_ATTACHMENTS} attachments" if depth < MAX_DEPTH else "nested too deep"
            notes.append(f"{name}: attachment {att} skipped ({why})")
            continue
        try:
            docs = parse(att, _payload(part), depth + 1)
        except UnsupportedFormat:
            notes.append(f"{name}: attachment {att} skipped (not a supported document type)")
            continue
        except ParseError as e:
            fmt = EXTENSIONS.get(PurePosixPath(att).suffix.lower(), "unknown")
            docs = [ParsedDocument("", "", fmt, error=e)]
        for doc in docs:
            suffix = f"{att}/{doc.doc_id_suffix}" if doc.doc_id_suffix else att
            out.append(replace(doc, doc_id_suffix=suffix))
    return out


def parse_eml(name: str, data: bytes, depth: int, parse: ParseAttachment) -> list[ParsedDocument]:
    """An e-mail as its own document followed by its attachments' documents."""
    msg = cast("EmailMessage", BytesParser(policy=policy.default).parsebytes(data))
    notes: list[str] = []
    text = body_text(name, msg)
    subject = " ".join(str(msg.get("subject", "") or "").split()) or None
    found = attachments(name, msg, depth, parse, notes)
    if not text.strip() and not found:
        raise EmptyFile(name, "the e-mail has no body text and no attachments", "remove it")
    main = ParsedDocument("", text, EML, title=subject, notes=tuple(notes))
    return [main, *found]
