"""The redactor: every detected value of a text becomes a ``<TYPE>`` placeholder.

``Redactor(types, patterns).redact(text) -> (redacted, spans)``: ``spans`` lists
``{"type", "start", "end"}`` of the placeholders in ``redacted`` (never the values nor
their original positions' text). :meth:`Redactor.redact_mapped` also returns an
:class:`OffsetMap` from positions in ``redacted`` back to positions in ``text``, so that a
stage that sentencizes the redacted document keeps ``start_char``/``end_char`` indexing the
original one.

Overlaps: detections of all types (built-in and user patterns) are collected on the original
text, then kept greedily by length, longest first; between two of the same length the type
of higher priority wins (user patterns in the order given, then EMAIL_ADDRESS, IBAN_CODE,
CREDIT_CARD, US_SSN, IP_ADDRESS, PHONE_NUMBER), then the one that starts first. A kept
detection removes every detection that overlaps it. The result depends on the text and the
setting only (deterministic); a redactor pickles as its setting and is rebuilt on load.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from docintel.pipeline.privacy.detectors import DETECTORS
from docintel.pipeline.privacy.patterns import check_types, compile_patterns

Found = tuple[str, int, int]  # (type, start, end) in the original text


class OffsetMap:
    """Positions in a redacted text -> positions in its original.

    Built from the placeholders as ``(red_start, red_end, orig_start, orig_end)``, in order.
    Outside a placeholder a position moves by the length change of the placeholders before
    it; a position strictly inside a placeholder maps to the start of its value, or to the
    end with ``end=True`` (so a range that cuts a placeholder widens to the whole value).
    """

    __slots__ = ("_pairs", "_starts")

    def __init__(self, pairs: Iterable[tuple[int, int, int, int]] = ()) -> None:
        self._pairs = tuple(pairs)
        self._starts = [p[0] for p in self._pairs]

    def __reduce__(self) -> tuple[Any, ...]:
        return (OffsetMap, (self._pairs,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OffsetMap) and self._pairs == other._pairs

    def __hash__(self) -> int:
        return hash(self._pairs)

    def __repr__(self) -> str:
        return f"OffsetMap({list(self._pairs)!r})"

    @property
    def pairs(self) -> tuple[tuple[int, int, int, int], ...]:
        """``(red_start, red_end, orig_start, orig_end)`` of each placeholder."""
        return self._pairs

    def to_original(self, pos: int, *, end: bool = False) -> int:
        """The original position of redacted position ``pos`` (``end``: ``pos`` ends a range)."""
        i = bisect.bisect_right(self._starts, pos) - 1
        if i < 0:
            return pos
        red_start, red_end, orig_start, orig_end = self._pairs[i]
        if pos >= red_end:
            return orig_end + (pos - red_end)
        if pos == red_start:
            return orig_start
        return orig_end if end else orig_start


class Redaction(NamedTuple):
    """One redacted text: the text, its placeholders' spans and the map back."""

    text: str
    spans: list[dict[str, Any]]
    offsets: OffsetMap


def resolve(found: list[Found], priority: Mapping[str, int]) -> list[Found]:
    """The detections kept (longest, then type priority, then first start), by start."""
    if len(found) < 2:
        return found
    order = sorted(found, key=lambda f: (f[1] - f[2], priority[f[0]], f[1]))
    kept: list[Found] = []
    for cand in order:
        if all(cand[2] <= k[1] or cand[1] >= k[2] for k in kept):
            kept.append(cand)
    kept.sort(key=lambda f: f[1])
    return kept


def spans_within(spans: list[dict[str, Any]], start: int, end: int) -> list[dict[str, Any]]:
    """The ``spans`` inside ``[start, end)`` of a redacted text, made relative to ``start``
    (a document's spans -> one redacted sentence's)."""
    return [
        {"type": s["type"], "start": s["start"] - start, "end": s["end"] - start}
        for s in spans
        if s["start"] >= start and s["end"] <= end
    ]


class Redactor:
    """Detects the enabled built-in ``types`` (``None``: all) and the user's ``patterns``
    (``{NAME: regex}``) and replaces each value by ``<TYPE>``. Refuses a bad setting at
    construction with ``ConfigError`` (see :mod:`docintel.pipeline.privacy.patterns`)."""

    def __init__(
        self, types: Iterable[str] | None = None, patterns: Mapping[str, str] | None = None
    ) -> None:
        self.types: tuple[str, ...] = check_types(types)
        self._compiled: dict[str, re.Pattern[str]] = compile_patterns(patterns)
        self.patterns: dict[str, str] = {n: p.pattern for n, p in self._compiled.items()}
        self._detectors = [(t, DETECTORS[t]) for t in self.types]
        order = [*self._compiled, *DETECTORS]
        self._priority = {name: i for i, name in enumerate(order)}

    def __reduce__(self) -> tuple[Any, ...]:
        return (Redactor, (list(self.types), dict(self.patterns)))

    def __repr__(self) -> str:
        return f"Redactor(types={list(self.types)!r}, patterns={self.patterns!r})"

    @property
    def setting(self) -> dict[str, Any]:
        """What a manifest or a plan key records: the types and the patterns (no values)."""
        return {"types": list(self.types), "patterns": dict(self.patterns)}

    def find(self, text: str) -> list[Found]:
        """The values to replace in ``text``: ``(type, start, end)``, by start, no overlaps."""
        found: list[Found] = []
        for name, regex in self._compiled.items():
            found.extend(
                (name, m.start(), m.end()) for m in regex.finditer(text) if m.end() > m.start()
            )
        for name, detect in self._detectors:
            found.extend((name, s, e) for s, e in detect(text))
        return resolve(found, self._priority)

    def redact_mapped(self, text: str) -> Redaction:
        """``text`` with each value replaced, the placeholders' spans and the offset map."""
        found = self.find(text)
        if not found:
            return Redaction(text, [], OffsetMap())
        parts: list[str] = []
        spans: list[dict[str, Any]] = []
        pairs: list[tuple[int, int, int, int]] = []
        pos = out = 0
        for name, start, end in found:
            parts.append(text[pos:start])
            out += start - pos
            placeholder = f"<{name}>"
            parts.append(placeholder)
            spans.append({"type": name, "start": out, "end": out + len(placeholder)})
            pairs.append((out, out + len(placeholder), start, end))
            out += len(placeholder)
            pos = end
        parts.append(text[pos:])
        return Redaction("".join(parts), spans, OffsetMap(pairs))

    def redact(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """``text`` with each value replaced by ``<TYPE>``, and the placeholders' spans."""
        redacted, spans, _ = self.redact_mapped(text)
        return redacted, spans
