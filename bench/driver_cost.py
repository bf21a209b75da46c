"""What the driver costs per document at GPU speed, against a bare Ray chain of the same calls.

The GPU replicas are **modelled** (``[faults] gpu_model_s_per_sentence``, default 2e-5 s
per sentence: about 50,000 sentences/s, a conservative MiniLM fp16 figure for an H100/H200
class card): they load no model, sleep the modelled service time and return placeholder
columns of the real types. With ``--model-sentencizer`` (the default) the sentencizer's
GPU replicas are modelled too (``[faults] gpu_model_rule_based``: each document one
sentence), so spaCy's CPU cost on this 2-core machine is not in the measurement either.
What is left on the cores is what is measured: the driver, Ray, the read and write tasks.

One Ray session (``--gpus`` logical GPUs, 2 CPUs) serves every run of the table:

* **docintel**: ``execute()`` as ``docintel run`` calls it, ``spill = "gpu-only"``, no
  embeddings written, default batch settings (unless ``--batch-size``), at two corpus sizes;
* **bare Ray chain**: the same topology written by hand: per batch a read task, three
  actor calls (actors that sleep the same modelled time), and a write task of the same
  Parquet tables, chained by ObjectRefs from one driver with a bounded window; the
  strongest simple alternative, and the floor of what Ray itself costs per batch.

Driver CPU is psutil's user + system time of this process over the run. **Marginal** per
document = the difference between the two corpus sizes divided by the difference in
documents, so start-up, model loads and planning cancel out. Per batch = the same over
batches.

    .venv/bin/python bench/driver_cost.py --docs 20000,80000 --kind short
    .venv/bin/python bench/driver_cost.py --docs 4000,16000 --kind long
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import ray

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import load_average, machine_lines  # noqa: E402
from docintel.actors.runner import execute  # noqa: E402
from docintel.pipeline.config import load_config  # noqa: E402

SENTENCES = [
    "Revenue rose 4% in the quarter on strong demand in Europe.",
    "The company cut its full-year guidance after a weak holiday season.",
    "Shares were little changed in early trading.",
    "The board approved a buyback of up to $2 billion.",
    "Analysts expect margins to narrow as input costs climb.",
]
LONG_SENTENCES = 17  # a news article's worth
STAGES = ("sentencize", "embed", "classify")


def corpus(folder: Path, n: int, kind: str) -> Path:
    rng = np.random.default_rng(n)
    picks = rng.integers(0, len(SENTENCES), size=(n, LONG_SENTENCES if kind == "long" else 1))
    # unique texts (a number in each sentence), as a real corpus: the footers' text sizes
    # are then the texts' sizes, not a dictionary's
    texts = [
        " ".join(SENTENCES[j].replace(" ", f" {i % 997} ", 1) for j in row)
        for i, row in enumerate(picks)
    ]
    path = folder / f"{kind}-{n}.parquet"
    table = pa.table({"doc_id": [f"d{i:08d}" for i in range(n)], "text": texts})
    pq.write_table(table, path, row_group_size=min(n, 1 << 16))
    return path


def cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


@dataclass
class Run:
    docs: int
    batches: int
    sentences: int
    driver_s: float
    wall_s: float
    processing_s: float = 0.0
    busy: float = 0.0  # modelled GPU replicas' mean busy share over processing


def docintel_run(path: Path, out: Path, args: argparse.Namespace, tag: str) -> Run:
    o: dict[str, Any] = {
        "run.run_id": tag,
        "run.spill": "gpu-only",
        "run.embeddings": False,
        "run.show_progress": False,
        "run.part_target_mb": 0,
        "faults.gpu_model_s_per_sentence": args.s_per_sentence,
        "faults.gpu_model_rule_based": args.model_sentencizer,
    }
    if args.batch_size:
        o["run.batch_size"] = args.batch_size
    for stage in STAGES:
        o[f"resources.{stage}.gpu_replicas"] = args.gpus
        o[f"resources.{stage}.gpu_cpus"] = 0.0
    cfg = load_config(None, o)
    c0, t0 = cpu_s(), time.perf_counter()
    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    s = execute(cfg, str(path), str(out))
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
    run = Run(s.documents, s.batches, s.sentences, cpu_s() - c0, time.perf_counter() - t0)
    run.processing_s = s.processing_seconds
    manifest = json.loads((out / "_manifest.json").read_text())
    gpu = [r for r in manifest["replicas"] if r["pool"] == "gpu" and r["stage"] != STAGES[0]]
    run.busy = sum(r["busy_seconds"] for r in gpu) / (len(gpu) * run.processing_s)
    return run


@ray.remote
class _Sleeper:
    """A bare-chain stage actor: sleeps the modelled time, appends a column."""

    def __init__(self, s_per_row: float, name: str) -> None:
        self.s, self.name = s_per_row, name

    def process(self, table: pa.Table) -> pa.Table:
        time.sleep(table.num_rows * self.s)
        return table.append_column(self.name, pa.array(np.zeros(table.num_rows, np.float32)))


@ray.remote(num_cpus=0.25)
def _read(path: str, start: int, n: int) -> pa.Table:
    pf = pq.ParquetFile(path)
    return pf.read().slice(start, n)  # small corpora: the whole file, then the slice


@ray.remote(num_cpus=0.25)
def _write(table: pa.Table, folder: str, k: int) -> int:
    pq.write_table(table, f"{folder}/part-{k:06d}.parquet", compression="zstd")
    return table.num_rows


def bare_chain(path: Path, out: Path, docs: int, batch: int, args: argparse.Namespace) -> Run:
    """Read -> 3 actor calls -> write per batch, ObjectRefs chained, a bounded window."""
    out.mkdir(parents=True, exist_ok=True)
    actors = [
        [_Sleeper.options(num_gpus=0.25, num_cpus=0).remote(args.s_per_sentence, f"s{i}")
         for _ in range(args.gpus)]
        for i in range(3)
    ]  # fmt: skip
    ray.get([a.__ray_ready__.remote() for pool in actors for a in pool])
    c0, t0 = cpu_s(), time.perf_counter()
    window = 2 * 3 * 2 * args.gpus
    pending: list[ray.ObjectRef] = []
    n_batches = -(-docs // batch)
    for k in range(n_batches):
        ref = _read.remote(str(path), k * batch, batch)
        for pool in actors:
            ref = pool[k % len(pool)].process.remote(ref)
        pending.append(_write.remote(ref, str(out), k))
        if len(pending) >= window:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
    ray.get(pending)
    run = Run(docs, n_batches, docs, cpu_s() - c0, time.perf_counter() - t0)
    for pool in actors:
        for a in pool:
            ray.kill(a)
    return run


def marginal(a: Run, b: Run) -> tuple[float, float]:
    """Driver CPU per document (us) and per batch (ms) between two sizes."""
    per_doc = (b.driver_s - a.driver_s) / (b.docs - a.docs) * 1e6
    per_batch = (b.driver_s - a.driver_s) / max(1, b.batches - a.batches) * 1e3
    return per_doc, per_batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", default="20000,80000", help="two corpus sizes")
    ap.add_argument("--kind", choices=("short", "long"), default="short")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--s-per-sentence", type=float, default=2e-5)
    ap.add_argument("--batch-size", type=int, default=0, help="0 = docintel's default")
    ap.add_argument("--model-sentencizer", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--profile", action="store_true", help="cProfile the larger docintel run")
    args = ap.parse_args()
    sizes = [int(x) for x in args.docs.split(",")]
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=2, num_gpus=args.gpus, include_dashboard=False, logging_level="ERROR")
    rows = []
    with tempfile.TemporaryDirectory(prefix="driver-cost-") as tmp:
        folder = Path(tmp)
        paths = [corpus(folder, n, args.kind) for n in sizes]
        profile = args.profile
        runs = []
        for i, (n, p) in enumerate(zip(sizes, paths, strict=True)):
            args.profile = profile and i == len(sizes) - 1
            runs.append(docintel_run(p, folder / f"out-{n}", args, f"cost-{n}"))
        batch = runs[-1].docs // max(1, runs[-1].batches)
        bare = [
            bare_chain(p, folder / f"bare-{n}", n, batch, args)
            for n, p in zip(sizes, paths, strict=True)
        ]
        rows.append(("docintel", runs))
        rows.append((f"bare Ray chain ({batch} docs/batch)", bare))
    print(f"\n## Driver CPU at modelled GPU speed ({args.kind} documents, {args.gpus} GPUs)\n")
    for line in machine_lines():
        print(line)
    print(f"load: {load_average()}\n")
    print(
        "| what | docs | batches | driver CPU s | wall s | modelled GPU busy "
        "| per doc (marginal) | per batch |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, rs in rows:
        per_doc, per_batch = marginal(rs[0], rs[1])
        for r in rs:
            busy = f"{r.busy:.0%}" if r.busy else ""
            print(
                f"| {name} | {r.docs:,} | {r.batches:,} | {r.driver_s:.2f} | {r.wall_s:.1f} "
                f"| {busy} | | |"
            )
        print(f"| {name}, marginal | | | | | | {per_doc:.2f} us | {per_batch:.2f} ms |")
    ratio = marginal(*rows[0][1])[1] / marginal(*rows[1][1])[1]
    print(f"\ndocintel / bare chain, driver CPU per batch: {ratio:.2f}x")
    ray.shutdown()


if __name__ == "__main__":
    main()
