"""Keyword relevance for `docintel search`: one tokenizer, BM25, and relative score fusion.

**Tokenizer** (:func:`tokenize`), the one every path uses (the exact scan here, and the
Lance full-text index, which indexes the tokens this function writes, split on spaces):
the text NFKC-normalised and case-folded, split into runs of Unicode word characters
(letters, digits, underscore: ``\\w+``), less a small English stop list
(:data:`STOP_WORDS`). No stemming: no well-kept stemmer is installed (Lance's own Snowball
stemmer is not reachable from Python), so "layoffs" does not match "layoff"; the
embedding's half of a hybrid ranking covers such variants. Because the index is built on
these tokens with Lance's whitespace tokenizer (no lower-casing, stemming, stop words or
length limit of its own), both paths tokenize identically.

**BM25** (:class:`Bm25`), Lucene's and Lance's form: for each distinct query term t in a
sentence d, ``idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * |d| / avgdl))`` with
``idf(t) = ln(1 + (N - n_t + 0.5) / (n_t + 0.5))``, k1 = 1.2, b = 0.75; N, n_t and avgdl
over the whole sentences table (filters choose the hits, never the statistics, as in
Lance). A sentence with none of the query's terms scores 0 and is no keyword hit.

**Fusion** (:func:`fuse_relative`): relative score fusion, Weaviate's default fusion
since 1.24: each ranking's scores are min-max scaled to [0, 1] over its own best ``top``
(the number of hits asked for), a ranking that lacks a sentence gives it 0, and
the fused score is ``0.7 * dense + 0.3 * keyword`` (0.7: Haystack's and Weaviate's
default weight of the vector side, not tuned here). It replaced reciprocal rank fusion
(RRF, k = 60), which sees only ranks: on the analyst queries (BENCHMARKS.md) RRF let the
weak keyword matches deep in the keyword ranking, sentences sharing a word and not the
meaning, push relevant sentences out of the top 10 (stock MiniLM: recall@10 0.46 with
RRF, 0.53 with relative scores, 0.56 by the embedding alone). Scaling over the best
``top`` rather than a deeper pool makes the ``top``-th embedding hit score 0 on its side,
so that a strong keyword match the embedding misses (a name, a ticker) still enters the
hits; over 100 candidates it could not (at most 0.3 against the embedding's top 10).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from docintel.pipeline.schema import DOC_ID, SENT_INDEX

# the three rankings `docintel search --mode` offers; hybrid is the default
SEMANTIC, KEYWORD, HYBRID = "semantic", "keyword", "hybrid"
MODES = (HYBRID, SEMANTIC, KEYWORD)
K1, B = 1.2, 0.75
# relative score fusion's weight of the embedding's ranking: 0.7, Haystack's and Weaviate's
# default alpha (not tuned on this project's check set)
RELATIVE_ALPHA = 0.7
# each ranking fused keeps max(10 x top, 100) candidates, at most max(top, 1000): what a
# query holds in memory (rows, text included) while the table streams
POOL_FACTOR, POOL_MIN, POOL_MAX = 10, 100, 1000

# fmt: off
STOP_WORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have", "he",
    "her", "his", "i", "if", "in", "into", "is", "it", "its", "me", "my", "of", "on", "or",
    "our", "she", "so", "such", "than", "that", "the", "their", "them", "then", "there",
    "these", "they", "this", "to", "was", "we", "were", "which", "will", "with", "you", "your",
    "s", "t",
))
# fmt: on
_WORD = re.compile(r"\w+")


def tokenize(text: str | None) -> list[str]:
    """The terms of ``text`` (see the module docstring), in order, repeats kept."""
    if not text:
        return []
    folded = unicodedata.normalize("NFKC", text).casefold()
    return [w for w in _WORD.findall(folded) if w not in STOP_WORDS]


def query_terms(text: str) -> list[str]:
    """A query's distinct terms, in order (a repeated word counts once)."""
    return list(dict.fromkeys(tokenize(text)))


def pool_size(top: int) -> int:
    """Candidates each ranking keeps for fusion (see POOL_FACTOR)."""
    return max(top, min(max(top * POOL_FACTOR, POOL_MIN), POOL_MAX))


def needs_keyword(mode: str) -> bool:
    return mode in (KEYWORD, HYBRID)


def needs_dense(mode: str) -> bool:
    return mode in (SEMANTIC, HYBRID)


@dataclass
class Bm25:
    """BM25 of several queries at once: the statistics of their terms (pass 1, over every
    sentence: :meth:`gather`), then each sentence's score per query (pass 2: :meth:`score`).
    Memory: one counter per distinct query term."""

    queries: list[list[str]]  # each query's distinct terms
    terms: dict[str, int] = field(init=False)  # every query term -> its column
    df: np.ndarray = field(init=False)  # sentences holding each term
    n_docs: int = 0
    n_tokens: int = 0

    def __post_init__(self) -> None:
        self.terms = {t: i for i, t in enumerate(dict.fromkeys(t for q in self.queries for t in q))}
        self.df = np.zeros(len(self.terms), np.int64)

    def _counts(self, texts: Iterable[str | None]) -> tuple[np.ndarray, np.ndarray]:
        """(term counts [n, terms], lengths [n]) of ``texts``."""
        rows: list[tuple[int, int]] = []
        lengths = []
        for r, text in enumerate(texts):
            tokens = tokenize(text)
            lengths.append(len(tokens))
            rows += [(r, self.terms[w]) for w in tokens if w in self.terms]
        tf = np.zeros((len(lengths), len(self.terms)), np.float64)
        if rows:
            np.add.at(tf, tuple(np.array(rows).T), 1.0)
        return tf, np.array(lengths, np.float64)

    def gather(self, texts: Sequence[str | None]) -> None:
        """Pass 1: add ``texts`` to the statistics."""
        tf, lengths = self._counts(texts)
        self.df += (tf > 0).sum(axis=0)
        self.n_docs += len(lengths)
        self.n_tokens += int(lengths.sum())

    def idf(self) -> np.ndarray:
        n = self.df.astype(np.float64)
        return np.log1p((self.n_docs - n + 0.5) / (n + 0.5))

    def score(self, texts: Sequence[str | None]) -> np.ndarray:
        """Pass 2: BM25 [n, queries] of ``texts`` (0: none of a query's terms)."""
        tf, lengths = self._counts(texts)
        out = np.zeros((len(lengths), len(self.queries)), np.float64)
        if not self.terms or not len(lengths):
            return out
        avgdl = self.n_tokens / self.n_docs if self.n_docs and self.n_tokens else 1.0
        norm = K1 * (1 - B + B * lengths / avgdl)
        per_term = self.idf()[None, :] * tf * (K1 + 1) / (tf + norm[:, None])
        for j, q in enumerate(self.queries):
            if q:
                out[:, j] = per_term[:, [self.terms[t] for t in q]].sum(axis=1)
        return out


def combine(
    dense: list[dict[str, Any]], keyword: list[dict[str, Any]], top: int, mode: str
) -> list[dict[str, Any]]:
    """A query's hits in ``mode`` from its two rankings (each best first)."""
    if mode == SEMANTIC:
        return dense[:top]
    if mode == KEYWORD:
        return keyword[:top]
    return fuse_relative(dense[:top], keyword[:top], top)


def _key(hit: dict[str, Any]) -> tuple[str, int]:
    return hit[DOC_ID], hit[SENT_INDEX]


def fuse_relative(
    dense: list[dict[str, Any]],
    keyword: list[dict[str, Any]],
    top: int,
    alpha: float = RELATIVE_ALPHA,
) -> list[dict[str, Any]]:
    """The ``top`` hits by relative score fusion (Weaviate's default fusion since 1.24):
    each ranking's scores (``similarity``, ``bm25``) min-max scaled to [0, 1] over its own
    candidates, 0 where a ranking lacks the hit, then ``alpha * dense + (1 - alpha) *
    keyword``. Unlike RRF it keeps how far apart the scores are, so a weak keyword match
    deep in the keyword ranking adds little. Ties by the higher similarity, then doc_id and
    sent_index; a hit found by both rankings takes the keyword ranking's ``bm25``."""
    fused: dict[tuple[str, int], float] = {}
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for weight, ranking, score in ((alpha, dense, "similarity"), (1 - alpha, keyword, "bm25")):
        values = [float(h[score]) for h in ranking]
        low, span = (min(values), max(values) - min(values)) if values else (0.0, 0.0)
        for hit, value in zip(ranking, values, strict=True):
            key = _key(hit)
            scaled = (value - low) / span if span > 0 else 1.0
            fused[key] = fused.get(key, 0.0) + weight * scaled
            merged[key] = {**merged.get(key, {}), **hit}
    order = sorted(merged, key=lambda key: (-fused[key], -_similarity(merged[key]), key[0], key[1]))
    return [merged[key] for key in order[:top]]


def _similarity(hit: dict[str, Any]) -> float:
    sim = hit.get("similarity")
    return -math.inf if sim is None else float(sim)


def rank(hits: list[dict[str, Any]], score: str) -> list[dict[str, Any]]:
    """``hits`` best first by ``score``; ties by doc_id, then sent_index."""
    return sorted(hits, key=lambda h: (-float(h[score]), h[DOC_ID], h[SENT_INDEX]))
