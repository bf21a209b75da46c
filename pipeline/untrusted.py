"""User-controlled text (file names, doc ids, sentences) where people read it: a
spreadsheet cell never starts a formula.

Every CSV docintel writes passes its string cells through :func:`csv_cell`.
"""

from __future__ import annotations

# What a spreadsheet (Excel, LibreOffice, Google Sheets) reads as the start of a formula:
# OWASP's CSV-injection list. Leading spaces do not make a cell text in every program.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: str) -> str:
    """``value`` as a spreadsheet cell that shows it and never runs it (CSV injection): a
    cell that starts with = + - @, a tab or a carriage return, also after leading
    whitespace, gets a leading apostrophe, which spreadsheets show as text."""
    if value.startswith(FORMULA_START) or value.lstrip().startswith(FORMULA_START):
        return "'" + value
    return value
