"""Keyword and hybrid search without Ray (issue 33, item 6): the tokenizer, BM25 and
reciprocal rank fusion against hand-computed cases, the exact scan's two passes and
bounded top-N against a whole-table reference, and the Lance full-text index against the
exact scan, on a synthetic output whose texts are rewritten with a small vocabulary."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.search import fake_queries, write_fake_output
from docintel.pipeline.errors import UsageError
from docintel.pipeline.search import index as ann_index
from docintel.pipeline.search.index import IndexParams, build_index
from docintel.pipeline.search.keyword import (
    RELATIVE_ALPHA,
    Bm25,
    fuse_relative,
    pool_size,
    query_terms,
    tokenize,
)
from docintel.pipeline.search.query import TopK, check_mode, exact_search
from docintel.pipeline.search.source import Filters, SentencesSource

N = 3_000
VOCAB = [f"w{i}" for i in range(400)]


def test_tokenize() -> None:
    assert tokenize("The company's CUTS, jobs!") == ["company", "cuts", "jobs"]
    assert tokenize("\uff2a\uff4f\uff42\uff53 cut at Stra\u00dfe-3") == [
        "jobs",
        "cut",
        "strasse",
        "3",
    ]  # NFKC, fold
    assert tokenize("jobs, jobs") == ["jobs", "jobs"] and query_terms("jobs, Jobs") == ["jobs"]
    assert tokenize(None) == [] and tokenize("") == [] and query_terms("of the, a") == []
    assert tokenize("not no") == ["not", "no"]  # negation is kept: it matters for risk


def test_bm25_hand_computed() -> None:
    """Five sentences (stop words dropped: 3, 3, 4, 2, 3 terms; avgdl 3), query "cuts
    jobs": both terms in 2 of 5, idf = ln(1 + 3.5 / 2.5) = ln 2.4."""
    texts = [
        "The company cuts jobs",
        "Cuts prices again",
        "Jobs, jobs: report strong",
        "profit falls",
        "nothing here today",
    ]
    bm = Bm25([query_terms("cuts jobs"), query_terms("profit"), []])
    bm.gather(texts[:2])  # pass 1 in two batches: the statistics add up
    bm.gather(texts[2:])
    assert (bm.n_docs, bm.n_tokens) == (5, 15)
    idf = math.log(2.4)
    # d0: tf 1 each, |d| = avgdl: each term idf * 2.2 / (1 + 1.2) = idf
    # d2: "jobs" tf 2, |d| = 4: norm 1.2 * (0.25 + 0.75 * 4 / 3) = 1.5 -> idf * 4.4 / 3.5
    want = [2 * idf, idf, idf * 4.4 / 3.5, 0.0, 0.0]
    scores = bm.score(texts)
    np.testing.assert_allclose(scores[:, 0], want, rtol=1e-12)
    # "profit": in 1 of 5, |d| = 2: idf ln(1 + 4.5 / 1.5), norm 1.2 * (0.25 + 0.5) = 0.9
    np.testing.assert_allclose(scores[3, 1], math.log(4.0) * 2.2 / 1.9, rtol=1e-12)
    assert not scores[:, 2].any()  # a query without terms scores nothing


def _hit(doc: str, sim: float, bm25: float | None = None) -> dict:
    return {"doc_id": doc, "sent_index": 0, "similarity": sim, "bm25": bm25}


def test_relative_score_fusion_hand_computed() -> None:
    """dense a .9, b .5, c .4 -> scaled 1, .2, 0; keyword c 7.5, d 2.0 -> 1, 0. Fused with
    alpha .7: a .7, b .14, c .3, d 0 (d only in the keyword ranking, at its bottom)."""
    dense = [_hit("a", 0.9), _hit("b", 0.5), _hit("c", 0.4)]
    keyword = [_hit("c", 0.4, 7.5), _hit("d", 0.7, 2.0)]
    got = fuse_relative(dense, keyword, top=4)
    assert RELATIVE_ALPHA == 0.7
    assert [h["doc_id"] for h in got] == ["a", "c", "b", "d"]
    assert got[1]["bm25"] == 7.5 and got[2]["bm25"] is None  # the keyword ranking's score
    # a keyword match far stronger than the rest outweighs a middling embedding match
    keyword = [_hit("c", 0.4, 30.0), _hit("d", 0.7, 2.0)]
    assert [h["doc_id"] for h in fuse_relative(dense, keyword, top=2)] == ["a", "c"]
    assert [h["doc_id"] for h in fuse_relative(dense, keyword, 2, alpha=0.2)] == ["c", "a"]
    # one ranking empty: the other's order; one candidate scales to 1
    assert [h["doc_id"] for h in fuse_relative([], keyword, top=5)] == ["c", "d"]
    assert [h["doc_id"] for h in fuse_relative([_hit("b", 0.5)], [], top=5)] == ["b"]
    assert [pool_size(k) for k in (1, 10, 50, 200, 1000)] == [100, 100, 500, 1000, 1000]


def test_mode_refusals() -> None:
    assert check_mode("hybrid", ["the"]) == "hybrid"  # the embedding still ranks it
    with pytest.raises(UsageError, match="--mode 'fuzzy'"):
        check_mode("fuzzy", ["x"])
    with pytest.raises(UsageError, match="query 2 has no word"):
        check_mode("keyword", ["jobs", "of the"])


def test_top_k_is_bounded_and_exact() -> None:
    """The running top-N holds at most N rows, the best of everything offered; a
    non-finite score (no keyword match) never enters."""
    rng = np.random.default_rng(0)
    t, seen = TopK(7), []
    for b in range(20):
        scores = rng.random(50)
        scores[::3] = -np.inf
        ids = pa.array([f"{b:02d}-{i:02d}" for i in range(50)])
        t.offer(scores, pa.record_batch([ids, pa.array(np.zeros(50, np.int32))], ["doc_id", "s"]))
        assert t.rows is not None and t.rows.num_rows <= 7
        seen += [(s, i) for s, i in zip(scores, ids.to_pylist(), strict=True) if np.isfinite(s)]
    assert sorted(t.rows["doc_id"].to_pylist()) == sorted(i for _, i in sorted(seen)[-7:])


@pytest.fixture(scope="module")
def worded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The synthetic output with each sentence's text rewritten as 3 to 15 words of a
    400-word vocabulary (Zipf-like: a few common words, many rare) and a stop word."""
    out = write_fake_output(tmp_path_factory.mktemp("kw") / "out", N, seed=5)
    rng = np.random.default_rng(5)
    weights = 1 / np.arange(1, len(VOCAB) + 1)
    part = next((out / "sentences").glob("part-*.parquet"))
    t = pq.read_table(part)
    texts = [
        " the ".join(rng.choice(VOCAB, rng.integers(3, 16), p=weights / weights.sum()))
        for _ in range(t.num_rows)
    ]
    i = t.schema.get_field_index("text")
    pq.write_table(t.set_column(i, t.schema.field(i), pa.array(texts, pa.string())), part)
    return out, texts


def _reference_bm25(texts: list[str], query: str) -> np.ndarray:
    """Whole-table BM25, written out term by term (the textbook loop)."""
    docs = [Counter(tokenize(t)) for t in texts]
    lengths = [sum(d.values()) for d in docs]
    avgdl = sum(lengths) / len(docs)
    out = np.zeros(len(docs))
    for term in query_terms(query):
        n = sum(term in d for d in docs)
        idf = math.log(1 + (len(docs) - n + 0.5) / (n + 0.5))
        for i, d in enumerate(docs):
            tf = d[term]
            out[i] += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * lengths[i] / avgdl))
    return out


# rare words (a few dozen sentences each): the keyword pools hold every match, so the
# exact scan and the index choose among equal scores alike (the nearer sentence first)
QUERIES = ["w310 w355", "w280 w399 w333", "the w345"]


def test_exact_keyword_two_passes(worded: tuple[Path, list[str]]) -> None:
    """Streamed in 97-row batches, each keyword hit's BM25 is the whole-table reference's,
    and the hits are the reference's top 10 (equal scores: any of them); a filter chooses
    hits, never the statistics."""
    out, texts = worded
    source = SentencesSource.open(str(out))
    queries = ["w17 w250", "w3 w399 w120", "the w45"]  # common words: many equal scores
    vectors = fake_queries(len(queries), N, seed=5)
    got = exact_search(source, vectors, 10, Filters(), 97, texts=queries, mode="keyword")
    docs = pq.read_table(out / "sentences").to_pydict()
    row = {
        (d, s): i for i, (d, s) in enumerate(zip(docs["doc_id"], docs["sent_index"], strict=True))
    }
    for q, hits in zip(queries, got, strict=True):
        ref = _reference_bm25(texts, q)
        assert len(hits) == 10
        for h in hits:
            assert h["bm25"] == pytest.approx(ref[row[h["doc_id"], h["sent_index"]]], rel=1e-9)
        np.testing.assert_allclose([h["bm25"] for h in hits], np.sort(ref)[::-1][:10])
    (kept,) = exact_search(
        source, vectors[:1], 10, Filters(doc_prefix="doc000001"), 97, texts=queries[:1],
        mode="keyword",
    )  # fmt: skip
    ref = _reference_bm25(texts, queries[0])
    assert kept and all(h["doc_id"].startswith("doc000001") for h in kept)
    assert all(h["bm25"] == pytest.approx(ref[row[h["doc_id"], h["sent_index"]]]) for h in kept)


def test_hybrid_differs_and_lance_agrees(worded: tuple[Path, list[str]], tmp_path: Path) -> None:
    """Hybrid is the fusion of the two exact rankings; `docintel index` builds both
    indexes, and the index answers each mode as the exact scan does; an older build
    (IVF-PQ only) still serves semantic search, and keyword search scans exactly."""
    out = shutil.copytree(worded[0], tmp_path / "out")
    source = SentencesSource.open(str(out))
    vectors = fake_queries(len(QUERIES), N, seed=5)
    exact = {
        m: exact_search(source, vectors, 10, Filters(), texts=QUERIES, mode=m)
        for m in ("semantic", "keyword", "hybrid")
    }
    pool = {
        m: exact_search(source, vectors, 100, Filters(), texts=QUERIES, mode=m)
        for m in ("semantic", "keyword")
    }
    differs = [
        _keys(exact["hybrid"][j]) != _keys(exact["semantic"][j]) for j in range(len(QUERIES))
    ]
    assert any(differs), "the keyword ranking changed no query's hits"
    for j in range(len(QUERIES)):
        fused = fuse_relative(pool["semantic"][j][:10], pool["keyword"][j][:10], 10)
        assert exact["hybrid"][j] == fused
        assert all(h["bm25"] is None for h in exact["semantic"][j])
    build_index(str(out), params=IndexParams(partitions=1))  # every vector refined: exact
    index, note = ann_index.find(source, "hybrid")
    assert index is not None and "full-text (BM25)" in note, note
    for mode, want in exact.items():
        got = ann_index.query(index, vectors, 10, Filters(), texts=QUERIES, mode=mode)
        for g, w in zip(got, want, strict=True):
            assert _keys(g) == _keys(w), mode
            for a, b in zip(g, w, strict=True):
                assert (a["bm25"] is None) == (b["bm25"] is None)
                assert a["bm25"] is None or a["bm25"] == pytest.approx(b["bm25"], rel=1e-5)
    pointer = out / "_index" / "current.json"
    pointer.write_text(json.dumps({**json.loads(pointer.read_text()), "format": "lance-ivf-pq/1"}))
    assert ann_index.find(source, "semantic")[0] is not None
    index, note = ann_index.find(source, "keyword")
    assert index is None and "no keyword index" in note


def _keys(hits: list[dict]) -> list[tuple[str, int]]:
    return [(h["doc_id"], h["sent_index"]) for h in hits]
