"""Search without Ray: the streamed exact scan, filters, the source's checks and key, and
the Lance index's recall on a synthetic output with the real sentences schema."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench.search import fake_queries, write_fake_output
from docintel.pipeline.errors import InputError, UsageError
from docintel.pipeline.search import index as ann_index
from docintel.pipeline.search.index import IndexParams, build_index
from docintel.pipeline.search.query import MAX_TOP, check_queries, exact_search, read_queries
from docintel.pipeline.search.source import Filters, SentencesSource

DIM = 384
N = 8_000  # sentences of the synthetic output
SEED = 3  # the data's mixture; queries are fresh draws of the same one


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8,000 synthetic sentences in a committed output (parts of 65,536 rows: one part;
    the scan is still streamed in many record batches)."""
    return write_fake_output(tmp_path_factory.mktemp("fake") / "out", N, seed=SEED)


def _all(out: Path) -> tuple[np.ndarray, list[tuple[str, int]], dict[str, np.ndarray]]:
    t = pq.read_table(out / "sentences")
    e = np.stack(t["embedding"].to_numpy(zero_copy_only=False)).astype(np.float64)
    keys = list(zip(t["doc_id"].to_pylist(), t["sent_index"].to_pylist(), strict=True))
    cols = {c: t[c].to_numpy(zero_copy_only=False) for c in ("label", "score", "doc_id")}
    return e, keys, cols


def _numpy_top(e: np.ndarray, q: np.ndarray, k: int, keep: np.ndarray | None = None) -> list:
    sims = (e @ q) / (np.linalg.norm(e, axis=1) * np.linalg.norm(q))
    if keep is not None:
        sims = np.where(keep, sims, -np.inf)
    order = np.argsort(-sims, kind="stable")[:k]
    return [(int(i), float(sims[i])) for i in order if np.isfinite(sims[i])]


def test_exact_scan_is_numpy_top_k(fake: Path) -> None:
    e, keys, cols = _all(fake)
    q = fake_queries(4, N, seed=SEED).astype(np.float64)
    source = SentencesSource.open(str(fake))
    got = exact_search(source, q, 25, Filters(), batch_rows=500)  # 16 batches, 4 queries
    for qi, hits in enumerate(got):
        ref = _numpy_top(e, q[qi], 25)
        assert [(h["doc_id"], h["sent_index"]) for h in hits] == [keys[i] for i, _ in ref]
        np.testing.assert_allclose([h["similarity"] for h in hits], [s for _, s in ref], atol=1e-5)
    keep = (cols["label"] == "Bearish") & (cols["score"] >= 0.8)
    keep &= np.char.startswith(cols["doc_id"].astype(str), "doc000010")
    (hits,) = exact_search(source, q[:1], 10, Filters("Bearish", 0.8, "doc000010"), batch_rows=777)
    assert [(h["doc_id"], h["sent_index"]) for h in hits] == [
        keys[i] for i, _ in _numpy_top(e, q[0], 10, keep)
    ]
    ids = frozenset({"doc00000007", "doc00001400"})
    (hits,) = exact_search(source, q[:1], 20, Filters(doc_ids=ids))
    assert len(hits) == 10 and {h["doc_id"] for h in hits} == ids  # 5 sentences each


def _keys(hits: list[dict]) -> set[tuple[str, int]]:
    return {(h["doc_id"], h["sent_index"]) for h in hits}


def test_index_recall_at_10(fake: Path, tmp_path: Path) -> None:
    """recall@10 of the index against the exact scan, on 8,000 synthetic sentences
    (partitions auto: 8,000 / 256 = 31) with the default probes and refine factor."""
    out = shutil.copytree(fake, tmp_path / "out")
    record = build_index(str(out))
    assert record["params"]["partitions"] == 31
    source = SentencesSource.open(str(out))
    index, note = ann_index.find(source)
    assert index is not None, note
    q = fake_queries(40, N, seed=SEED)
    exact = exact_search(source, q, 10, Filters())
    approx = ann_index.query(index, q, 10, Filters())
    recall = np.mean([len(_keys(a) & _keys(x)) / 10 for a, x in zip(approx, exact, strict=True)])
    assert recall >= 0.95, recall
    # no refinement and one probe: a real approximation, so the test measures something
    rough = ann_index.query(index, q, 10, Filters(), IndexParams(31, 48, 1, 0))
    assert rough != approx
    # filters through the index, a quote in a label is data, not SQL
    (hits,) = ann_index.query(index, q[:1], 10, Filters(label="Bearish", min_score=0.5))
    assert hits and all(h["label"] == "Bearish" and h["score"] >= 0.5 for h in hits)
    (none,) = ann_index.query(index, q[:1], 10, Filters(label="x' OR '1'='1"))
    assert none == []


def test_half_built_index_is_never_used(fake: Path, tmp_path: Path) -> None:
    """A build that died before its pointer was written leaves a folder nobody reads;
    the next build removes it."""
    out = shutil.copytree(fake, tmp_path / "out")
    (out / "_index" / "00000000deadbeef.lance").mkdir(parents=True)  # as build_index names
    source = SentencesSource.open(str(out))
    index, note = ann_index.find(source)
    assert index is None and "no index" in note
    record = build_index(str(out), params=IndexParams(partitions=4))
    assert record["params"]["partitions"] == 4 and record["params"]["nprobes"] == 4
    assert sorted(p.name for p in (out / "_index").iterdir()) == sorted(
        ["current.json", record["path"]]
    )
    # a pointer of another format is ignored too
    pointer = out / "_index" / "current.json"
    pointer.write_text(json.dumps({**record, "format": "faiss/9"}))
    assert ann_index.find(source)[0] is None


def test_source_checks_and_key(fake: Path, tmp_path: Path) -> None:
    out = shutil.copytree(fake, tmp_path / "out")
    source = SentencesSource.open(str(out))
    assert source.require_embeddings() == DIM
    key = source.key()
    assert SentencesSource.open(str(out)).key() == key  # stable while nothing changes
    part = next((out / "sentences").glob("part-*.parquet"))
    t = pq.read_table(part)
    pq.write_table(t.slice(1), part)
    assert SentencesSource.open(str(out)).key() != key
    (out / "_manifest.json").unlink()
    with pytest.raises(InputError, match="no committed run"):
        SentencesSource.open(str(out))
    with pytest.raises(InputError, match="no committed run"):
        SentencesSource.open(str(tmp_path / "missing"))


def test_query_bounds(tmp_path: Path) -> None:
    assert check_queries(["a", "b"], 10) == ["a", "b"]
    for queries, top in (([], 10), ([""], 10), (["  \t"], 10), (["a"], 0), (["a"], MAX_TOP + 1)):
        with pytest.raises(UsageError):
            check_queries(queries, top)
    f = tmp_path / "q.txt"
    f.write_text("one\n\n  two  \n")
    assert read_queries(f) == ["one", "two"]
    f.write_text("\n \n")
    with pytest.raises(InputError, match="no query"):
        read_queries(f)
