"""Helpers shared by the benchmarks: the demo corpus, process-tree sampling (RSS and CPU
seconds: the one sampler of the benchmarks), reporting.

Imported as ``common`` by scripts that run from the repository root with ``bench/`` on
``sys.path`` (``bench/pipeline_vs_loop.py``, ``bench/memory_scaling.py``), and as
``bench.common`` by those that put the repository root there (``bench/spill.py``,
``bench/simcluster.py``...).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
DEMO_CORPUS = REPO / "data" / "demo" / "documents.parquet"

ROW_GROUP_DOCS = 100  # as data/make_demo.py: several row groups, so several work units
SAMPLE_INTERVAL_S = 0.2  # RSS sampling period; short phases between samples are missed
LOG_TAIL_CHARS = 4000  # how much of a failed subprocess's log to show

MIB = 1024 * 1024
DOC_ID, TEXT = "doc_id", "text"

# /proc/<pid>/status fields that split a process's RSS (kB): private anonymous memory
# (heaps: what a process really grows), file-backed pages (libraries, mapped files) and
# shared memory (for Ray workers and the raylet: pages of the plasma object store).
STATUS_FIELDS = {"RssAnon:": "anon", "RssFile:": "file", "RssShmem:": "shmem"}


# --------------------------------------------------------------------------------------
# Measuring a process tree
# --------------------------------------------------------------------------------------


@dataclass
class ProcSample:
    """One process in one sample (bytes)."""

    pid: int
    label: str
    rss: int
    anon: int = 0
    file: int = 0
    shmem: int = 0
    cpu_s: float = 0.0  # user + system CPU seconds the process has used so far


@dataclass
class TreeSample:
    """All processes of the tree at one instant."""

    t: float  # seconds since the sampler started
    wall: float  # time.time() of the sample
    procs: list[ProcSample]

    @property
    def rss(self) -> int:
        return sum(p.rss for p in self.procs)


@dataclass
class TreePeak:
    """The largest summed RSS seen over a process and its descendants."""

    rss_bytes: int = 0
    processes_at_peak: int = 0
    # RSS by process name at the peak sample (same-named processes summed)
    by_name_at_peak: dict[str, int] = field(default_factory=dict)
    max_processes: int = 0
    samples: int = 0
    # with ``detail``: every process at the peak sample, and every sample
    at_peak: TreeSample | None = None
    timeline: list[TreeSample] = field(default_factory=list)
    # with ``cpu``: (pid, create time) -> the process's latest CPU seconds
    cpu_by_process: dict[tuple[int, float], float] = field(default_factory=dict)

    @property
    def cpu_s(self) -> float:
        """CPU seconds of every process sampled, each at its latest reading."""
        return sum(self.cpu_by_process.values())


def process_label(proc: psutil.Process, root_pid: int) -> str:
    """A readable role for a process of a ``docintel run`` tree.

    The root is the driver; Ray workers carry their title (``ray::EmbedActor``,
    ``ray::IDLE``, ``ray::_read``); Python daemons are named by their script; native
    daemons (raylet, gcs_server) by their executable.
    """
    if proc.pid == root_pid:
        return "driver"
    cmd = proc.cmdline()
    if cmd and cmd[0].startswith("ray::"):
        return cmd[0].split()[0]
    for arg in cmd[1:]:
        if arg.endswith(".py"):
            p = Path(arg)
            return f"{p.parent.name}/{p.name}" if p.stem in {"main", "agent"} else p.name
    return proc.name()


def _status_split(pid: int) -> dict[str, int]:
    """RssAnon / RssFile / RssShmem of ``pid`` in bytes (Linux; empty elsewhere)."""
    out: dict[str, int] = {}
    try:
        with Path(f"/proc/{pid}/status").open() as f:
            for line in f:
                key = STATUS_FIELDS.get(line.split(None, 1)[0]) if line.strip() else None
                if key:
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        return {}
    return out


def process_tree(pid: int, *, include_root: bool = True) -> list[psutil.Process]:
    """``pid`` and all its living descendants (without ``pid`` itself unless
    ``include_root``); empty when ``pid`` has exited. The one walk of a process tree the
    benchmarks use."""
    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
    except psutil.Error:
        return []
    return [root, *children] if include_root else children


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU seconds ``proc`` has used so far (psutil.Error once it is gone)."""
    t = proc.cpu_times()
    return t.user + t.system


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its living descendants, now."""
    total = 0.0
    for proc in process_tree(pid):
        try:
            total += cpu_seconds(proc)
        except psutil.Error:
            continue
    return total


def tree_rss_mb(pids: Iterable[int]) -> tuple[float, int]:
    """Summed RSS (MiB) and process count of the given processes and their descendants."""
    seen: dict[int, int] = {}
    for pid in pids:
        for proc in process_tree(pid):
            try:
                seen[proc.pid] = proc.memory_info().rss
            except psutil.Error:
                continue
    return sum(seen.values()) / MIB, len(seen)


class TreeSampler(threading.Thread):
    """Samples the summed RSS of ``pid`` and all its descendants every ``interval`` s.

    With ``cpu``, also reads each process's CPU seconds: ``peak.cpu_s`` sums every process
    seen, at its last reading (a process loses at most its last interval before it exits).
    With ``detail``, also labels each process (:func:`process_label`), splits its RSS
    (:data:`STATUS_FIELDS`), reads its CPU time and keeps every sample in ``peak.timeline``.
    ``include_root=False`` samples the descendants only (``pid`` = this process: everything
    it started). :meth:`stop` takes one last sample.
    """

    def __init__(
        self,
        pid: int,
        interval: float,
        detail: bool = False,
        *,
        cpu: bool = False,
        include_root: bool = True,
    ) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.detail = detail
        self.cpu = cpu or detail
        self.include_root = include_root
        self.peak = TreePeak()
        self._stop_event = threading.Event()
        self._t0 = time.perf_counter()

    def run(self) -> None:
        while True:
            self._sample()
            if self._stop_event.wait(self.interval):
                return

    def stop(self) -> TreePeak:
        self._stop_event.set()
        self.join()
        self._sample()
        return self.peak

    def _sample(self) -> None:
        t, wall = time.perf_counter() - self._t0, time.time()
        procs = process_tree(self.pid, include_root=self.include_root)
        if not procs:
            return
        by_name: Counter[str] = Counter()
        samples: list[ProcSample] = []
        n = 0
        for proc in procs:
            try:
                rss = proc.memory_info().rss
                cpu = self._read_cpu(proc) if self.cpu else 0.0
                if self.detail:
                    label = process_label(proc, self.pid)
                    split = _status_split(proc.pid)
                    samples.append(ProcSample(proc.pid, label, rss, cpu_s=cpu, **split))
                by_name[proc.name()] += rss
                n += 1
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue  # exited between listing and reading: it holds nothing now
        self._record(TreeSample(t, wall, samples), by_name, n)

    def _read_cpu(self, proc: psutil.Process) -> float:
        """``proc``'s CPU seconds now, kept as its latest reading in ``peak.cpu_by_process``."""
        cpu = cpu_seconds(proc)
        key = (proc.pid, proc.create_time())
        seen = self.peak.cpu_by_process
        seen[key] = max(seen.get(key, 0.0), cpu)
        return cpu

    def _record(self, sample: TreeSample, by_name: Counter[str], n: int) -> None:
        """Count one sample of ``n`` processes into ``peak``."""
        total = sum(by_name.values())
        peak = self.peak
        peak.samples += 1
        if self.detail:
            peak.timeline.append(sample)
        peak.max_processes = max(peak.max_processes, n)
        if total > peak.rss_bytes:
            peak.rss_bytes = total
            peak.processes_at_peak = n
            peak.by_name_at_peak = dict(by_name)
            peak.at_peak = sample if self.detail else None


@dataclass
class Measured:
    command: list[str]
    wall_s: float
    peak: TreePeak
    log: Path


def run_measured(command: list[str], log: Path, interval: float, detail: bool = False) -> Measured:
    """Run ``command`` from the repository root; time it and sample its tree's RSS."""
    with log.open("w") as sink:
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
        sampler = TreeSampler(proc.pid, interval, detail)
        sampler.start()
        returncode = proc.wait()
        wall = time.perf_counter() - t0
        peak = sampler.stop()
    if returncode != 0:
        tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        sys.exit(f"command failed with exit code {returncode}: {shlex.join(command)}\n{tail}")
    return Measured(command, wall, peak, log)


def rss_breakdown(peak: TreePeak) -> str:
    """``name MiB`` per process name at the peak sample, largest first."""
    ranked = sorted(peak.by_name_at_peak.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {rss / MIB:.0f}" for name, rss in ranked) + " (MiB)"


# --------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------


def repeated_demo(repeat: int) -> pa.Table:
    """The demo documents ``repeat`` times; copy ``r`` has ids ``r<rrr>-<demo id>``."""
    demo = pq.read_table(DEMO_CORPUS, columns=[DOC_ID, TEXT])
    copies = []
    for r in range(repeat):
        ids = pc.binary_join_element_wise(demo[DOC_ID], pa.scalar(f"r{r:03d}"), "-")
        copies.append(pa.table({DOC_ID: ids, TEXT: demo[TEXT]}))
    return pa.concat_tables(copies)


def build_corpus(repeat: int, target: Path) -> int:
    """The demo documents ``repeat`` times with unique ids, as one Parquet file."""
    corpus = repeated_demo(repeat)
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(corpus, target, row_group_size=ROW_GROUP_DOCS)
    return corpus.num_rows


# --------------------------------------------------------------------------------------
# Machine, versions, executables, markdown
# --------------------------------------------------------------------------------------


def _version(*dists: str) -> str:
    for d in dists:
        try:
            return f"{d} {importlib.metadata.version(d)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"{dists[0]} (not installed)"


def machine_lines() -> list[str]:
    model = "unknown"
    with Path("/proc/cpuinfo").open() as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    physical = psutil.cpu_count(logical=False)
    mem = psutil.virtual_memory().total / 2**30
    versions = ", ".join(
        _version(*d)
        for d in (
            ("torch",),
            ("tensorflow", "tensorflow-cpu"),
            ("ray",),
            ("keras",),
            ("transformers",),
            ("spacy",),
        )
    )
    return [
        f"machine: {os.cpu_count()} logical cores ({physical} physical), {model}, "
        f"{mem:.1f} GiB RAM",
        f"versions: Python {sys.version.split()[0]}, {versions}",
    ]


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def docintel_executable() -> str:
    found = shutil.which("docintel", path=str(Path(sys.executable).parent)) or shutil.which(
        "docintel"
    )
    if found is None:
        sys.exit("the docintel console script is not installed (pip install -e .)")
    return found


def fmt(x: float | None, digits: int) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


# --- A/B runs of two sides, alternating (the *_cost.py benches) ------------------------------


def ab_orders(rounds: int) -> list[tuple[int, str]]:
    """(round, side) in run order: A B, B A, A B, ... (both sides see the same load)."""
    return [(r, s) for r in range(1, rounds + 1) for s in (("A", "B") if r % 2 else ("B", "A"))]


def median_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def ab_medians(rows: list[dict], side: str, keys: Iterable[str]) -> dict[str, float | None]:
    return {k: median_known(r[k] for r in rows if r["side"] == side) for k in keys}


def ab_table(
    rows: list[dict], columns: dict[str, str], digits: int = 1, over: tuple[str, str] = ("B", "A")
) -> str:
    """Markdown: every run, each side's median, and the ratio ``over[0] / over[1]`` of the
    medians per column."""
    head = ["round", "side", *columns.values()]
    lines = [md_row(head), md_row(["---:"] * len(head))]
    for r in rows:
        lines.append(md_row([str(r["round"]), r["side"], *(fmt(r[c], digits) for c in columns)]))
    med = {side: ab_medians(rows, side, columns) for side in ("A", "B")}
    for side in ("A", "B"):
        lines.append(md_row(["median", side, *(fmt(med[side][c], digits) for c in columns)]))
    top, bottom = med[over[0]], med[over[1]]
    ratio = [fmt(top[c] / bottom[c], 3) if top[c] and bottom[c] else "—" for c in columns]
    lines.append(md_row([f"{over[0]} / {over[1]}", "", *ratio]))
    return "\n".join(lines)


def sampled_docintel_run(
    cmd: list[str], out: Path, what: str, env: dict[str, str] | None = None, **sampling: bool
) -> tuple[float, TreePeak, dict, str, int]:
    """Run ``cmd`` (a ``docintel run`` into ``out``) with its process tree sampled every
    SAMPLE_INTERVAL_S: its wall seconds, the samples, the run's manifest, its stderr and
    the driver's pid; exits naming ``what`` with the stderr tail when it fails.
    ``sampling``: TreeSampler's flags."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    sampler = TreeSampler(proc.pid, SAMPLE_INTERVAL_S, **sampling)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    peak = sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode}):\n{err[-3000:]}")
    return wall, peak, json.loads((out / "_manifest.json").read_text()), err, proc.pid
