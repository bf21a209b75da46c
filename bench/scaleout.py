"""Scale-out simulation: 1, 2, 4, 8 stand-in GPU nodes with a modelled GPU service time.

Each size N gets a fresh local multi-node Ray cluster (``ray.cluster_utils.Cluster``,
bench/simcluster.py): a head node with 0 CPUs (GCS, the driver), N stand-in **GPU nodes**
(1 logical GPU and 0 CPUs each; node i pinned to core i mod 2, so the host work of the
GPU replicas is spread over both cores) and one **CPU node** for the read/write tasks
(1 CPU, pinned to core 1). Every stage gets ``gpu_replicas = N`` (the
default fractions, 0.25 + 0.5 + 0.25, fill the N GPUs exactly), ``spill = "gpu-only"``,
one batch size throughout.

The GPU service time is **modelled**, so this machine's two cores are not the limit:
with ``[faults] gpu_model_s_per_sentence`` > 0 the GPU replicas of embed and classify are
``ModelledStage`` (pipeline/stages/faults.py): no model is loaded, a call sleeps
``sentences x s_per_sentence`` and returns placeholder columns of the real types
(backend ``gpu-model``). The sentencizer's GPU replicas run the real rule-based spaCy.
The modelled rate is deliberately slow next to a real GPU (see ``--s-per-sentence``):
what is measured is whether the driver, the dispatcher and Ray keep N replicas busy, and
what the driver spends per batch, not how fast MiniLM runs.

Weak scaling: the corpus holds ``--per-gpu-batches`` x N batches, so each replica serves
the same number of batches at every N and pipeline fill/drain costs the same share of
every run. Scaling efficiency = throughput_N / (N x throughput_1). Throughput is over the
manifest's processing seconds (after Ray start and actor start). The driver's CPU time
per batch is psutil's user + system time of the driver process over processing, divided
by the batches. Memory: RSS summed over the driver's whole process tree (every Ray daemon
and worker of the simulated cluster) when processing ends, with the number of stage actor
processes and how many of them map torch or TensorFlow libraries.

Run from the repository root (about 10 minutes with the defaults):

    .venv/bin/python bench/scaleout.py --sizes 1,2,4,8
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import ray

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402
    cpu_seconds,
    load_average,
    machine_lines,
    repeated_demo,
    tree_cpu_s,
    tree_rss_mb,
)
from bench.simcluster import SimCluster, affinity, warm_io_workers  # noqa: E402
from docintel.actors.cluster import actor_name  # noqa: E402 - after the sys.path line
from docintel.actors.runner import execute  # noqa: E402
from docintel.pipeline.config import Config, load_config  # noqa: E402
from docintel.pipeline.input.source import MAX_BATCH_DOCS  # noqa: E402
from docintel.pipeline.output.protocol import RunSummary  # noqa: E402

STAGES = ("sentencize", "embed", "classify")
CORES = (0, 1)  # stand-in GPU node i runs on core CORES[i % 2]
IO_CORE = 1
DEMO_DOCS = 528
# The I/O node declares one CPU (one core); each read/write task holds a quarter of it, so
# four run at once (a read or write of a batch here takes tens of milliseconds).
IO_CPUS = 0.25
IO_SLOTS = 4
# Share of batch completions left out at each end for the steady-state rate.
STEADY_CUT = 0.1
FRAMEWORK_LIBS = {"torch": "libtorch_cpu", "tensorflow": "libtensorflow_framework"}


def corpus(folder: Path, batches: int, batch: int, short: bool = False) -> Path:
    """``batches`` x ``batch`` documents of the demo corpus (repeated, unique ids), or of
    one-sentence news lines (``short``: bench/driver_cost.py's corpus)."""
    docs = batches * batch
    if short:
        from bench.driver_cost import corpus as short_corpus

        return short_corpus(folder, docs, "short")
    table = repeated_demo(-(-docs // DEMO_DOCS)).slice(0, docs)
    path = folder / f"corpus-{batches}.parquet"
    # no dictionary: the footers' sizes are then the texts' (an "auto" batch size is cut
    # from them; repeated texts would look smaller dictionary-encoded)
    pq.write_table(table, path, row_group_size=batch, use_dictionary=False)
    return path


def docs_per_batch(args: argparse.Namespace) -> int:
    """Documents per batch: ``--batch``, or for ``auto`` what the plan cuts from
    ``--batch-bytes`` of the demo corpus's text (one batch per row group)."""
    if args.batch != "auto":
        return int(args.batch)
    if args.short_docs:
        from bench.driver_cost import SENTENCES as texts
    else:
        texts = repeated_demo(1).column("text").to_pylist()
    mean = sum(len(t.encode()) + 4 for t in texts) / len(texts)  # + the number in each
    return min(MAX_BATCH_DOCS, max(1, int(args.batch_bytes / mean)))


def config(run_id: str, n: int, args: argparse.Namespace) -> Config:
    o: dict[str, Any] = {
        "run.run_id": run_id,
        "run.spill": "gpu-only",
        "run.batch_size": args.batch if args.batch == "auto" else int(args.batch),
        "run.gpu_batch_bytes": args.batch_bytes,
        # the sentencizer's GPU replicas modelled too (rule-based spaCy's CPU cost off the
        # two cores; each document is one sentence there)
        "faults.gpu_model_rule_based": args.model_sentencize,
        "run.show_progress": False,
        "run.embeddings": False,
        "run.part_target_mb": 0,  # no end-of-run merge: nothing to measure there
        "faults.gpu_model_s_per_sentence": args.s_per_sentence,
        "resources.io_cpus": IO_CPUS,
    }
    for stage in STAGES:
        o[f"resources.{stage}.gpu_replicas"] = n  # explicit (not "auto")
        o[f"resources.{stage}.gpu_cpus"] = 0.0  # GPU nodes declare no CPUs
    return load_config(None, o)


def frameworks(pid: int) -> set[str]:
    """Which of torch / TensorFlow the process has loaded (its memory maps)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return {name for name, lib in FRAMEWORK_LIBS.items() if lib in maps}


def steady_rate(finished: list[tuple[float, int]]) -> float:
    """Documents per second between the completions of the batches at STEADY_CUT and at
    1 - STEADY_CUT of the run (pipeline fill and drain left out)."""
    k = int(len(finished) * STEADY_CUT)
    m = len(finished) - 1 - k
    if m <= k:
        return 0.0
    docs = sum(d for _, d in finished[k + 1 : m + 1])
    return docs / (finished[m][0] - finished[k][0])


class _DispatchLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.replicas: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.replicas = record.__dict__.get("replicas", [])


@dataclass
class Result:
    n: int
    summary: RunSummary
    driver_cpu_s: float
    node_cpu_s: dict[str, float]  # "gpu nodes", "cpu node", "head" over processing
    rss_mb: float
    processes: int
    actors: int
    with_framework: dict[str, int]  # framework -> actor processes that loaded it
    placement: dict[str, dict[str, int]]  # node role -> stage -> replicas
    replicas: list[dict[str, Any]]
    load: str
    steady: float  # documents/s between the first and last STEADY_CUT of batch completions
    first_batch_s: float  # from processing start to the first batch written

    @property
    def rate(self) -> float:
        return self.summary.documents / self.summary.processing_seconds

    @property
    def sent_rate(self) -> float:
        return self.summary.sentences / self.summary.processing_seconds

    def busy(self, stage: str) -> float:
        """Mean share of processing time the stage's replicas were busy (driver-measured)."""
        reps = [r for r in self.replicas if r["replica"].startswith(f"{stage}/")]
        total = self.summary.processing_seconds * len(reps)
        return sum(r["busy_s"] for r in reps) / total if total else 0.0


def run_size(n: int, args: argparse.Namespace, folder: Path) -> Result:
    sim = SimCluster.start()
    for i in range(n):
        sim.add(f"gpu{i}", {CORES[i % len(CORES)]}, num_cpus=0, num_gpus=1)
    sim.add("cpu", {IO_CORE}, num_cpus=1, num_gpus=0)
    sim.connect()
    try:
        warm_io_workers(IO_CPUS, IO_SLOTS)
        return _measure(sim, n, args, folder)
    finally:
        sim.shutdown()


def _measure(sim: SimCluster, n: int, args: argparse.Namespace, folder: Path) -> Result:
    batches = args.per_gpu_batches * n
    inp = corpus(folder, batches, docs_per_batch(args), args.short_docs)
    run_id = f"scale{n}"
    cfg = config(run_id, n, args)
    driver = psutil.Process()
    marks: dict[str, Any] = {"done": 0}
    placement: dict[str, dict[str, int]] = {}
    with_framework: dict[str, int] = dict.fromkeys(FRAMEWORK_LIBS, 0)
    actor_pids: list[int] = []
    finished: list[tuple[float, int]] = []  # (when, documents) per batch, in order

    def node_cpu() -> dict[str, float]:
        gpu = sum(tree_cpu_s(x.raylet_pid) for x in sim.nodes if x.role.startswith("gpu"))
        cpu = sum(tree_cpu_s(x.raylet_pid) for x in sim.nodes if x.role == "cpu")
        return {"gpu nodes": gpu, "cpu node": cpu, "driver": cpu_seconds(driver)}

    def on_start(_total: int, _done: int) -> None:
        for stage in STAGES:
            for i in range(n):
                handle = ray.get_actor(actor_name(run_id, f"{stage}/gpu/{i}"))
                pid = ray.get(handle.ready.remote())["pid"]
                actor_pids.append(pid)
                role = sim.role_of(pid)
                if not role.startswith("gpu") or affinity(pid) != sorted(sim.by_role(role).cores):
                    raise RuntimeError(f"{stage}/gpu/{i} is on {role} cores {affinity(pid)}")
                where = f"{role} (core {','.join(map(str, affinity(pid)))})"
                placement.setdefault(where, {}).setdefault(stage, 0)
                placement[where][stage] += 1
                for name in frameworks(pid):
                    with_framework[name] += 1
        marks["t0"], marks["cpu0"] = time.perf_counter(), node_cpu()

    def on_batch(stats: Any) -> None:
        marks["done"] += 1
        finished.append((time.perf_counter(), stats.documents))
        if marks["done"] == batches:  # the end of processing: take the readings once
            marks["cpu1"] = node_cpu()
            marks["rss"] = tree_rss_mb([os.getpid()])

    log = logging.getLogger("docintel.actors.executor")
    handler = _DispatchLog()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        summary = execute(cfg, str(inp), str(folder / f"out-{n}"), on_start, on_batch)
    finally:
        log.removeHandler(handler)
    # "auto" batches: the plan's batch count may differ from the corpus's row groups; the
    # readings are then taken here, after the commit
    c0, c1 = marks["cpu0"], marks.get("cpu1") or node_cpu()
    used = {k: c1[k] - c0[k] for k in c0}
    rss, procs = marks.get("rss") or tree_rss_mb([os.getpid()])
    return Result(
        n, summary, used.pop("driver"), used, rss, procs, len(actor_pids), with_framework,
        placement, handler.replicas, load_average(), steady_rate(finished),
        finished[0][0] - marks["t0"],
    )  # fmt: skip


def report(results: list[Result], args: argparse.Namespace) -> None:
    base = next((r for r in results if r.n == 1), None)
    print(
        f"# Scale-out: N stand-in GPU nodes, modelled GPU time "
        f"{args.s_per_sentence * 1000:g} ms per sentence, batches of "
        f"{docs_per_batch(args)} documents ({args.batch}), "
        f"{args.per_gpu_batches} batches per GPU\n"
    )
    for line in machine_lines():
        print(f"- {line}")
    print(
        "\n| N | docs | sentences | processing s | first batch s | docs/s | sentences/s | "
        "efficiency | steady docs/s | steady efficiency | embed busy | driver CPU ms/batch | "
        "CPU-s GPU nodes / I/O node | RSS GiB (procs) | actors (torch / TF) | load avg after |"
    )
    print("| ---: " * 12 + "| --- " * 4 + "|")
    for r in results:
        s = r.summary
        eff = f"{r.rate / (r.n * base.rate):.2f}" if base else "—"
        steady = f"{r.steady / (r.n * base.steady):.2f}" if base and base.steady else "—"
        per_batch = 1000 * r.driver_cpu_s / s.batches
        c = r.node_cpu_s
        print(
            f"| {r.n} | {s.documents} | {s.sentences} | {s.processing_seconds:.1f} | "
            f"{r.first_batch_s:.1f} | {r.rate:.1f} | {r.sent_rate:.1f} | {eff} | "
            f"{r.steady:.1f} | {steady} | {r.busy('embed'):.0%} | "
            f"{per_batch:.1f} | {c['gpu nodes']:.1f} / {c['cpu node']:.1f} | "
            f"{r.rss_mb / 1024:.1f} ({r.processes}) | {r.actors} "
            f"({r.with_framework['torch']} / {r.with_framework['tensorflow']}) | {r.load} |"
        )
    print("\nBackends and placement (replicas per stand-in node, verified from the processes):\n")
    for r in results:
        backends = {st: dict(b) for st, b in r.summary.backends.items()}
        spread = "; ".join(
            f"{role}: " + ", ".join(f"{st} {k}" for st, k in sorted(per.items()))
            for role, per in sorted(r.placement.items())
        )
        print(f"- N={r.n}: {backends}; {spread}")
    print(
        "\nPer stage, as the driver's dispatcher measured it (summed over the stage's N "
        "replicas): calls, mean service s per call, busy share of processing time, seconds "
        "calls waited in replica queues.\n"
    )
    print("| N | stage | calls | service s | busy | queued s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for r in results:
        for stage in STAGES:
            reps = [x for x in r.replicas if x["replica"].startswith(f"{stage}/")]
            calls = sum(x["calls"] for x in reps)
            busy = sum(x["busy_s"] for x in reps)
            queued = sum(x["queued_s"] for x in reps)
            per = busy / calls if calls else 0.0
            print(f"| {r.n} | {stage} | {calls} | {per:.3f} | {r.busy(stage):.0%} | {queued:.1f} |")
    print(f"\ncommand: {' '.join(sys.argv)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,2,4,8", help="stand-in GPU node counts")
    ap.add_argument("--batch", default="32", help='documents per batch, or "auto"')
    ap.add_argument(
        "--batch-bytes", type=int, default=1 << 20, help="text per batch with --batch auto"
    )
    ap.add_argument(
        "--short-docs",
        action="store_true",
        help="one-sentence documents (exact with --model-sentencize) instead of the demo's",
    )
    ap.add_argument(
        "--model-sentencize",
        action="store_true",
        help="model the sentencizer's GPU replicas too ([faults] gpu_model_rule_based)",
    )
    ap.add_argument("--per-gpu-batches", type=int, default=24, help="batches per GPU node")
    ap.add_argument(
        "--s-per-sentence",
        type=float,
        default=0.012,
        help="modelled GPU seconds per sentence, embed and classify each",
    )
    args = ap.parse_args()
    if not set(CORES) <= os.sched_getaffinity(0):
        sys.exit(f"needs cores {list(CORES)} in this process's affinity")
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            results.append(run_size(n, args, Path(tmp)))
            r = results[-1]
            print(
                f"N={n}: {r.rate:.1f} docs/s, driver {r.driver_cpu_s:.1f} CPU-s, "
                f"rss {r.rss_mb / 1024:.1f} GiB, load {r.load}",
                file=sys.stderr,
                flush=True,
            )
    report(results, args)


if __name__ == "__main__":
    main()
