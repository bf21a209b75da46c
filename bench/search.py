"""`docintel search`: exact scan vs the Lance IVF-PQ index, at 10^5 and 10^6 sentences.

The outputs are SYNTHETIC: committed outputs written by :func:`write_fake_output` with the
real sentences schema (pipeline/schema.py: doc_id, sent_index, text, label, score, a
384-d float32 embedding, the backend and model columns) in parts of 65,536 rows, and a
manifest that records the installed encoder. The embeddings are a mixture: one random
unit centre per 100 sentences, each point a centre plus Gaussian noise of the same norm,
normalised
(cosine to its centre ~0.7, to a neighbour of its cluster ~0.5: a hard case for PQ,
since a query's ten nearest are barely nearer than the rest of its cluster). Queries are
fresh draws of the same mixture.

Each measurement runs in a fresh subprocess (peak RSS is that process's VmHWM):

* ``build``: `docintel index`'s build_index (rows copied into Lance, IVF-PQ trained);
* ``exact``: exact_search, one query per scan (latency), then all queries in one scan
  (the reference top-10 for recall);
* ``indexed``: the index opened once, then one query at a time (latency, recall@10).

Latency is the search only: the query vectors are given (embedding a query with the real
encoder is measured once, ``encode``, and adds the same to both).

    .venv/bin/python bench/search.py                      # 1e5 and 1e6
    .venv/bin/python bench/search.py --sizes 100000 --queries 50
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.config import load_config
from docintel.pipeline.output.sink import MANIFEST, parquet_options
from docintel.pipeline.schema import sentences_schema

DIM = 384
ROWS_PER_PART = 65_536
LABELS = ["Bearish", "Bullish", "Neutral"]
STAGES = ["sentencize", "embed", "classify"]
POINTS_PER_CENTRE = 100  # sentences per mixture centre, at every size


def _mixture(rng: np.random.Generator, centres: np.ndarray, n: int) -> np.ndarray:
    c = centres[rng.integers(0, len(centres), n)]
    x = c + rng.standard_normal((n, centres.shape[1]), dtype=np.float32) / np.sqrt(centres.shape[1])
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def centres_of(n: int, seed: int, dim: int = DIM) -> np.ndarray:
    """The mixture's unit centres for an output of ``n`` sentences (one per 100)."""
    count = max(1, n // POINTS_PER_CENTRE)
    c = np.random.default_rng(seed).standard_normal((count, dim), dtype=np.float32)
    return c / np.linalg.norm(c, axis=1, keepdims=True)


def fake_queries(count: int, n: int, seed: int, dim: int = DIM) -> np.ndarray:
    """``count`` fresh draws of the mixture of write_fake_output(n, seed)."""
    return _mixture(np.random.default_rng(seed + 1), centres_of(n, seed, dim), count)


def _part(rng: np.random.Generator, centres: np.ndarray, start: int, n: int) -> pa.Table:
    idx = np.arange(start, start + n)
    emb = _mixture(rng, centres, n)
    text = pa.array([f"synthetic sentence {i} about topic {i % 997}" for i in idx])
    cols: dict[str, Any] = {
        "doc_id": pa.array([f"doc{i // 5:08d}" for i in idx]),
        "sent_index": pa.array((idx % 5).astype(np.int32)),
        "start_char": pa.array(np.zeros(n, np.int64)),
        "end_char": pc.utf8_length(text).cast(pa.int64()),
        "text": text,
        "label": pa.array(np.array(LABELS)[rng.integers(0, 3, n)]),
        "score": pa.array(rng.uniform(0.34, 1.0, n).astype(np.float32)),
        "n_tokens": pa.array(np.full(n, 12, np.int32)),
        "truncated": pa.array(np.zeros(n, bool)),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), centres.shape[1]),
    }
    for s in STAGES:
        cols[f"{s}_backend"] = pa.array(["synthetic"] * n)
    for s in STAGES:
        cols[f"{s}_model"] = pa.array(["synthetic"] * n)
    schema = sentences_schema(centres.shape[1], STAGES)
    for f in schema:  # the contract's columns a synthetic sentence has no value for: null
        if f.name not in cols:
            cols[f.name] = pa.nulls(n, f.type)
    return pa.table(cols).select(schema.names).cast(schema)


def write_fake_output(root: Path, n: int, seed: int = 0, dim: int = DIM) -> Path:
    """A committed docintel output of ``n`` synthetic sentences (see the module docstring);
    its manifest records the installed encoder, so `docintel search` accepts it."""
    rng = np.random.default_rng(seed)
    centres = centres_of(n, seed, dim)
    (root / "sentences").mkdir(parents=True, exist_ok=True)
    for k, start in enumerate(range(0, n, ROWS_PER_PART)):
        t = _part(rng, centres, start, min(ROWS_PER_PART, n - start))
        pq.write_table(t, root / "sentences" / f"part-{k:06d}.parquet", **parquet_options(t.schema))
    encoder = fingerprint(load_config().embed.resolved_model_path())
    manifest = {
        "run_id": f"synthetic-{n}-{seed}",
        "finished": dt.datetime.now(dt.UTC).isoformat(),
        "synthetic": True,
        "plan": {"embeddings": True, "models": {"embed": encoder}},
        "models": {"embed": encoder},
        "labels": LABELS,
        "counts": {"sentences": n},
    }
    (root / MANIFEST).write_text(json.dumps(manifest))
    return root


# --- the measurements, each in its own process ----------------------------------------------


def _peak_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pcts(times: list[float]) -> dict[str, float]:
    ms = np.array(times) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95))}


def child_build(root: Path, _q: np.ndarray, _args: argparse.Namespace) -> dict[str, Any]:
    from docintel.pipeline.search.index import build_index

    t0 = time.perf_counter()
    record = build_index(str(root))
    return {"build_s": time.perf_counter() - t0, "params": record["params"],
            "peak_rss_mib": _peak_mib()}  # fmt: skip


def child_exact(root: Path, q: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    from docintel.pipeline.search.query import exact_search
    from docintel.pipeline.search.source import Filters, SentencesSource

    source = SentencesSource.open(str(root))
    times = []
    for v in q[: args.exact_queries]:
        t0 = time.perf_counter()
        exact_search(source, v[None, :], 10, Filters())
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    ref = exact_search(source, q, 10, Filters())  # every query in one scan
    all_s = time.perf_counter() - t0
    ids = [[[h["doc_id"], h["sent_index"]] for h in hits] for hits in ref]
    (root.parent / f"exact-{root.name}.json").write_text(json.dumps(ids))
    return {**_pcts(times), "all_queries_one_scan_s": all_s, "peak_rss_mib": _peak_mib()}


def child_indexed(root: Path, q: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    from docintel.pipeline.search import index as ann_index
    from docintel.pipeline.search.source import Filters, SentencesSource

    source = SentencesSource.open(str(root))
    index, _ = ann_index.find(source)
    assert index is not None
    p = index.params
    if args.nprobes or args.refine is not None:
        p = ann_index.IndexParams(
            p.partitions, p.sub_vectors, args.nprobes or p.nprobes,
            p.refine_factor if args.refine is None else args.refine,
        )  # fmt: skip
    ann_index.query(index, q[:3], 10, Filters(), p)  # warm: index and file metadata
    times, got = [], []
    for v in q:
        t0 = time.perf_counter()
        (hits,) = ann_index.query(index, v[None, :], 10, Filters(), p)
        times.append(time.perf_counter() - t0)
        got.append({(h["doc_id"], h["sent_index"]) for h in hits})
    ref = json.loads((root.parent / f"exact-{root.name}.json").read_text())
    recall = np.mean(
        [len(g & {tuple(x) for x in r}) / len(r) for g, r in zip(got, ref, strict=True)]
    )
    return {**_pcts(times), "recall_at_10": float(recall), "peak_rss_mib": _peak_mib(),
            "nprobes": p.nprobes, "refine_factor": p.refine_factor}  # fmt: skip


def child_encode(_root: Path, _q: np.ndarray, _args: argparse.Namespace) -> dict[str, Any]:
    from docintel.pipeline.search.query import QueryEncoder

    enc = QueryEncoder(load_config().embed)
    enc.encode(["warm up"])
    times = []
    for i in range(20):
        t0 = time.perf_counter()
        enc.encode([f"going concern doubt number {i}"])
        times.append(time.perf_counter() - t0)
    return _pcts(times)


CHILDREN = {"build": child_build, "exact": child_exact, "indexed": child_indexed}
CHILDREN["encode"] = child_encode


def _child(mode: str, root: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, "--root", str(root), "--n", str(n)]
    cmd += ["--queries", str(args.queries), "--exact-queries", str(args.exact_queries)]
    cmd += ["--nprobes", str(args.nprobes)]
    if args.refine is not None:
        cmd += ["--refine", str(args.refine)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{mode} at {root} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _one_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.workdir) / f"out-{n}"
    if not (root / MANIFEST).is_file():
        t0 = time.perf_counter()
        write_fake_output(root, n)
        print(f"wrote {n:,} synthetic sentences in {time.perf_counter() - t0:.1f} s", flush=True)
    row: dict[str, Any] = {"n": n}
    for mode in ("build", "exact", "indexed"):
        row[mode] = _child(mode, root, n, args)
        print(f"{n:,} {mode}: {row[mode]}", flush=True)
    return row


def _table(rows: list[dict[str, Any]], encode: dict[str, Any]) -> str:
    head = (
        "| sentences | exact p50 / p95 ms | exact peak RSS MiB | index build s | "
        "indexed p50 / p95 ms | indexed peak RSS MiB | recall@10 | nprobes / refine |\n"
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    lines = [head]
    for r in rows:
        e, b, i = r["exact"], r["build"], r["indexed"]
        lines.append(
            f"| {r['n']:,} | {e['p50_ms']:,.0f} / {e['p95_ms']:,.0f} | {e['peak_rss_mib']:,.0f} "
            f"| {b['build_s']:,.1f} | {i['p50_ms']:.1f} / {i['p95_ms']:.1f} | "
            f"{i['peak_rss_mib']:,.0f} | {i['recall_at_10']:.3f} | "
            f"{i['nprobes']} / {i['refine_factor']} |"
        )
    lines.append(
        f"\nEmbedding one query (the real encoder, not included above): p50 "
        f"{encode['p50_ms']:.1f} ms, p95 {encode['p95_ms']:.1f} ms."
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--queries", type=int, default=100, help="indexed queries (recall, latency)")
    ap.add_argument("--exact-queries", type=int, default=5, help="exact scans timed one by one")
    ap.add_argument("--nprobes", type=int, default=0, help="override the index's nprobes")
    ap.add_argument("--refine", type=int, default=None, help="override its refine factor")
    ap.add_argument("--workdir", default="/tmp/docintel-search-bench")
    ap.add_argument("--child", choices=sorted(CHILDREN))
    ap.add_argument("--root")
    ap.add_argument("--n", type=int, default=1, help="(child) the output's size")
    args = ap.parse_args()
    if args.child:
        queries = fake_queries(args.queries, args.n, seed=0)
        print(json.dumps(CHILDREN[args.child](Path(args.root or "."), queries, args)))
        return
    encode = _child("encode", Path(args.workdir), 1, args)
    rows = [_one_size(n, args) for n in args.sizes]
    print(_table(rows, encode))


if __name__ == "__main__":
    main()
