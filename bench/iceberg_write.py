"""Write cost of Iceberg output against Parquet output, same corpus.

1. End to end: ``docintel run`` (embedded Ray) over ``--copies`` copies of the demo corpus
   (data/demo/documents.parquet, ids made unique), once with ``--format parquet`` and once
   with ``--format iceberg``; from each run's manifest: wall time, time in write tasks,
   the end-of-run step (Parquet: compaction; Iceberg: the last commits) and, for Iceberg,
   every group commit (read the staged parts, write one data file per table, commit).
2. Sinks only (``--sink-batches N``, 0 = skip): N synthetic batches (bench/compaction.py's,
   384-d embeddings) written in this process through each sink, as a run's write tasks,
   driver and end of run would, without models or Ray.

    .venv/bin/python bench/iceberg_write.py --copies 2 --sink-batches 100
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import load_average, machine_lines  # noqa: E402
from bench.compaction import LABELS, fake_batch  # noqa: E402
from docintel.pipeline.config import load_config  # noqa: E402
from docintel.pipeline.formats.iceberg import IcebergSink  # noqa: E402
from docintel.pipeline.formats.parquet import ParquetPartsSink  # noqa: E402
from docintel.pipeline.output.sink import in_process  # noqa: E402

DEMO = REPO / "data" / "demo" / "documents.parquet"
FORMATS = ("parquet", "iceberg")


def corpus(path: Path, copies: int) -> int:
    demo = pq.read_table(DEMO, columns=["doc_id", "text"])
    parts = []
    for k in range(copies):
        ids = pc.binary_join_element_wise(pa.scalar(f"c{k}/"), demo["doc_id"].cast(pa.string()), "")
        parts.append(pa.table({"doc_id": ids, "text": demo["text"]}))
    table = pa.concat_tables(parts)
    pq.write_table(table, path)
    return table.num_rows


def run_once(inp: Path, out: Path, fmt: str, cpus: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "docintel.jobs.cli", "run", str(inp), str(out), "--format",
           fmt, "--run-id", "bench", "--no-progress", "--num-cpus", str(cpus)]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    where = out / "_runs" / "bench" if fmt == "iceberg" else out
    return json.loads((where / "_manifest.json").read_text())


def end_to_end(copies: int, cpus: int) -> list[str]:
    rows = [
        "| format | documents | wall s | write tasks s | end of run s | group commits s |"
        " files | MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "in.parquet"
        n = corpus(inp, copies)
        for fmt in FORMATS:
            m = run_once(inp, Path(tmp) / fmt, fmt, cpus)
            parts = m["parts"]
            files = sum(t["files"] for t in parts["tables"].values())
            nbytes = sum(t["bytes"] for t in parts["tables"].values())
            commits = parts.get("commit_seconds")
            rows.append(
                f"| {fmt} | {n} | {m['timings']['wall_seconds']:.1f} "
                f"| {m['timings']['stage_seconds'].get('write', 0):.2f} "
                f"| {parts['seconds']:.2f} | {'-' if commits is None else f'{commits:.2f}'} "
                f"| {files} | {nbytes / 2**20:.1f} |"
            )
    return rows


def sinks_only(batches: int, docs: int, target_mb: float) -> list[str]:
    cfg = load_config(None, {"run.part_target_mb": target_mb, "run.run_id": "bench"})
    fs = pafs.LocalFileSystem()
    rows = [
        "| format | batches | docs/batch | write s | commits + end of run s | total s | files |"
        " MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in FORMATS:
            root = f"{tmp}/{fmt}"
            rng = np.random.default_rng(0)
            sink: Any
            if fmt == "parquet":
                sink = ParquetPartsSink(fs, root, tuple(LABELS), True, int(target_mb * 2**20))
            else:
                sink = IcebergSink(
                    fs, root, cfg, tuple(LABELS), ("sentencize", "embed", "classify")
                )
                sink.start({"run_id": "bench", "plan": {"models": {}}})
            write = commit = 0.0
            for k in range(batches):
                batch = fake_batch(k, docs, rng)
                t0 = time.perf_counter()
                stats = sink.write(batch)
                t1 = time.perf_counter()
                sink.written(stats)
                write, commit = write + t1 - t0, commit + time.perf_counter() - t1
            t0 = time.perf_counter()
            sink.finish(in_process)
            commit += time.perf_counter() - t0
            tables = sink.table_files()
            files = sum(t["files"] for t in tables.values())
            mib = sum(t["bytes"] for t in tables.values()) / 2**20
            rows.append(
                f"| {fmt} | {batches} | {docs} | {write:.1f} | {commit:.1f} "
                f"| {write + commit:.1f} | {files} | {mib:.1f} |"
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=1, help="copies of the demo corpus (0: skip)")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--sink-batches", type=int, default=100)
    ap.add_argument("--docs-per-batch", type=int, default=128)
    ap.add_argument("--target-mb", type=float, default=64.0)
    args = ap.parse_args()
    lines = end_to_end(args.copies, args.cpus) if args.copies else []
    if args.sink_batches:
        lines += ["", *sinks_only(args.sink_batches, args.docs_per_batch, args.target_mb)]
    print("\n".join(machine_lines()))
    print(f"load average at the end: {load_average()}")
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
