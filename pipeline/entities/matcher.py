"""Which listed names a sentence names: ``Matcher.find``.

1. The sentence's words (``normalise.sentence_words``), each with its offsets in the
   original text, become word codes; the automaton finds every listed name core made of
   whole words (``compiled``), and with ``min_similarity`` the fuzzy pass adds near
   misses (``fuzzy``).
2. Each hit grows over the corporate suffixes after it (``Acme Corp Ltd``) and over a
   "The" before it when the listed name has one; "'s" after it is left out of the match.
3. **The longest match wins**: hits are taken longest first (characters of the original
   text; then higher similarity, then earlier), and one overlapping a taken one is dropped.
4. One span names every entity listed under that name (homonyms on two lists are both
   reported); when some of them were listed with exactly the suffixes the sentence has
   ("Acme Corp" vs "Acme"), only those.

``Match.start``/``end`` index the original sentence and ``match == sentence[start:end]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from docintel.pipeline.entities.compiled import CODE_WIDTH, UNKNOWN, CompiledLists
from docintel.pipeline.entities.normalise import (
    ARTICLE,
    SUFFIXES,
    Words,
    sentence_words,
    suffix_tail,
)

Hit = tuple[int, int, int, float]  # (first word, end word, key number, similarity)
ENTITY_CACHE = 100_000  # entity rows kept as Python dicts per matcher


@dataclass(frozen=True, slots=True)
class Match:
    """One listed entity named in a sentence."""

    entity_id: str
    name: str  # the entity's listed name
    list: str  # the list's name (its file's stem)
    type: str
    match: str  # the sentence's own characters: sentence[start:end]
    start: int
    end: int
    similarity: float  # 1.0 for an exact match (after normalisation)


@dataclass(frozen=True, slots=True)
class _Span:
    first: int  # word indexes, [first, end)
    end: int
    start_char: int
    end_char: int
    key: int
    similarity: float
    entries: np.ndarray  # entry indexes of the key that this span names


class Matcher:
    """Finds the entities of compiled lists in sentences; one per process (its fuzzy
    cache is not shared). ``min_similarity`` in (0, 1]: None (the default) is exact
    matching after normalisation; a value turns on fuzzy matching (``fuzzy``)."""

    def __init__(self, compiled: CompiledLists, min_similarity: float | None = None) -> None:
        if min_similarity is not None and not 0 < min_similarity <= 1:
            raise ValueError(f"min_similarity must be in (0, 1], not {min_similarity}")
        self.compiled = compiled
        self.min_similarity = min_similarity
        self._fuzzy = None
        self._entities: dict[int, dict] = {}  # entity rows read from the Arrow table
        if min_similarity is not None and min_similarity < 1:
            from docintel.pipeline.entities.fuzzy import FuzzyIndex

            self._fuzzy = FuzzyIndex(compiled, min_similarity)

    def find(self, sentence: str) -> list[Match]:
        words = sentence_words(sentence)
        codes = [self.compiled.codes.get(w, UNKNOWN) for w in words.words]
        hits = self._exact("".join(codes))
        if self._fuzzy is not None:
            hits += self._fuzzy.hits(words.words, codes)
        spans = [self._span(h, words) for h in hits]
        return [m for s in _longest(spans) for m in self._matches(s, sentence)]

    def _exact(self, text: str) -> list[Hit]:
        hits = []
        for last, key in self.compiled.automaton.iter(text):
            if (last + 1) % CODE_WIDTH == 0:
                end = (last + 1) // CODE_WIDTH
                hits.append((end - int(self.compiled.key_words[key]), end, key, 1.0))
        return hits

    def _span(self, hit: Hit, words: Words) -> _Span:
        """A hit grown over its suffixes and a listed "The"; the entries it names."""
        first, end, key, similarity = hit
        c = self.compiled
        core_end = end
        while end < len(words.words) and words.words[end] in SUFFIXES:
            end += 1
        entries = np.arange(c.offsets[key], c.offsets[key + 1])
        if len(entries) > 1:
            tail = suffix_tail(words.words[core_end:end])
            exact = [i for i in entries if c.tails[c.entry_tails[i]] == tail]
            entries = np.array(exact) if exact else entries
        if first > 0 and words.words[first - 1] == ARTICLE and c.entry_the[entries].any():
            first -= 1
        start_char, end_char = words.starts[first], words.ends[end - 1]
        return _Span(first, end, start_char, end_char, key, similarity, entries)

    def _matches(self, span: _Span, sentence: str) -> list[Match]:
        c = self.compiled
        rows = dict.fromkeys(int(r) for r in c.entry_rows[span.entries])
        text = sentence[span.start_char : span.end_char]
        out = []
        for row in rows:
            entity = self._entities.get(row)
            if entity is None:
                if len(self._entities) >= ENTITY_CACHE:
                    self._entities.clear()
                entity = self._entities[row] = c.entities.slice(row, 1).to_pylist()[0]
            out.append(
                Match(
                    entity_id=entity["entity_id"],
                    name=entity["name"],
                    list=c.lists[entity["list"]],
                    type=entity["type"],
                    match=text,
                    start=span.start_char,
                    end=span.end_char,
                    similarity=span.similarity,
                )
            )
        return out


def _longest(spans: list[_Span]) -> list[_Span]:
    """Longest first (characters), then the most similar, then the earliest; a span that
    overlaps one already taken is dropped. The result is in sentence order."""
    spans.sort(key=lambda s: (s.start_char - s.end_char, -s.similarity, s.start_char))
    taken: list[_Span] = []
    used = set()
    for s in spans:
        words = range(s.first, s.end)
        if used.isdisjoint(words):
            used.update(words)
            taken.append(s)
    return sorted(taken, key=lambda s: s.start_char)
