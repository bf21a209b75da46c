"""Spill benchmark: auto vs gpu-only vs cpu-only on Ray logical GPUs with slowed GPU replicas.

Every stage gets one GPU replica (on one logical GPU) and one CPU replica. GPU replicas
sleep ``--gpu-delay`` seconds per call (the test-only ``[faults] gpu_delay_s``), so they
saturate; `auto` should then serve about what the GPU pool and the CPU pool serve on their
own, added up. A last `auto` run admits one batch at a time (no saturation) and should
route (almost) nothing to the CPU pool. Throughput is documents per second of
processing (the manifest's ``processing_seconds``: after Ray start and model loads).

Besides throughput it reports, per run and replica, what explains it: calls, the busy
and queue seconds the dispatcher measured (``docintel.actors.executor``'s end-of-run log record),
its service-time estimate, and the CPU seconds the replica's process used (psutil), plus
how busy the machine's cores were (other processes included: a shared machine is noisy).
Without CUDA a GPU replica is ``gpu-sim``: it sleeps, then runs the fp32 model on the
same host cores the CPU replicas use, and the CPU-seconds column shows what that costs.

Run from the repository root:

    .venv/bin/python bench/spill.py --docs 400 --gpu-delay 1.0
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import ray

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import load_average, machine_lines  # noqa: E402
from docintel.actors.cluster import WORKER_ENV, actor_name  # noqa: E402 - after the sys.path line
from docintel.actors.runner import execute  # noqa: E402
from docintel.pipeline.config import Config, load_config  # noqa: E402
from docintel.pipeline.output import RunSummary  # noqa: E402

DEMO = REPO / "data" / "demo" / "documents.parquet"
BATCH = 8  # documents per batch: many batches, so routing decisions dominate
STAGES = ("sentencize", "embed", "classify")
POOLS = {"auto": ("gpu", "cpu"), "gpu-only": ("gpu",), "cpu-only": ("cpu",)}
SATURATED = ("gpu-only", "cpu-only", "auto")  # the runs the bar compares, in that order


def corpus(folder: Path, name: str, repeat: int, docs: int) -> Path:
    t = pq.read_table(DEMO).slice(0, docs)
    parts = [
        t.set_column(0, "doc_id", pa.array([f"r{k}-{i}" for i in t["doc_id"].to_pylist()]))
        for k in range(repeat)
    ]
    path = folder / f"{name}.parquet"
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
    for stage in STAGES:
        o[f"resources.{stage}.gpu_replicas"] = 1
        o[f"resources.{stage}.gpu_cpus"] = 0.1
    return load_config(None, o)


class _DispatchLog(logging.Handler):
    """Keeps the executor's end-of-run record: per replica calls, busy/queued seconds."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.replicas: list[dict[str, Any]] = []
        self.held_s: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.replicas = record.__dict__.get("replicas", [])
        self.held_s = record.__dict__.get("held_s", {})


@dataclass
class Run:
    name: str
    summary: RunSummary
    replicas: list[dict[str, Any]]
    held_s: dict[str, float]
    cpu_s: dict[str, float]  # replica key -> CPU seconds its process used while processing
    machine_cores: float  # cores busy on the whole machine while processing (all users)
    load: str
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.summary.documents / self.summary.processing_seconds


def measure(name: str, cfg: Config, inp: Path, out: Path) -> Run:
    """One ``execute`` with each replica's process CPU time sampled as batches finish."""
    run_id, spill = cfg.run.run_id, cfg.run.spill
    procs: dict[str, tuple[psutil.Process, float]] = {}
    last: dict[str, float] = {}
    marks: dict[str, Any] = {}

    def on_start(_total: int, _done: int) -> None:
        for stage in STAGES:
            for kind in POOLS[spill]:
                key = f"{stage}/{kind}/0"
                pid = ray.get(ray.get_actor(actor_name(run_id, key)).ready.remote())["pid"]
                proc = psutil.Process(pid)
                procs[key] = (proc, sum(proc.cpu_times()[:2]))
        marks["t0"], marks["cpu0"] = time.perf_counter(), psutil.cpu_times()

    def on_batch(_stats: object) -> None:  # the last call is at the end of processing
        for key, (proc, _) in procs.items():
            try:
                last[key] = sum(proc.cpu_times()[:2])
            except psutil.Error:  # a restarted actor: keep its last reading
                continue
        marks["t1"], marks["cpu1"] = time.perf_counter(), psutil.cpu_times()

    log = logging.getLogger("docintel.actors.executor")
    handler = _DispatchLog()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        summary = execute(cfg, str(inp), str(out), on_start=on_start, on_batch=on_batch)
    finally:
        log.removeHandler(handler)

    def busy(c: Any) -> float:
        return c.user + c.nice + c.system + c.irq + c.softirq + getattr(c, "steal", 0.0)

    span = marks["t1"] - marks["t0"]
    cores = (busy(marks["cpu1"]) - busy(marks["cpu0"])) / span if span > 0 else 0.0
    cpu_s = {k: last.get(k, start) - start for k, (_, start) in procs.items()}
    return Run(name, summary, handler.replicas, handler.held_s, cpu_s, cores, load_average())


def report(runs: list[Run], args: argparse.Namespace, docs: tuple[int, int]) -> None:
    gpu, cpu, auto = (next(r for r in runs if r.name == n).rate for n in SATURATED)
    print(
        f"# Spill: batches of {BATCH} documents, GPU replicas delayed {args.gpu_delay:g} s "
        f"per call, 1 logical GPU, 2 Ray CPUs\n"
    )
    for line in machine_lines():
        print(f"- {line}")
    print(f"- saturated runs: {docs[0]} documents; no-saturation run: {docs[1]} documents\n")
    print(
        "| run | docs | processing s | docs/s | embed batches by backend | machine cores "
        "busy | load avg after |"
    )
    print("| --- | ---: | ---: | ---: | --- | ---: | --- |")
    for r in runs:
        s = r.summary
        shown = ", ".join(f"{b}: {n}" for b, n in sorted(s.backends["embed"].items()))
        print(
            f"| {r.name} | {s.documents} | {s.processing_seconds:.1f} | {r.rate:.2f} | "
            f"{shown} | {r.machine_cores:.2f} | {r.load} |"
        )
    print(
        f"\nauto / (gpu-only + cpu-only) = {auto:.2f} / ({gpu:.2f} + {cpu:.2f}) = "
        f"**{auto / (gpu + cpu):.2f}** (bar: >= 0.9)\n"
    )
    print(
        "Per replica: calls; busy and queued seconds as the driver measured them; the "
        "service-time estimate at the end; CPU seconds of the replica's process.\n"
    )
    print("| run | replica | calls | busy s | queued s | service s | CPU s | CPU s/call |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        for rep in r.replicas:
            key, calls = rep["replica"], rep["calls"]
            cpu_s = r.cpu_s.get(key, 0.0)
            per = f"{cpu_s / calls:.3f}" if calls else "—"
            est = "—" if rep["service_s"] is None else f"{rep['service_s']:.3f}"
            print(
                f"| {r.name} | {key} | {calls} | {rep['busy_s']:.1f} | {rep['queued_s']:.1f} "
                f"| {est} | {cpu_s:.1f} | {per} |"
            )
    print("\nSeconds batches waited on the driver for a replica slot, per stage:\n")
    for r in runs:
        held = ", ".join(f"{s} {v:.1f}" for s, v in r.held_s.items())
        print(f"- {r.name}: {held}")
    print(f"\ncommand: {' '.join(sys.argv)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="copies of the demo documents")
    ap.add_argument("--docs", type=int, default=400, help="demo documents per copy")
    ap.add_argument("--calm-docs", type=int, default=80, help="documents of the no-saturation run")
    ap.add_argument("--gpu-delay", type=float, default=1.0, help="seconds per GPU call")
    ap.add_argument(
        "--only", default="", help="comma-separated run names (gpu-only,cpu-only,auto,calm)"
    )
    args = ap.parse_args()
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=1,
        include_dashboard=False,
        runtime_env={"env_vars": WORKER_ENV},
        logging_level="ERROR",
    )
    plan = [
        ("gpu-only", "gpu-only", 0, False),
        ("cpu-only", "cpu-only", 0, False),
        ("auto", "auto", 0, False),
        ("auto, 1 batch in flight (no saturation)", "auto", 1, True),
    ]
    only = set(filter(None, args.only.split(",")))
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        saturated = corpus(Path(tmp), "saturated", args.repeat, args.docs)
        calm = corpus(Path(tmp), "calm", 1, args.calm_docs)
        for name, spill, in_flight, is_calm in plan:
            if only and (("calm" if is_calm else name) not in only):
                continue
            run_id = f"b-{spill}-{in_flight}"
            cfg = config(run_id, spill, args.gpu_delay, in_flight)
            inp = calm if is_calm else saturated
            runs.append(measure(name, cfg, inp, Path(tmp) / f"out-{run_id}"))
            print(f"{name}: {runs[-1].rate:.2f} docs/s", file=sys.stderr, flush=True)
    ray.shutdown()
    if {r.name for r in runs} >= set(SATURATED):
        report(runs, args, (args.docs * args.repeat, args.calm_docs))
    else:
        for r in runs:
            print(r.name, f"{r.rate:.2f} docs/s", r.summary.backends, r.replicas, r.cpu_s)


if __name__ == "__main__":
    main()
