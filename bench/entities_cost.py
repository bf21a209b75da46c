"""Benchmark: what a 100,000-name watch list costs a CPU run, end to end (issue 34).

The same ``docintel run`` (CPU pools, the default configuration) on the same corpus,
without a list (side A) and with ``--watch-list`` of a synthetic 10^5-name list (side B),
each run its own subprocess, in alternating order (A B, B A, A B, ...). Side B pays
everything the list brings: reading and checking it on the driver, compiling it (the
cached compilation is deleted before every B run, so each one compiles), the extra pool
(the entities replica's start and its load of the compiled file) and the matching. The
target: B at most 1.30x A.

Corpus: ``--docs`` long news documents of ``--sentences-per-doc`` consecutive headlines
(bench/pipeline_vs_loop.py ``--corpus long``, the corpus of the other end-to-end benches:
300 documents, ~5,200 sentences), every third one opening with a sentence that names a
listed entity ("Shares of <name> fell after the results."), so matches are written too.
List: ``--names`` entities of pipeline/entities/synthetic.py (people and companies, some
accented, corporate suffixes), one CSV. Both sides read the same corpus file; the derived
ONNX models are built by one warm-up run of side A before the timed runs (not counted).

Per run: the subprocess's wall time, the CPU seconds of its whole process tree (driver,
Ray daemons, workers; sampled every 0.2 s), of the driver (it reads, checks and compiles
the list) and of the entities replica (its process start, the load of the compiled list,
the matching), the manifest's wall time and the entities stage's seconds, the compile
time the run printed, and the entities replica's peak RSS.
On a shared machine wall times spread; the ratios of medians are the figure.

Run from the repository root:

    .venv/bin/python bench/entities_cost.py --rounds 3
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: common, pipeline_vs_loop

from common import (
    MIB,
    ab_orders,
    ab_table,
    docintel_executable,
    load_average,
    machine_lines,
    sampled_docintel_run,
)
from pipeline_vs_loop import build_long_corpus

from docintel.pipeline.entities.synthetic import names

RUN_ID = "bench"
BUILT = re.compile(r"built \S+\.lists in ([0-9.]+) s")
COLUMNS = {
    "wall": "process wall s",
    "run_wall": "manifest wall s",
    "tree_cpu": "tree CPU s",
    "driver_cpu": "driver CPU s",
    "replica_cpu": "entities replica CPU s",
    "stage": "entities stage s",
    "compile": "compile s",
    "replica_mb": "entities replica MiB",
}


def build_inputs(args: argparse.Namespace, work: Path) -> tuple[Path, Path, int]:
    """The corpus (names planted in every third document) and the list; cached in work."""
    corpus = work / f"news-{args.docs}x{args.sentences_per_doc}-named.parquet"
    watch = work / f"watch-{args.names}.csv"
    rows = names(args.names)
    if not watch.exists():
        with watch.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["entity_id", "name", "type"])
            w.writerows(rows)
    plain = work / "plain.parquet"
    build_long_corpus(args.docs, args.sentences_per_doc, plain)
    table = pq.read_table(plain)
    texts = table["text"].to_pylist()
    step = max(1, len(rows) // max(1, len(texts)))
    planted = 0
    for i in range(0, len(texts), 3):
        texts[i] = f"Shares of {rows[i * step][1]} fell after the results. {texts[i]}"
        planted += 1
    named = table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts))
    pq.write_table(named, corpus, row_group_size=100)
    return corpus, watch, planted


def one_run(side: str, corpus: Path, watch: Path, work: Path, cache: Path, i: int) -> dict:
    """One ``docintel run`` of ``side`` (A: no list, B: the list), measured."""
    out = work / f"out-{i}-{side}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [docintel_executable(), "run", str(corpus), str(out), "--no-progress",
           "--run-id", RUN_ID]  # fmt: skip
    if side == "B":
        shutil.rmtree(cache / "entities", ignore_errors=True)  # every B run compiles
        cmd += ["--watch-list", str(watch)]
    env = {**os.environ, "DOCINTEL_CACHE_DIR": str(cache)}
    wall, peak, manifest, err, driver = sampled_docintel_run(
        cmd, out, f"run {i} {side}", env, detail=True
    )
    pids = {r.get("pid") for r in manifest["replicas"] if r["stage"] == "entities"} - {None}
    rss = [p.rss for s in peak.timeline for p in s.procs if p.pid in pids]
    cpu: dict[int, float] = {}
    for sample in peak.timeline:
        for p in sample.procs:
            cpu[p.pid] = max(cpu.get(p.pid, 0.0), p.cpu_s)
    built = BUILT.search(err)
    timings = manifest["timings"]
    return {
        "wall": wall,
        "run_wall": timings["wall_seconds"],
        "tree_cpu": peak.cpu_s,
        "driver_cpu": cpu.get(driver),
        "replica_cpu": sum(cpu.get(pid, 0.0) for pid in pids) if pids else None,
        "stage": timings["stage_seconds"].get("entities"),
        "compile": float(built.group(1)) if built else None,
        "replica_mb": max(rss) / MIB if rss else None,
        "sentences": manifest["counts"]["sentences"],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="A/B pairs, alternating order")
    p.add_argument("--docs", type=int, default=300)
    p.add_argument("--sentences-per-doc", type=int, default=17)
    p.add_argument("--names", type=int, default=100_000)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/docintel-bench-entities"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    t0 = time.perf_counter()
    corpus, watch, planted = build_inputs(args, work)
    print(f"inputs: {args.docs} documents ({planted} naming a listed entity), a list of "
          f"{args.names:,} names ({time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip
    print("warm-up run (A, not counted: builds the derived ONNX models)", flush=True)
    one_run("A", corpus, watch, work, cache, 0)
    rows = []
    for r, side in ab_orders(args.rounds):
        row = {"round": r, "side": side, **one_run(side, corpus, watch, work, cache, r)}
        rows.append(row)
        print(f"  round {r} {side}: {row['wall']:.1f} s wall, {row['tree_cpu']:.1f} CPU-s, "
              f"{row['sentences']:,} sentences (load {load_average()})", flush=True)  # fmt: skip
    print()
    for line in machine_lines():
        print(line)
    print(f"load average at the end: {load_average()}\n")
    print(ab_table(rows, COLUMNS, 1, ("B", "A")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
