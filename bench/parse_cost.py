"""Benchmark: ``docintel run`` on a folder of PDFs (side A: the parse stage first in the
chain) against the same run on the same text as Parquet (side B: ``docintel ingest`` of
the same folder, so both sides sentencize, embed and classify the same text), end to end
on CPU, and the parse stage's share of the PDF run (issue 32 item 9).

The PDFs: ``--docs`` generated reports of ``--pages`` pages, printed by headless
Chromium and split with pypdfium2 (bench/parse_pdf.py ``make_pdfs``). Each run is its
own subprocess, the sides alternating (A B, B A, A B, ...) after one untimed warm-up run
of side B on two documents (Ray's first start, the derived ONNX models if not cached).

Per run: the subprocess's wall time and documents/s; the manifest's processing seconds
(after the pools started) and per-stage seconds (each stage's replicas' time in calls);
the CPU seconds of the run's whole process tree (bench/common TreeSampler, every 0.2 s)
and of the parse stage's processes in it (its replica and the replica's parser process).
On a shared machine wall times spread; the ratios of the medians are the figures.

Run from the repository root (needs chromium for the PDFs):

    .venv/bin/python bench/parse_cost.py --docs 60 --pages 5 --rounds 2
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: common, parse_pdf

from common import (
    REPO,
    TreePeak,
    ab_orders,
    ab_table,
    docintel_executable,
    load_average,
    machine_lines,
    median_known,
    sampled_docintel_run,
)
from parse_pdf import make_pdfs

RUN_ID = "bench"
SIDES = {"A": "PDF folder", "B": "Parquet (ingested)"}
COLUMNS = {
    "wall": "process wall s",
    "docs_s": "docs/s",
    "processing": "processing s",
    "docs_s_processing": "docs/s processing",
    "tree_cpu": "tree CPU s",
    "parse_cpu": "parse CPU s",
    "parse_s": "parse stage s",
    "stages_s": "all stages s",
}
STAGE_TITLE = re.compile(r":(\w+)/(?:cpu|gpu)/\d+:")  # ray::docintel:<run>:<stage>/cpu/0:...
PARSER_PROCESS = ("python", "python3")  # the parse replica's spawned child: a bare python


def by_role(peak: TreePeak) -> dict[str, float]:
    """CPU seconds by role: each stage's replicas (``parse`` with its parser process,
    ``parser process`` also on its own) and everything else (driver, Ray daemons, idle
    workers, read and write tasks) as ``other``."""
    roles: dict[int, str] = {}
    for sample in peak.timeline:
        for proc in sample.procs:
            stage = STAGE_TITLE.search(proc.label)
            if stage:
                roles[proc.pid] = stage.group(1)
            elif proc.label.startswith(PARSER_PROCESS):
                roles.setdefault(proc.pid, "parser process")
    cpu: dict[str, float] = defaultdict(float)
    for (pid, _created), seconds in peak.cpu_by_process.items():
        cpu[roles.get(pid, "other")] += seconds
    cpu["parse"] += cpu["parser process"]
    return dict(cpu)


def one_run(side: str, source: Path, work: Path, i: int) -> dict:
    """One ``docintel run`` of ``source``, measured; its output removed after."""
    out = work / f"out-{i}-{side}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [docintel_executable(), "run", str(source), str(out), "--no-progress",
           "--run-id", RUN_ID]  # fmt: skip
    wall, peak, manifest, _, _ = sampled_docintel_run(cmd, out, f"run {i} {side}", detail=True)
    shutil.rmtree(out, ignore_errors=True)
    timings, counts = manifest["timings"], manifest["counts"]
    docs, stages = counts["documents"], timings["stage_seconds"]
    cpu = by_role(peak)
    return {
        "wall": wall,
        "docs_s": docs / wall,
        "processing": timings["processing_seconds"],
        "docs_s_processing": docs / timings["processing_seconds"],
        "tree_cpu": peak.cpu_s,
        "parse_cpu": cpu.get("parse") if side == "A" else None,
        "parser_cpu": cpu.get("parser process", 0.0),
        "parse_s": stages.get("parse"),
        "stages_s": sum(stages.values()),
        "documents": docs,
        "sentences": counts["sentences"],
        "errors": counts["errors"],
    }


def prepare(args: argparse.Namespace, work: Path) -> tuple[Path, Path, Path, float]:
    """The PDF folder, its ``docintel ingest`` Parquet (and the ingest's wall seconds),
    and a two-document Parquet for the warm-up run."""
    shutil.rmtree(work / "pdfs", ignore_errors=True)
    folder = work / "pdfs"
    make_pdfs(folder, args.docs, args.pages)
    parquet = work / "documents.parquet"
    t0 = time.perf_counter()
    subprocess.run([docintel_executable(), "ingest", str(folder), str(parquet)], cwd=REPO,
                   check=True, capture_output=True)  # fmt: skip
    ingest_s = time.perf_counter() - t0
    warm = work / "warmup.parquet"
    pq.write_table(pq.read_table(parquet).slice(0, 2), warm)
    return folder, parquet, warm, ingest_s


def share(rows: list[dict]) -> list[str]:
    """The parse stage's share of the PDF runs (medians of side A)."""
    a = [r for r in rows if r["side"] == "A"]
    b_cpu = median_known([r["tree_cpu"] for r in rows if r["side"] == "B"]) or 0.0

    def med(f: Callable[[dict], float]) -> float:
        return statistics.median(f(r) for r in a)

    tree, parse, parser = (
        med(lambda r, k=k: r[k]) for k in ("tree_cpu", "parse_cpu", "parser_cpu")
    )
    return [
        "- parse stage s / all stages' s (manifest): "
        f"{med(lambda r: r['parse_s'] / r['stages_s']):.1%}",
        "- parse stage s / processing s (manifest): "
        f"{med(lambda r: r['parse_s'] / r['processing']):.1%}",
        f"- parse replica + parser process CPU / tree CPU: {parse / tree:.1%} "
        f"({parse:.1f} of {tree:.1f} CPU-s)",
        f"- parser process CPU alone (the parsing) / tree CPU: {parser / tree:.1%} "
        f"({parser:.1f} CPU-s)",
        f"- tree CPU, PDF runs minus Parquet runs: {tree - b_cpu:+.1f} CPU-s",
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=60)
    p.add_argument("--pages", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2, help="A/B pairs, alternating order")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/docintel-bench-parse"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    folder, parquet, warm, ingest_s = prepare(args, work)
    print(f"{args.docs} PDFs x {args.pages} pages; docintel ingest: {ingest_s:.1f} s wall "
          f"(load {load_average()})", flush=True)  # fmt: skip
    one_run("B", warm, work, 0)
    print("warm-up run done (B, two documents, not counted)", flush=True)
    rows = []
    for r, side in ab_orders(args.rounds):
        source = folder if side == "A" else parquet
        row = {"round": r, "side": side, **one_run(side, source, work, r)}
        rows.append(row)
        print(f"  round {r} {side} ({SIDES[side]}): {row['wall']:.1f} s wall, "
              f"{row['tree_cpu']:.1f} CPU-s, {row['documents']} documents, "
              f"{row['sentences']:,} sentences, {row['errors']} errors "
              f"(load {load_average()})", flush=True)  # fmt: skip
    print()
    for line in machine_lines():
        print(line)
    print(f"load average at the end: {load_average()}\n")
    print("A = " + SIDES["A"] + ", B = " + SIDES["B"] + "\n")
    print(ab_table(rows, COLUMNS, 2, ("A", "B")))
    print("\nThe parse stage's share of the PDF runs (A, medians):")
    print("\n".join(share(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
