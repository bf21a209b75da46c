"""Which parser reads a file: its extension, checked against its first bytes.

A file is parsed as what its content positively is (PDF magic, a zip holding
word/document.xml, HTML tags, RFC 822 headers); the extension decides otherwise. A
mislabelled file is parsed as what it is and a note says so. Text-looking bytes are not
a positive identification (any bytes are "text" to someone): a ``.pdf`` or ``.docx`` that
is not one is refused by its own parser, with a message saying what it lacks.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import PurePosixPath

from docintel.pipeline.parse.errors import UnsupportedFormat
from docintel.pipeline.parse.model import DOCX, EML, HTML, MD, PDF, TXT

EXTENSIONS = {
    ".pdf": PDF,
    ".html": HTML,
    ".htm": HTML,
    ".docx": DOCX,
    ".eml": EML,
    ".txt": TXT,
    ".md": MD,
}
# The PDF specification lets a reader find %PDF- within the first 1,024 bytes (some
# producers write a few bytes of junk first).
PDF_MAGIC_WINDOW = 1024
ZIP_MAGIC = b"PK\x03\x04"
WORD_MAIN_PART = "word/document.xml"
# HTML is recognised when it opens with a tag and its html/head/body tags come in the
# first 2 KiB (a text file that mentions <body> further on, or later, stays text).
HTML_WINDOW = 2048
_HTML_START = re.compile(
    rb"(<\?xml[^>]*>\s*)?(<!--.*?-->\s*)*<(!doctype\s+html|html[\s>])", re.I | re.S
)
_HTML_TAG = re.compile(rb"<(html|head|body)[\s>]", re.I)
# RFC 822 / 5322 headers: "Name: value" lines (and folded continuations) up to a blank
# line, with From and at least one more header a mail client always writes.
_HEADER = re.compile(rb"^[!-9;-~]+:[ \t]?")
_MAIL_HEADERS = {b"date", b"subject", b"to", b"message-id", b"mime-version", b"received"}
HEADER_WINDOW = 16 * 1024  # header blocks are short; only this much is looked at


def sniff(data: bytes) -> str | None:
    """The format the bytes positively are, or None (text, or unknown bytes)."""
    if b"%PDF-" in data[:PDF_MAGIC_WINDOW]:
        return PDF
    if data.startswith(ZIP_MAGIC):
        return DOCX if _zip_has(data, WORD_MAIN_PART) else "zip"
    if _looks_like_mail(data[:HEADER_WINDOW]):
        return EML
    head = data[:HTML_WINDOW].removeprefix(b"\xef\xbb\xbf").lstrip()
    if head.startswith(b"<") and (_HTML_START.match(head) or _HTML_TAG.search(head)):
        return HTML
    return None


def _zip_has(data: bytes, member: str) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return any(info.filename == member for info in zf.infolist())
    except Exception:  # any damage (bad directory, unknown zip version): not a docx here;
        return False  # the docx parser names the damage if the file is one by extension


def _looks_like_mail(head: bytes) -> bool:
    names: set[bytes] = set()
    lines = head.replace(b"\r\n", b"\n").split(b"\n")
    for i, line in enumerate(lines):
        if not line:
            break
        if line[:1] in (b" ", b"\t") and i > 0:
            continue  # a folded header continues the previous one
        if i == 0 and line.startswith(b"From "):
            continue  # the mbox separator line
        if not _HEADER.match(line):
            return False
        names.add(line.split(b":", 1)[0].lower())
    else:
        return False  # no blank line ends the header block within the window
    return b"from" in names and bool(names & _MAIL_HEADERS)


def choose(name: str, data: bytes) -> tuple[str, str | None]:
    """(format to parse as, a note when the content overrides the extension)."""
    declared = EXTENSIONS.get(PurePosixPath(name).suffix.lower())
    actual = sniff(data)
    if actual in (None, "zip") or actual == declared:
        if declared is None:
            raise UnsupportedFormat(
                name,
                "not a supported document type (by extension or content)",
                "supported: " + ", ".join(sorted(EXTENSIONS)),
            )
        return declared, None
    if declared == MD and actual == HTML:
        return declared, None  # Markdown may open with inline HTML: it stays Markdown
    what = f"named {PurePosixPath(name).suffix or 'without an extension'}"
    return actual, f"{name}: {what} but its content is {actual.upper()}; parsed as {actual}"
