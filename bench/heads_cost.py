"""Benchmark: what each extra classifier head costs a CPU run (issue 33, item 7).

The same ``docintel run`` (CPU pools, the default configuration: the heads on their fp32
ONNX graphs) over the demo corpus (data/demo/documents.parquet, ``--repeat`` copies) with
0, 1 and 2 extra heads (``--classifier h1=DIR --classifier h2=DIR``), each run its own
subprocess, the sides in rotating order per round (0 1 2, 2 1 0, 0 1 2, ...) so that every
side sees the same load. The extra heads are copies of the bundled default head
(models/finsent_ft, without its encoder/): a head must be trained on the run's encoder,
and a copy is exactly the default head's size. Each copy is its own folder, so it has its
own version and its own cached ONNX graph; one warm-up run with 2 heads builds them (not
counted).

Per run: the subprocess's wall time, the CPU seconds of its whole process tree (driver,
Ray daemons, workers; sampled every 0.2 s), the classify replicas' CPU seconds (their
process start, model loads and calls), and the manifest's classify stage seconds (the
calls alone, summed over batches). The figure: each side's median tree CPU seconds, and
per extra head (median of side k - median of side 0) / k over median of side 0; the
target is at most 5 % of the CPU run time per head.

Run from the repository root:

    .venv/bin/python bench/heads_cost.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: common

from common import (
    build_corpus,
    docintel_executable,
    fmt,
    load_average,
    machine_lines,
    md_row,
    median_known,
    sampled_docintel_run,
)

from docintel.pipeline.config import ClassifyConfig

RUN_ID = "bench"
SIDES = (0, 1, 2)  # extra heads per run
COLUMNS = {
    "wall": "process wall s",
    "tree_cpu": "tree CPU s",
    "classify_cpu": "classify replicas CPU s",
    "stage": "classify stage s",
}


def head_copies(work: Path, n: int) -> list[Path]:
    """``n`` copies of the bundled default head (its encoder/ left out)."""
    src = ClassifyConfig().resolved_model_dir()
    heads = []
    for i in range(1, n + 1):
        dst = work / "heads" / f"h{i}"
        if not dst.exists():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("encoder"))
        heads.append(dst)
    return heads


def one_run(k: int, corpus: Path, heads: list[Path], work: Path, i: int) -> dict:
    """One ``docintel run`` with ``k`` extra heads, measured."""
    out = work / f"out-{i}-{k}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [docintel_executable(), "run", str(corpus), str(out), "--no-progress",
           "--run-id", RUN_ID]  # fmt: skip
    for j, head in enumerate(heads[:k], 1):
        cmd += ["--classifier", f"h{j}={head}"]
    env = {**os.environ, "DOCINTEL_CACHE_DIR": str(work / "cache")}
    wall, peak, manifest, _, _ = sampled_docintel_run(
        cmd, out, f"run {i} ({k} heads)", env, detail=True
    )
    pids = {r.get("pid") for r in manifest["replicas"] if r["stage"] == "classify"} - {None}
    cpu: dict[int, float] = {}
    for sample in peak.timeline:
        for p in sample.procs:
            cpu[p.pid] = max(cpu.get(p.pid, 0.0), p.cpu_s)
    assert [h["name"] for h in manifest.get("heads", [])] == [f"h{j}" for j in range(1, k + 1)]
    return {
        "wall": wall,
        "tree_cpu": peak.cpu_s,
        "classify_cpu": sum(cpu.get(pid, 0.0) for pid in pids) if pids else None,
        "stage": manifest["timings"]["stage_seconds"].get("classify"),
        "sentences": manifest["counts"]["sentences"],
    }


def orders(rounds: int) -> list[tuple[int, int]]:
    """(round, extra heads) in run order: 0 1 2, 2 1 0, 0 1 2, ..."""
    return [(r, k) for r in range(1, rounds + 1) for k in (SIDES if r % 2 else SIDES[::-1])]


def table(rows: list[dict]) -> str:
    """Markdown: every run, each side's medians, and the cost per extra head: (median of
    side k minus side 0) / k, over the same column's median of side 0 ("per head"), and
    over the run's tree CPU seconds of side 0 ("of run CPU": what the classify replicas'
    and the stage's extra seconds are of the whole run)."""
    head = ["round", "extra heads", *COLUMNS.values()]
    lines = [md_row(head), md_row(["---:"] * len(head))]
    digits = {c: 2 if c in ("classify_cpu", "stage") else 1 for c in COLUMNS}
    for r in rows:
        cells = [str(r["round"]), str(r["k"]), *(fmt(r[c], digits[c]) for c in COLUMNS)]
        lines.append(md_row(cells))
    med = {k: {c: median_known(r[c] for r in rows if r["k"] == k) for c in COLUMNS} for k in SIDES}
    for k in SIDES:
        lines.append(md_row(["median", str(k), *(fmt(med[k][c], digits[c]) for c in COLUMNS)]))
    run_cpu = med[0]["tree_cpu"]
    for k in SIDES[1:]:
        for label, over in (("per head", None), ("of run CPU", run_cpu)):
            cells = []
            for c in COLUMNS:
                base, with_k = med[0][c], med[k][c]
                denom = over if over is not None else base
                ok = base is not None and with_k is not None and denom
                ok = ok and not (over is not None and c == "wall")  # wall s over CPU s: no
                cells.append(f"{100 * (with_k - base) / k / denom:+.2f} %" if ok else "—")
            lines.append(md_row([label, f"{k} vs 0", *cells]))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of the three sides")
    p.add_argument("--repeat", type=int, default=1, help="copies of the demo corpus")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/docintel-bench-heads"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / f"demo-x{args.repeat}.parquet"
    n_docs = build_corpus(args.repeat, corpus)
    heads = head_copies(work, max(SIDES))
    print(f"corpus: {n_docs} documents; extra heads: copies of the default head", flush=True)
    t0 = time.perf_counter()
    one_run(max(SIDES), corpus, heads, work, 0)  # builds every head's ONNX graph
    print(f"warm-up run (not counted): {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for r, k in orders(args.rounds):
        row = {"round": r, "k": k, **one_run(k, corpus, heads, work, r)}
        rows.append(row)
        said = f"{row['wall']:.1f} s wall, {row['tree_cpu']:.1f} CPU-s"
        print(f"  round {r}, {k} extra heads: {said}, {row['sentences']:,} sentences "
              f"(load {load_average()})", flush=True)  # fmt: skip
    print()
    for line in machine_lines():
        print(line)
    print(f"load average at the end: {load_average()}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
