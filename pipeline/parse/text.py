"""Plain text and Markdown files: decoded, line ends normalised, kept as they are.

Decoding: a byte-order mark decides (UTF-8, UTF-16 or UTF-32, the mark dropped); else
valid UTF-8 is UTF-8; else the encoding ``docintel ingest`` detects
(:func:`docintel.pipeline.input.encoding.detect_encoding`, charset-normalizer), so both commands
read a file the same way; else UTF-8 with the bad bytes replaced (U+FFFD). A file with NUL
bytes (and no UTF-16/32 mark) is binary, not text.

Markdown keeps its text, emphasis and link syntax included: only the ``#`` markers of ATX
headings are dropped and a blank line is put after every heading. A heading is then a
paragraph of its own (a hard sentence boundary: "# Results" does not fuse with the
sentence below it) and its words read as words; the first heading is the title. Nothing
inside a fenced code block is touched (``# comment`` there is code).
"""

from __future__ import annotations

import re

from docintel.pipeline.input.encoding import BOMS
from docintel.pipeline.parse.errors import EmptyFile, NotText
from docintel.pipeline.parse.model import MD, TXT, ParsedDocument

SNIFF_BYTES = 8 * 1024  # a NUL byte in the first 8 KiB means binary (as ingest decides)
_ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def decode(name: str, data: bytes) -> str:
    """The text of a file's bytes (see the module docstring), line ends as ``\\n``."""
    for bom, encoding in BOMS:
        if data.startswith(bom):
            text = data[len(bom) :].decode(encoding, errors="replace")
            return _newlines(text)
    if b"\0" in data[:SNIFF_BYTES]:
        raise NotText(
            name,
            "binary content (NUL bytes), not text",
            "convert it to UTF-8 text, or give it the extension of its real format",
        )
    try:
        return _newlines(data.decode("utf-8"))
    except UnicodeDecodeError:
        pass
    from docintel.pipeline.input.encoding import detect_encoding

    encoding = detect_encoding(data) or "utf-8"
    return _newlines(data.decode(encoding, errors="replace"))


def _newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def markdown(text: str) -> tuple[str, str | None]:
    """(the text with ATX heading markers dropped and a blank line around each heading,
    the first heading's text or None)."""
    out: list[str] = []
    title: str | None = None
    fence: str | None = None
    for line in text.split("\n"):
        opened = _FENCE.match(line)
        heading = _ATX.match(line) if fence is None and not opened else None
        if opened and fence is None:
            fence = opened.group(1)
        elif (
            opened
            and fence
            and opened.group(1)[0] == fence[0]
            and len(opened.group(1)) >= len(fence)
        ):
            fence = None
        if heading is None:
            if line.strip() or not out or out[-1].strip():
                out.append(line)  # runs of blank lines become one
            continue
        words = heading.group(2).strip()
        if title is None and words:
            title = words
        if out and out[-1].strip():
            out.append("")
        out.extend([words, ""])
    return "\n".join(out), title


def parse_text(name: str, data: bytes, fmt: str) -> ParsedDocument:
    """A .txt (``fmt`` "txt") or .md (``fmt`` "md") file as one document."""
    text = decode(name, data)
    title = None
    if fmt == MD:
        text, title = markdown(text)
    if not text.strip():
        raise EmptyFile(name, "contains only whitespace, no text", "remove it from the input")
    return ParsedDocument("", text, MD if fmt == MD else TXT, title=title)
