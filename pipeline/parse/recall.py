"""Word recall of extracted text against its source: how much of the source survives."""

from __future__ import annotations

import re
from collections import Counter

_WORD = re.compile(r"\w+")


def words(text: str) -> Counter[str]:
    """The words of a text (runs of letters and digits, case-folded), with counts."""
    return Counter(w.casefold() for w in _WORD.findall(text))


def word_recall(source: str, extracted: str) -> float:
    """The share of the source's words (with multiplicity) found in the extracted text:
    1.0 when every word survived, however the text was re-flowed; 1.0 for an empty source."""
    want = words(source)
    total = sum(want.values())
    if total == 0:
        return 1.0
    got = words(extracted)
    return sum(min(n, got[w]) for w, n in want.items()) / total
