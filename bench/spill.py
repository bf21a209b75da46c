"""Spill benchmark on disjoint (simulated) hardware: auto vs gpu-only vs cpu-only.

**Simulation chosen.** A local multi-node Ray cluster (``ray.cluster_utils.Cluster``)
whose nodes stand for separate machines, each pinned to its own core
(bench/simcluster.py sets the driver's CPU affinity just before ``add_node``, so the
node's raylet and every worker it forks inherit it):

* head node: 0 CPUs, 0 GPUs (GCS and the driver; nothing is scheduled there);
* stand-in **GPU node, core 0**: 1 logical GPU, **0 CPUs**. GPU-pool replicas need a GPU
  fraction and 0 CPUs (``gpu_cpus = 0``), so they can only land here, and nothing else can;
* **CPU node, core 1**: 1 CPU, no GPU. The CPU pools (int8 encoder and int8 classifier in
  every mode, so cpu-only measures the same replicas auto spills to) and the read/write
  tasks need CPUs, which only this node declares.

Why: the old single-node benchmark gave auto = 0.49-0.60 x (gpu-only + cpu-only) because
its ``gpu-sim`` replicas ran the fp32 encoder on the same two cores the CPU pool used, so
the two "pools" were one resource counted twice (bench/spill.md). Here each pool has a
core of its own, as a GPU host and a CPU host would, so adding the two pools' rates is a
fair bar. A GPU replica is still ``gpu-sim``: it sleeps ``--gpu-delay`` s per call
(``[faults] gpu_delay_s``, so the GPU pool saturates) and then runs its fp32 model on core
0 (its "device"). The driver and the head's processes float on both cores; their CPU time
is reported. With ``--gpu-model S`` the GPU replicas of embed and classify compute nothing
and sleep ``S`` s per sentence after the delay (``[faults] gpu_model_s_per_sentence``,
rows say ``gpu-model``): core 0 then stays free for the driver and the head, which
otherwise take part of the CPU node's core whenever the stand-in GPU computes.

Runs: gpu-only, cpu-only and auto on the same corpus (saturated: 2 x the slots admitted),
``--rounds`` times, in that order; then auto with one batch in flight (no saturation),
which must send nothing to the CPU pool. Throughput is documents per second of processing
(the manifest's ``processing_seconds``: after Ray start and model loads); every run reads
the same documents, so the ratio is the same in sentences/s (both are printed). On a
shared machine other people's load slows whichever of our cores it lands on, and the
runs do not see the same load: ``--quiet-below L`` waits (up to ``--quiet-wait`` s)
before each run until the 1-minute load average is under L, and every row shows the
load average before and after it.

Placement is verified and printed: each replica's node (the raylet that forked its
process) and CPU affinity, and the titles of the worker processes sampled on each node
while the runs went (``_read`` and ``write_batch`` are the I/O tasks). The dispatcher's
per-replica calls, busy and queued seconds (``docintel.actors.executor``'s end-of-run log
record) and each replica process's CPU seconds explain the result, with, per round, the
embed replicas' call times in auto against alone and the seconds auto spent beyond what
those call times allow (fill, drain, idle gaps).

On a real GPU machine the same script runs real GPU replicas (bench/gpu_check.sh), e.g.
``--gpu-cores 0-3 --cpu-cores 4-15 --gpu-delay 0 --batch 32``.

Run from the repository root (about 15 minutes with these settings, more while waiting
for a quiet machine):

    .venv/bin/python bench/spill.py --repeat 2 --rounds 2 --gpu-delay 1.0 --quiet-below 3
"""

from __future__ import annotations

import argparse
import logging
import os
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

from bench.common import cpu_seconds, load_average, machine_lines, tree_cpu_s  # noqa: E402
from bench.simcluster import NodeWatch, SimCluster, affinity, warm_io_workers  # noqa: E402
from docintel.actors.cluster import actor_name  # noqa: E402 - after the sys.path line
from docintel.actors.runner import execute  # noqa: E402
from docintel.pipeline.config import Config, load_config  # noqa: E402
from docintel.pipeline.output.protocol import RunSummary  # noqa: E402

DEMO = REPO / "data" / "demo" / "documents.parquet"
BATCH = 8  # documents per batch (default): many batches, so routing decisions dominate
STAGES = ("sentencize", "embed", "classify")
POOLS = {"auto": ("gpu", "cpu"), "gpu-only": ("gpu",), "cpu-only": ("cpu",)}
SATURATED = ("gpu-only", "cpu-only", "auto")  # the runs the bar compares, in that order
BAR = 0.9
GPU_CORES = "0"  # default cores of the stand-in GPU node and of the CPU node
CPU_CORES = "1"
# The CPU node declares one CPU (it has one core). Its replicas hold 0.2 + 0.4 + 0.2 and
# two read/write tasks 0.1 each fit beside them; the GPU node declares none.
CPU_NODE_CPUS = 1
CPU_POOL_CPUS = {"sentencize": 0.2, "embed": 0.4, "classify": 0.2}
IO_CPUS = 0.1
IO_SLOTS = 2  # read/write tasks that fit at once: (1 - 0.8) / 0.1
QUIET_POLL_S = 5.0


def cores(spec: str) -> set[int]:
    """``"0"``, ``"0-3"`` or ``"0,2,4-7"`` as a set of core numbers."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def corpus(folder: Path, name: str, repeat: int, docs: int, batch: int) -> Path:
    t = pq.read_table(DEMO).slice(0, docs)
    parts = [
        t.set_column(0, "doc_id", pa.array([f"r{k}-{i}" for i in t["doc_id"].to_pylist()]))
        for k in range(repeat)
    ]
    path = folder / f"{name}.parquet"
    pq.write_table(pa.concat_tables(parts), path, row_group_size=batch)
    return path


def config(
    run_id: str,
    spill: str,
    delay: float,
    batch: int,
    in_flight: int = 0,
    model_s_per_sentence: float = 0.0,
) -> Config:
    o: dict[str, Any] = {
        "run.run_id": run_id,
        "run.spill": spill,
        "run.batch_size": batch,
        "run.show_progress": False,
        "run.embeddings": False,
        "run.part_target_mb": 0,  # no end-of-run merge: nothing to measure there
        "run.max_batches_in_flight": in_flight,
        "faults.gpu_delay_s": delay,
        # --gpu-model: the GPU replicas of embed and classify sleep a modelled service time
        # instead of computing fp32 on core 0 (gpu-model rows)
        "faults.gpu_model_s_per_sentence": model_s_per_sentence,
        # the CPU pool runs the int8 models in every mode, so cpu-only measures the same
        # CPU replicas that auto spills to
        "embed.cpu_precision": "int8",
        "resources.io_cpus": IO_CPUS,
    }
    for stage in STAGES:
        o[f"resources.{stage}.cpus"] = CPU_POOL_CPUS[stage]
        o[f"resources.{stage}.replicas"] = 1  # one of each, whatever the cores (not "auto")
        o[f"resources.{stage}.gpu_replicas"] = 1
        o[f"resources.{stage}.gpu_cpus"] = 0.0  # so GPU replicas fit on the 0-CPU GPU node
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
    round: int
    summary: RunSummary
    replicas: list[dict[str, Any]]
    held_s: dict[str, float]
    cpu_s: dict[str, float]  # replica key -> CPU seconds its process used while processing
    placed: dict[str, tuple[str, list[int], int]]  # replica key -> (node, affinity, pid)
    node_cpu_s: dict[str, float]  # node role (and "driver") -> CPU seconds while processing
    span_s: float  # first to last on_batch sample
    load: str
    load_before: str
    # seconds from the last batch embedded by a CPU replica to the end of processing (the
    # drain: only batches the GPU replica had taken were left)
    gpu_tail_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.summary.documents / self.summary.processing_seconds

    @property
    def sent_rate(self) -> float:
        return self.summary.sentences / self.summary.processing_seconds


def wait_for_quiet(below: float, patience_s: float) -> None:
    """On a shared machine: wait (up to ``patience_s``) until the 1-minute load average is
    under ``below``, so a run does not start inside someone else's burst."""
    deadline = time.monotonic() + patience_s
    while below and os.getloadavg()[0] >= below and time.monotonic() < deadline:
        time.sleep(QUIET_POLL_S)


def measure(sim: SimCluster, name: str, rnd: int, cfg: Config, inp: Path, out: Path) -> Run:
    """One ``execute`` with each replica's and each node's CPU time sampled."""
    run_id, spill = cfg.run.run_id, cfg.run.spill
    procs: dict[str, tuple[psutil.Process, float]] = {}
    placed: dict[str, tuple[str, list[int], int]] = {}
    last: dict[str, float] = {}
    marks: dict[str, Any] = {"load0": load_average()}
    finished: list[tuple[float, str]] = []  # (when, embed backend) per batch
    driver = psutil.Process()

    def node_cpu() -> dict[str, float]:
        got = {n.role: tree_cpu_s(n.raylet_pid) for n in sim.nodes if n.role != "head"}
        got["driver"] = cpu_seconds(driver)
        return got

    def on_start(_total: int, _done: int) -> None:
        for stage in STAGES:
            for kind in POOLS[spill]:
                key = f"{stage}/{kind}/0"
                pid = ray.get(ray.get_actor(actor_name(run_id, key)).ready.remote())["pid"]
                proc = psutil.Process(pid)
                procs[key] = (proc, cpu_seconds(proc))
                placed[key] = (sim.role_of(pid), affinity(pid), pid)
        marks["t0"], marks["nodes0"] = time.perf_counter(), node_cpu()

    def on_batch(stats: Any) -> None:  # the last call is at the end of processing
        finished.append((time.perf_counter(), stats.backends.get("embed", "")))
        for key, (proc, _) in procs.items():
            try:
                last[key] = cpu_seconds(proc)
            except psutil.Error:  # a restarted actor: keep its last reading
                continue
        marks["t1"], marks["nodes1"] = time.perf_counter(), node_cpu()

    log = logging.getLogger("docintel.actors.executor")
    handler = _DispatchLog()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        summary = execute(cfg, str(inp), str(out), on_start=on_start, on_batch=on_batch)
    finally:
        log.removeHandler(handler)
    cpu_s = {k: last.get(k, start) - start for k, (_, start) in procs.items()}
    n0, n1 = marks["nodes0"], marks["nodes1"]
    node_cpu_s = {k: n1.get(k, 0.0) - n0.get(k, 0.0) for k in n0}
    span = marks["t1"] - marks["t0"]
    cpu_done = [t for t, embed in finished if embed.startswith("cpu-")]
    tail = finished[-1][0] - max(cpu_done) if cpu_done else 0.0
    return Run(
        name, rnd, summary, handler.replicas, handler.held_s, cpu_s, placed, node_cpu_s,
        span, load_average(), marks["load0"], tail,
    )  # fmt: skip


def _round(runs: list[Run], rnd: int) -> dict[str, Run] | None:
    """The saturated runs of round ``rnd``; gpu-only from the latest round up to it that
    measured it (``--gpu-rounds``). None while one is missing."""
    by = {r.name: r for r in runs if r.round == rnd}
    gpu = [r for r in runs if r.name == "gpu-only" and r.round <= rnd]
    if gpu:
        by["gpu-only"] = gpu[-1]
    return by if all(n in by for n in SATURATED) else None


def _saturated(runs: list[Run], rnd: int) -> tuple[float, float, float] | None:
    by = _round(runs, rnd)
    if by is None:
        return None
    gpu, cpu, auto = (by[n] for n in SATURATED)
    return gpu.rate, cpu.rate, auto.rate


def _runs_table(runs: list[Run]) -> None:
    print(
        "| round | run | docs | sentences | processing s | docs/s | sentences/s | "
        "embed batches by backend | GPU-only tail s | cores used: gpu node / cpu node / "
        "driver | load avg before / after |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | --- |")
    for r in runs:
        s = r.summary
        shown = ", ".join(f"{b}: {n}" for b, n in sorted(s.backends["embed"].items()))
        share = {k: v / s.processing_seconds for k, v in r.node_cpu_s.items()}
        print(
            f"| {r.round} | {r.name} | {s.documents} | {s.sentences} | "
            f"{s.processing_seconds:.1f} | {r.rate:.2f} | {r.sent_rate:.1f} | {shown} | "
            f"{r.gpu_tail_s:.1f} | {share.get('gpu', 0):.2f} / {share.get('cpu', 0):.2f} / "
            f"{share.get('driver', 0):.2f} | {r.load_before} / {r.load} |"
        )
    print()
    rounds = sorted({r.round for r in runs})
    for rnd in rounds:
        rates = _saturated(runs, rnd)
        if rates is None:
            continue
        gpu, cpu, auto = rates
        ratio = auto / (gpu + cpu)
        verdict = "met" if ratio >= BAR else "NOT met"
        print(
            f"- round {rnd}: auto / (gpu-only + cpu-only) = {auto:.2f} / ({gpu:.2f} + "
            f"{cpu:.2f}) = **{ratio:.2f}** docs/s (bar >= {BAR}: {verdict})"
        )
    ratios = sorted(a / (g + c) for g, c, a in filter(None, (_saturated(runs, n) for n in rounds)))
    if len(ratios) > 1:
        mid = len(ratios) // 2
        median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
        print(f"- median over {len(ratios)} rounds: **{median:.2f}**")
    _embed_service_lines(runs)
    for r in runs:
        if r.name.startswith("auto, 1 batch"):
            spilled = {st: r.summary.backends[st].get("cpu-int8", 0) for st in STAGES}
            spilled["sentencize"] = r.summary.backends["sentencize"].get("cpu-fp32", 0)
            print(f"- no saturation: batches sent to the CPU pool per stage: {spilled}")


def _embed_mean(r: Run, pool: str) -> tuple[float, float] | None:
    """Mean wall seconds and CPU seconds per call of the run's embed replica of ``pool``."""
    rep = next((x for x in r.replicas if x["replica"] == f"embed/{pool}/0"), None)
    if rep is None or not rep["calls"]:
        return None
    return rep["busy_s"] / rep["calls"], r.cpu_s.get(f"embed/{pool}/0", 0.0) / rep["calls"]


def _embed_service_lines(runs: list[Run]) -> None:
    """Why auto falls short of the sum, per round: the embed replicas (the bottleneck stage)
    in auto against the same replicas running alone, and what was left for fill/drain."""
    for rnd in sorted({r.round for r in runs}):
        by = _round(runs, rnd)
        if by is None:
            continue
        auto = by["auto"]
        alone = {
            "gpu": _embed_mean(by["gpu-only"], "gpu"),
            "cpu": _embed_mean(by["cpu-only"], "cpu"),
        }
        inrun = {pool: _embed_mean(auto, pool) for pool in ("gpu", "cpu")}
        parts, capacity = [], 0.0
        for pool in ("cpu", "gpu"):
            a, b = alone[pool], inrun[pool]
            if a is None or b is None:
                continue
            capacity += 1 / b[0]
            parts.append(
                f"{pool} {b[0]:.2f} s/call in auto vs {a[0]:.2f} alone "
                f"(CPU {b[1]:.2f} vs {a[1]:.2f} s/call)"
            )
        batches = sum(auto.summary.backends["embed"].values())
        ideal = batches / capacity if capacity else 0.0
        print(
            f"- round {rnd}, embed replicas: {'; '.join(parts)}. At the in-run call times the "
            f"two replicas embed {batches} batches in {ideal:.1f} s; auto took "
            f"{auto.summary.processing_seconds:.1f} s (fill, drain, idle gaps: "
            f"{auto.summary.processing_seconds - ideal:.1f} s, of which the GPU-only tail "
            f"{auto.gpu_tail_s:.1f} s)"
        )


def _placement_tables(runs: list[Run], watch: NodeWatch) -> None:
    print("\nPlacement, verified (node = the raylet that forked the actor's process):\n")
    print("| run | replica | node | pid | CPU affinity |")
    print("| --- | --- | --- | ---: | --- |")
    first: dict[tuple[str, str], tuple[str, list[int], int]] = {}
    for r in runs:
        for key, where in r.placed.items():
            first.setdefault((r.name, key), where)
    for (name, key), (node, aff, pid) in first.items():
        print(f"| {name} | {key} | {node} | {pid} | {aff} |")
    print("\nWorker processes sampled on each node during the runs (title: samples):\n")
    for line in watch.lines():
        print(f"- {line}")


def _replica_table(runs: list[Run]) -> None:
    print(
        "\nPer replica: calls; busy and queued seconds as the driver measured them; the "
        "service-time estimate at the end; CPU seconds of the replica's process.\n"
    )
    print("| round | run | replica | calls | busy s | queued s | service s | CPU s | CPU s/call |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        for rep in r.replicas:
            key, calls = rep["replica"], rep["calls"]
            cpu_s = r.cpu_s.get(key, 0.0)
            per = f"{cpu_s / calls:.3f}" if calls else "—"
            est = "—" if rep["service_s"] is None else f"{rep['service_s']:.3f}"
            print(
                f"| {r.round} | {r.name} | {key} | {calls} | {rep['busy_s']:.1f} | "
                f"{rep['queued_s']:.1f} | {est} | {cpu_s:.1f} | {per} |"
            )
    print("\nSeconds batches waited on the driver for a replica slot, per stage:\n")
    for r in runs:
        held = ", ".join(f"{st} {v:.1f}" for st, v in r.held_s.items())
        print(f"- round {r.round}, {r.name}: {held}")


def report(sim: SimCluster, watch: NodeWatch, runs: list[Run], args: argparse.Namespace) -> None:
    print(
        f"# Spill on disjoint simulated hardware: batches of {args.batch} documents, GPU replicas "
        f"delayed {args.gpu_delay:g} s per call"
        + (
            f", embed and classify modelled at {args.gpu_model:g} s per sentence (gpu-model)"
            if args.gpu_model
            else ""
        )
        + "\n"
    )
    for line in machine_lines():
        print(f"- {line}")
    print(
        f"- saturated runs: {args.docs * args.repeat} documents; no-saturation run: "
        f"{args.calm_docs} documents"
    )
    print("- nodes:")
    for line in sim.node_lines():
        print(f"  - {line}")
    print(
        "- columns: GPU-only tail = seconds from the last batch embedded on the CPU pool to "
        "the end; cores used = CPU seconds of each node's processes (raylet and everything it "
        "started) and of the driver, per second of processing\n"
    )
    _runs_table(runs)
    _placement_tables(runs, watch)
    _replica_table(runs)
    print(f"\ncommand: {' '.join(sys.argv)}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2, help="copies of the demo documents")
    ap.add_argument("--docs", type=int, default=528, help="demo documents per copy")
    ap.add_argument("--calm-docs", type=int, default=80, help="documents of the no-saturation run")
    ap.add_argument("--gpu-delay", type=float, default=1.0, help="seconds per GPU call")
    ap.add_argument(
        "--gpu-model",
        type=float,
        default=0.0,
        help="seconds per sentence that the GPU replicas of embed and classify sleep "
        "instead of computing (0 = they compute fp32 on the GPU node's core, gpu-sim)",
    )
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the three saturated runs")
    ap.add_argument(
        "--gpu-rounds",
        type=int,
        default=1_000,
        help="measure gpu-only in the first N rounds only (later rounds reuse the latest)",
    )
    ap.add_argument("--batch", type=int, default=BATCH, help="documents per batch")
    ap.add_argument(
        "--quiet-below",
        type=float,
        default=0.0,
        help="before each run, wait until the 1-minute load average is below this (0 = no)",
    )
    ap.add_argument("--quiet-wait", type=float, default=300.0, help="longest wait, seconds")
    ap.add_argument("--gpu-cores", default=GPU_CORES, help="cores of the stand-in GPU node")
    ap.add_argument("--cpu-cores", default=CPU_CORES, help="cores of the CPU node")
    ap.add_argument(
        "--only", default="", help="comma-separated run names (gpu-only,cpu-only,auto,calm)"
    )
    return ap.parse_args()


def run_plan(args: argparse.Namespace) -> list[tuple[int, str, str, int, bool]]:
    """(round, name, spill, batches in flight, calm) of every run, in order: the saturated
    runs each round (gpu-only in the first --gpu-rounds only), then the calm one."""
    plan = [
        (rnd, name, name, 0, False)
        for rnd in range(1, args.rounds + 1)
        for name in SATURATED
        if name != "gpu-only" or rnd <= args.gpu_rounds
    ]
    plan.append((1, "auto, 1 batch in flight (no saturation)", "auto", 1, True))
    return plan


def run_all(sim: SimCluster, args: argparse.Namespace, runs: list[Run]) -> None:
    """Every run of the plan (or of --only), each appended to ``runs`` when measured."""
    only = set(filter(None, args.only.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        saturated = corpus(Path(tmp), "saturated", args.repeat, args.docs, args.batch)
        calm = corpus(Path(tmp), "calm", 1, args.calm_docs, args.batch)
        for rnd, name, spill, in_flight, is_calm in run_plan(args):
            if only and (("calm" if is_calm else name) not in only):
                continue
            run_id = f"b{rnd}-{spill}-{in_flight}"
            cfg = config(run_id, spill, args.gpu_delay, args.batch, in_flight, args.gpu_model)
            wait_for_quiet(args.quiet_below, args.quiet_wait)
            inp = calm if is_calm else saturated
            runs.append(measure(sim, name, rnd, cfg, inp, Path(tmp) / f"out-{run_id}"))
            r = runs[-1]
            print(
                f"round {rnd} {name}: {r.rate:.2f} docs/s, {r.summary.backends['embed']}, "
                f"load {r.load}",
                file=sys.stderr,
                flush=True,
            )


def main() -> None:
    args = parse_args()
    gpu_cores, cpu_cores = cores(args.gpu_cores), cores(args.cpu_cores)
    if gpu_cores & cpu_cores or not (gpu_cores | cpu_cores) <= os.sched_getaffinity(0):
        sys.exit(f"--gpu-cores and --cpu-cores must be disjoint cores of {os.sched_getaffinity(0)}")
    sim = SimCluster.start()
    sim.add("gpu", gpu_cores, num_cpus=0, num_gpus=1)
    sim.add("cpu", cpu_cores, num_cpus=CPU_NODE_CPUS, num_gpus=0)
    sim.connect()
    warm_io_workers(IO_CPUS, IO_SLOTS)
    watch = NodeWatch(sim)
    watch.start()
    runs: list[Run] = []
    try:
        run_all(sim, args, runs)
    finally:
        watch.stop()
        report(sim, watch, runs, args)
        sim.shutdown()


if __name__ == "__main__":
    main()
