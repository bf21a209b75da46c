"""Search quality on analyst queries: recall@10 and MRR of `docintel search` per ranking
mode (semantic, keyword, hybrid) and encoder, through the real code paths (issue 33).

The check set (data/analyst_queries/SOURCE.md): 30 short queries as analysts type them,
and 660 written news sentences: 6 relevant per query (at most 2 of them share the query's
words), 6 hard negatives per query (its words without its meaning) and 300 fillers. For
each encoder:

1. the corpus is run through `docintel run` (a subprocess, the real pipeline: one
   document per sentence, doc_id = sent_id) into a fresh output;
2. every query goes through `docintel search`'s own function (pipeline/search/query.py:
   the query embedded by the run's encoder) in each mode, on the exact scan and, after
   `docintel index` (IVF-PQ + full-text), on the index;
3. a query's recall@10 is the share of its relevant sentences among the documents of its
   top 10 hits; MRR is 1 / the rank of its first relevant hit (0 if none in the top 10).
   Both are averaged over the queries.

Encoders (``--encoders``, comma-separated): ``default`` (the shipped encoder and head),
``stock`` (the bundled stock MiniLM pair), a folder `docintel train` wrote (its
fine-tuned encoder), or a TOML config (``[embed] model_path`` and the head it names):

    .venv/bin/python bench/search_quality.py
    .venv/bin/python bench/search_quality.py --encoders default,stock,/path/new.toml
    .venv/bin/python bench/search_quality.py --no-index --top 20
    .venv/bin/python bench/search_quality.py --fusion --cost 100000   # + fusions, scan cost
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import docintel_executable, machine_lines  # noqa: E402
from docintel.jobs.cli_models import model_overrides  # noqa: E402
from docintel.pipeline.config import Config, load_config  # noqa: E402
from docintel.pipeline.search.keyword import MODES  # noqa: E402

DATA = REPO / "data" / "analyst_queries"


@dataclass(frozen=True)
class Query:
    query_id: str
    text: str
    relevant: frozenset[str]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def load_set(folder: Path) -> tuple[list[Query], dict[str, str]]:
    """The queries and the corpus (sent_id -> text); SystemExit naming a bad file."""
    corpus = {r["sent_id"]: r["text"] for r in _rows(folder / "corpus.csv")}
    queries = [
        Query(r["query_id"], r["query"], frozenset(r["relevant"].split()))
        for r in _rows(folder / "queries.csv")
    ]
    for q in queries:
        missing = q.relevant - corpus.keys()
        if missing or not q.relevant:
            sys.exit(f"{folder}/queries.csv: {q.query_id} names no or unknown sentences")
    return queries, corpus


def encoder_args(spec: str) -> tuple[list[str], Config]:
    """`docintel run`'s options for an encoder spec, and the config search uses for it."""
    if spec.endswith(".toml"):
        return ["--config", spec], load_config(Path(spec))
    return ["--model", spec], load_config(None, model_overrides(spec))


def run_corpus(corpus: dict[str, str], spec: str, work: Path) -> tuple[Path, Config, float]:
    """`docintel run` over the corpus, one document per sentence (seconds it took)."""
    src = work / "corpus.parquet"
    if not src.exists():
        pq.write_table(pa.table({"doc_id": list(corpus), "text": list(corpus.values())}), src)
    out = work / f"out-{abs(hash(spec)):x}"
    args, cfg = encoder_args(spec)
    cmd = [docintel_executable(), "run", str(src), str(out), "--no-progress", *args]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"docintel run for encoder {spec} failed:\n{done.stderr[-3000:]}")
    return out, cfg, time.perf_counter() - t0


def score(hits: list[list[dict]], queries: list[Query], k: int) -> tuple[float, float]:
    """Mean recall@k and MRR@k (documents of the top k hits, in order)."""
    recall = mrr = 0.0
    for q, found in zip(queries, hits, strict=True):
        docs = list(dict.fromkeys(h["doc_id"] for h in found[:k]))
        recall += len(q.relevant.intersection(docs)) / len(q.relevant)
        first = next((i for i, d in enumerate(docs, 1) if d in q.relevant), None)
        mrr += 1 / first if first else 0.0
    return recall / len(queries), mrr / len(queries)


def measure(
    out: Path, cfg: Config, queries: list[Query], k: int, index: bool
) -> list[tuple[str, str, float, float, float]]:
    """(path, mode, recall@k, MRR, seconds per query) for each path and mode."""
    from docintel.pipeline.search.index import build_index
    from docintel.pipeline.search.query import QueryEncoder, search

    encoder = QueryEncoder(cfg.embed)
    texts = [q.text for q in queries]
    rows = []
    paths = ["exact", "index"] if index else ["exact"]
    for path in paths:
        if path == "index":
            build_index(str(out), cfg=cfg)
        for mode in MODES:
            t0 = time.perf_counter()
            exact = path == "exact"
            res = search(str(out), texts, k, cfg=cfg, exact=exact, encoder=encoder, mode=mode)
            seconds = (time.perf_counter() - t0) / len(texts)
            assert res.used_index == (path == "index"), res.note
            rows.append((path, mode, *score(res.hits, queries, k), seconds))
    encoder.close()
    return rows


# fusion variants (--fusion): (RRF k, the keyword ranking's weight, candidates per ranking);
# the first is what `docintel search` does for --top 10
VARIANTS = ((60, 1.0, 100), (60, 1.0, 20), (60, 1.0, 10), (10, 1.0, 100), (60, 0.5, 100),
            (60, 0.5, 10))  # fmt: skip


# relative score fusion (keyword.fuse_relative): the embedding's weight alpha; 0.7 is
# Weaviate's and Haystack's default
# (alpha, candidates per ranking); the first is what `docintel search` does for --top 10
RELATIVE_VARIANTS = ((0.7, 10), (0.7, 100), (0.5, 10), (0.5, 100))


def _weighted_rrf(dense: list[dict], keyword: list[dict], k: int, w: float, top: int) -> list:
    score: dict[tuple[str, int], float] = {}
    hits: dict[tuple[str, int], dict] = {}
    for weight, ranking in ((1.0, dense), (w, keyword)):
        for rank, h in enumerate(ranking, 1):
            key = (h["doc_id"], h["sent_index"])
            score[key] = score.get(key, 0.0) + weight / (k + rank)
            hits[key] = h
    order = sorted(score, key=lambda key: (-score[key], -hits[key]["similarity"], key))
    return [hits[key] for key in order[:top]]


def fusion_variants(
    out: Path, cfg: Config, queries: list[Query], k: int
) -> list[tuple[str, float, float]]:
    """recall@k and MRR of other fusions of the exact scan's two rankings (VARIANTS)."""
    from docintel.pipeline.search.keyword import fuse_relative
    from docintel.pipeline.search.query import QueryEncoder, search

    encoder = QueryEncoder(cfg.embed)
    texts = [q.text for q in queries]
    lists = {
        m: search(str(out), texts, 100, cfg=cfg, exact=True, encoder=encoder, mode=m).hits
        for m in ("semantic", "keyword")
    }
    encoder.close()
    rows = []
    pairs = list(zip(lists["semantic"], lists["keyword"], strict=True))
    for rrf_k, w, pool in VARIANTS:
        fused = [_weighted_rrf(d[:pool], kw[:pool], rrf_k, w, k) for d, kw in pairs]
        rows.append((f"RRF k={rrf_k}, keyword weight {w}, pool {pool}", *score(fused, queries, k)))
    for alpha, pool in RELATIVE_VARIANTS:
        fused = [fuse_relative(d[:pool], kw[:pool], k, alpha) for d, kw in pairs]
        rows.append((f"relative score, alpha {alpha}, pool {pool}", *score(fused, queries, k)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoders", default="default,stock", help="comma-separated specs")
    ap.add_argument("--data", type=Path, default=DATA, help="queries.csv and corpus.csv")
    ap.add_argument("--top", type=int, default=10, help="k of recall@k and MRR@k")
    ap.add_argument("--no-index", action="store_true", help="the exact scan only")
    ap.add_argument("--cost", type=int, default=0, help="also time the exact scan per mode "
                    "on this many synthetic sentences (0: no)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of --cost")
    ap.add_argument("--fusion", action="store_true", help="also other fusions' recall")
    args = ap.parse_args()
    queries, corpus = load_set(args.data)
    print("\n".join(machine_lines()))
    print(f"{len(queries)} queries, {len(corpus)} sentences ({args.data})\n")
    print(f"| encoder | path | mode | recall@{args.top} | MRR@{args.top} | ms / query |")
    print("|---|---|---|---:|---:|---:|")
    variants: list[tuple[str, str, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="search-quality-") as tmp:
        for spec in args.encoders.split(","):
            out, cfg, took = run_corpus(corpus, spec, Path(tmp))
            for row in measure(out, cfg, queries, args.top, not args.no_index):
                path, mode, recall, mrr, s = row
                print(f"| {spec} | {path} | {mode} | {recall:.3f} | {mrr:.3f} | {s * 1000:.0f} |")
            print(f"<!-- {spec}: docintel run of the corpus {took:.0f} s -->", flush=True)
            if args.fusion:
                variants += [(spec, *row) for row in fusion_variants(out, cfg, queries, args.top)]
        if variants:
            print(f"\n| encoder | fusion (exact scan) | recall@{args.top} | MRR@{args.top} |")
            print("|---|---|---:|---:|")
            for spec, name, recall, mrr in variants:
                print(f"| {spec} | {name} | {recall:.3f} | {mrr:.3f} |")
        if args.cost:
            scan_cost(args.cost, args.rounds, Path(tmp))


def scan_cost(n: int, rounds: int, work: Path) -> None:
    """The exact scan's time per mode for one query on ``n`` synthetic sentences
    (bench/search.py's output), rounds alternating the modes; medians and the ratio to
    semantic."""
    import statistics

    from bench.search import fake_queries, write_fake_output
    from docintel.pipeline.search.query import exact_search
    from docintel.pipeline.search.source import Filters, SentencesSource

    source = SentencesSource.open(str(write_fake_output(work / "cost", n, seed=7)))
    vector, text = fake_queries(1, n, seed=7), ["synthetic topic 42"]
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(rounds):
        for mode in MODES[r % 3 :] + MODES[: r % 3]:
            t0 = time.perf_counter()
            exact_search(source, vector, 10, Filters(), texts=text, mode=mode)
            times[mode].append(time.perf_counter() - t0)
    base = statistics.median(times["semantic"])
    print(f"\n| exact scan, {n:,} sentences, 1 query | median s | x semantic |")
    print("|---|---:|---:|")
    for mode in MODES:
        med = statistics.median(times[mode])
        print(f"| {mode} | {med:.2f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
