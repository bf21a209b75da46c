"""Spill benchmark: auto vs gpu-only vs cpu-only on Ray logical GPUs with slowed GPU replicas.

Every stage gets one GPU replica (on one logical GPU) and one CPU replica. GPU replicas
sleep ``--gpu-delay`` seconds per call (the test-only ``[faults] gpu_delay_s``), so they
saturate; `auto` should then serve about what the GPU pool and the CPU pool serve on their
own, added up. A second `auto` run admits one batch at a time (no saturation) and should
route (almost) nothing to the CPU pool. Throughput is documents per second of
processing (the manifest's ``processing_seconds``: after Ray start and model loads).

Run from the repository root:

    .venv/bin/python bench/spill.py --repeat 1 --gpu-delay 1.0
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from actors.cluster import WORKER_ENV  # noqa: E402 - after the sys.path line above
from jobs.run import execute  # noqa: E402
from pipeline.config import Config, load_config  # noqa: E402

DEMO = REPO / "data" / "demo" / "documents.parquet"
BATCH = 8  # documents per batch: many batches, so routing decisions dominate


def corpus(folder: Path, repeat: int, docs: int) -> Path:
    t = pq.read_table(DEMO).slice(0, docs)
    parts = [
        t.set_column(0, "doc_id", pa.array([f"r{k}-{i}" for i in t["doc_id"].to_pylist()]))
        for k in range(repeat)
    ]
    path = folder / "corpus.parquet"
    pq.write_table(pa.concat_tables(parts), path, row_group_size=BATCH)
    return path


def config(run_id: str, spill: str, delay: float, in_flight: int = 0) -> Config:
    o: dict[str, Any] = {
        "run.run_id": run_id,
        "run.spill": spill,
        "run.batch_size": BATCH,
        "run.show_progress": False,
        "run.embeddings": False,
        "run.max_batches_in_flight": in_flight,
        "faults.gpu_delay_s": delay,
        # the CPU pool runs the int8 encoder in every mode, so cpu-only measures the same
        # CPU replicas that auto spills to
        "embed.cpu_precision": "int8",
        "resources.embed.cpus": 0.5,
    }
    for stage in ("sentencize", "embed", "classify"):
        o[f"resources.{stage}.gpu_replicas"] = 1
        o[f"resources.{stage}.gpu_cpus"] = 0.1
    return load_config(None, o)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="copies of the demo documents")
    ap.add_argument("--docs", type=int, default=400, help="demo documents per copy")
    ap.add_argument("--gpu-delay", type=float, default=1.0, help="seconds per GPU call")
    args = ap.parse_args()
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=1,
        include_dashboard=False,
        runtime_env={"env_vars": WORKER_ENV},
        logging_level="ERROR",
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        inp = corpus(Path(tmp), args.repeat, args.docs)
        runs = [
            ("gpu-only", "gpu-only", 0),
            ("cpu-only", "cpu-only", 0),
            ("auto", "auto", 0),
            ("auto, 1 batch in flight", "auto", 1),
        ]
        for name, spill, in_flight in runs:
            s = execute(
                config(f"b-{spill}-{in_flight}", spill, args.gpu_delay, in_flight),
                str(inp),
                str(Path(tmp) / f"out-{spill}-{in_flight}"),
            )
            rate = s.documents / s.processing_seconds
            rows.append((name, s.documents, s.processing_seconds, rate, s.backends["embed"]))
    ray.shutdown()
    gpu, cpu, auto = rows[0][3], rows[1][3], rows[2][3]
    print(
        f"# Spill: {rows[0][1]} documents, batches of {BATCH}, GPU replicas delayed "
        f"{args.gpu_delay:g} s per call, 1 logical GPU, 2 CPUs\n"
    )
    print("| run | processing s | docs/s | embed batches by backend |")
    print("| --- | ---: | ---: | --- |")
    for name, _, sec, rate, backends in rows:
        shown = ", ".join(f"{b}: {n}" for b, n in sorted(backends.items()))
        print(f"| {name} | {sec:.1f} | {rate:.2f} | {shown} |")
    print(
        f"\nauto / (gpu-only + cpu-only) = {auto:.2f} / ({gpu:.2f} + {cpu:.2f}) = "
        f"**{auto / (gpu + cpu):.2f}** (bar: >= 0.9)"
    )
    print(f"\ncommand: {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
