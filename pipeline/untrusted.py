"""User-controlled text (file names, doc ids, sentences, job logs) where people read it:
a terminal, a JSON line, a spreadsheet cell, a web page. One list of the dangerous code
points for all of them (:data:`CONTROLS`), so that the terminal (``docintel.jobs.ui.safe``),
``search --json``, the report's CSVs and its HTML agree on what is escaped.

Every CSV docintel writes passes its string cells through :func:`csv_cell`; every JSON
document or line that holds such text is written by :func:`json_text`.
"""

from __future__ import annotations

import json
import re
from typing import Any

# What a terminal acts on instead of showing, and what makes one name look like another:
# C0 controls (ESC starts colour, cursor and title sequences; CR overwrites a line; BS
# erases), DEL, C1 controls (U+009B is a one-character CSI), the Unicode controls that
# reorder or break lines (the bidi marks U+200E/U+200F/U+061C, embeddings and overrides
# U+202A-U+202E, isolates U+2066-U+2069, line/paragraph separators U+2028/U+2029), and lone
# surrogates (undecodable bytes of a file name), which would make a print or an encode
# fail. CONTROLS is the part above U+001F: the C0 range is added by each pattern below.
CONTROLS = r"\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
UNSAFE_LINE = re.compile(rf"[\x00-\x1f{CONTROLS}]")  # a name, an id: one line
UNSAFE_TEXT = re.compile(rf"[\x00-\x08\x0b-\x1f{CONTROLS}]")  # keeps tab and newline
_UNSAFE_JSON = re.compile(f"[{CONTROLS}]")  # json.dumps escapes C0 itself

# What a spreadsheet (Excel, LibreOffice, Google Sheets) reads as the start of a formula:
# OWASP's CSV-injection list. Leading spaces do not make a cell text in every program.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text: object, *, multiline: bool = False) -> str:
    """``text`` with every control character of :data:`CONTROLS` and C0 as a visible
    escape such as ``\\x1b`` or ``\\u202e``; the rest is kept as is. A single line (file
    names, ids, paths) escapes newline and tab too, so a name cannot forge lines;
    ``multiline`` keeps them (and turns CRLF into LF) for log text, messages, sentences."""
    s = str(text)
    if multiline:
        return UNSAFE_TEXT.sub(_visible, s.replace("\r\n", "\n"))
    return UNSAFE_LINE.sub(_visible, s)


def _json_escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def json_text(value: Any, **dumps: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **dumps)`` with the code points of
    :data:`CONTROLS` written as ``\\uXXXX`` escapes: readable UTF-8 for everything else,
    and a file or line that no pager or terminal acts on. A parser reads the same value
    back (outside strings JSON is ASCII, so every match is inside a string)."""
    return _UNSAFE_JSON.sub(_json_escape, json.dumps(value, ensure_ascii=False, **dumps))


def csv_cell(value: str) -> str:
    """``value`` as a spreadsheet cell that shows it and never runs it: control
    characters as visible escapes (:func:`visible`, tab and newline kept), and (CSV
    injection) a cell that starts with = + - @, a tab or a carriage return, also after
    leading whitespace, gets a leading apostrophe, which spreadsheets show as text."""
    value = visible(value, multiline=True)
    if value.startswith(FORMULA_START) or value.lstrip().startswith(FORMULA_START):
        return "'" + value
    return value
