"""Benchmark: peak memory and time of `docintel run` on a corpus and on the same corpus x10.

Streaming with bounded memory means corpus size must not change peak memory: the peak
RSS of the whole run (driver, Ray daemons and every Ray worker) on the corpus x10 should
be at most 1.25x that on the corpus x1, and processing time should grow about linearly.

The x1 corpus is data/demo/documents.parquet repeated ``--base`` times (528 documents
each), written as a folder of Parquet files of ``--docs-per-file`` documents in row
groups of 100 (a big corpus is many files). The x10 corpus is ``--factor`` copies of
that same folder layout, with unique document ids. Each run is

    docintel run IN OUT --no-progress --no-embeddings --run-id memN

as a subprocess. Every ``--interval`` seconds the RSS of each process of its tree is
read (with /proc/<pid>/status's split into private anonymous memory, file-backed pages
and shared memory, i.e. plasma object-store pages for Ray processes); the peak is the
maximum over samples of the RSS summed over the tree (a sum of RSS counts shared pages
once per process that maps them). Timings come from each run's _manifest.json. Per-process
samples are written as CSV to the work folder (kept with ``--keep`` or ``--workdir``).

Run from the repository root:

    .venv/bin/python bench/memory_scaling.py --output-md bench/memory_scaling.md
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from common import (
    DOC_ID,
    MIB,
    REPO,
    ROW_GROUP_DOCS,
    SAMPLE_INTERVAL_S,
    TEXT,
    Measured,
    ProcSample,
    TreeSample,
    docintel_executable,
    fmt,
    load_average,
    machine_lines,
    md_row,
    repeated_demo,
    run_measured,
)

DEFAULT_BASE = 1  # 1 x 528 demo documents for x1; x10 is then ~5,300 documents
DEFAULT_FACTOR = 10  # the x10
DOCS_PER_FILE = 200  # 2 row groups per file: x1 = 3 files, x10 = 30 files
MAX_RSS_RATIO = 1.25  # the bound on peak RSS x10 / x1
WINDOW_POINTS = (0.05, 0.25, 0.5, 0.75, 0.95)  # where in processing RSS is shown over time
MID_WINDOW = (0.4, 0.6)  # "middle of processing", as fractions of the processing window
LATE_WINDOW = (0.8, 1.0)  # "end of processing"
MIN_WINDOW_SAMPLES = 3  # fewer samples than this in a window: no growth figure
CODE_PATHS = ("pipeline", "actors", "jobs", "models")  # what a run executes
OTHER_CPU_WARN = 0.1  # other processes using more than this share of the cores: say so

DRIVER = "driver"
TASK_WORKERS = "ray workers: tasks, idle, starting"
SPLIT = ("anon", "file", "shmem")


# --------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------


@dataclass
class Corpus:
    name: str
    folder: Path
    documents: int
    files: int
    row_groups: int


def write_copies(base: pa.Table, copies: int, folder: Path, docs_per_file: int) -> Corpus:
    """``copies`` copies of ``base`` (ids prefixed ``c<cc>-``), each cut into files."""
    folder.mkdir(parents=True, exist_ok=True)
    files = row_groups = 0
    for c in range(copies):
        ids = pc.binary_join_element_wise(pa.scalar(f"c{c:02d}"), base[DOC_ID], "-")
        copy = pa.table({DOC_ID: ids, TEXT: base[TEXT]})
        for k, start in enumerate(range(0, copy.num_rows, docs_per_file)):
            part = copy.slice(start, docs_per_file)
            pq.write_table(
                part, folder / f"part-{c:03d}-{k:03d}.parquet", row_group_size=ROW_GROUP_DOCS
            )
            files += 1
            row_groups += -(-part.num_rows // ROW_GROUP_DOCS)
    return Corpus(f"x{copies}", folder, base.num_rows * copies, files, row_groups)


# --------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------


@dataclass
class Run:
    corpus: Corpus
    measured: Measured
    documents: int
    sentences: int
    errors: int
    startup_s: float
    processing_s: float
    manifest_wall_s: float
    stage_seconds: dict[str, float]
    # the processing window in sampler seconds (from the output parts' times)
    window: tuple[float, float]
    cpu: CpuUse
    timeline: list[TreeSample] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return self.measured.peak.rss_bytes

    @property
    def docs_per_s(self) -> float:
        return self.documents / self.processing_s if self.processing_s else 0.0


def processing_window(
    out: Path, processing_s: float, timeline: list[TreeSample]
) -> tuple[float, float]:
    """Sampler-time start and end of processing.

    Processing ends when the last batch is written: the newest ``documents/`` part's
    modification time; it started ``processing_seconds`` (manifest) before that.
    """
    end_wall = max(p.stat().st_mtime for p in (out / "documents").glob("part-*.parquet"))
    first = timeline[0]
    end = first.t + (end_wall - first.wall)
    return (end - processing_s, end)


@dataclass
class CpuUse:
    """CPU seconds during one run: the machine's, the run's, and everything else's."""

    machine_s: float  # busy time of all cores (psutil.cpu_times: all but idle and iowait)
    run_s: float  # the run's process tree, from the samples
    processing_s: float  # the run's process tree during the processing window
    sampler_s: float  # this script (mostly the sampling thread)
    available_s: float  # cores x wall time

    @property
    def other_s(self) -> float:
        return max(self.machine_s - self.run_s - self.sampler_s, 0.0)


def _busy_s() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _self_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def window_cpu_s(timeline: list[TreeSample], start: float, end: float) -> float:
    """CPU seconds the tree used between sampler times ``start`` and ``end``."""
    before: dict[int, float] = {}
    until: dict[int, float] = {}
    for s in timeline:
        if s.t > end:
            break
        for p in s.procs:
            until[p.pid] = p.cpu_s
            if s.t <= start:
                before[p.pid] = p.cpu_s
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in until.items())


def run_corpus(corpus: Corpus, work: Path, interval: float) -> Run:
    out = work / f"out-{corpus.name}"
    if out.exists():
        shutil.rmtree(out)
    command = [docintel_executable(), "run", str(corpus.folder), str(out), "--no-progress"]
    command += ["--no-embeddings", "--run-id", f"mem{corpus.name.removeprefix('x')}"]
    print(f"running {corpus.name} ({corpus.documents:,} documents) ...", file=sys.stderr)
    busy0, self0 = _busy_s(), _self_s()
    measured = run_measured(command, work / f"{corpus.name}.log", interval, detail=True)
    busy, sampler = _busy_s() - busy0, _self_s() - self0
    manifest = json.loads((out / "_manifest.json").read_text())
    counts, timings = manifest["counts"], manifest["timings"]
    timeline = measured.peak.timeline
    window = processing_window(out, timings["processing_seconds"], timeline)
    cpu = CpuUse(
        machine_s=busy,
        run_s=measured.peak.cpu_s,
        processing_s=window_cpu_s(timeline, *window),
        sampler_s=sampler,
        available_s=(os.cpu_count() or 1) * measured.wall_s,
    )
    return Run(
        corpus=corpus,
        measured=measured,
        documents=counts["documents"],
        sentences=counts["sentences"],
        errors=counts["errors"],
        startup_s=timings["startup_seconds"],
        processing_s=timings["processing_seconds"],
        manifest_wall_s=timings["wall_seconds"],
        stage_seconds=timings["stage_seconds"],
        window=window,
        cpu=cpu,
        timeline=timeline,
    )


def write_timeline(run: Run, path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "pid", "label", "rss_mib", *(f"{k}_mib" for k in SPLIT), "cpu_s"])
        for s in run.timeline:
            for p in s.procs:
                mibs = (p.rss / MIB, *(getattr(p, k) / MIB for k in SPLIT))
                cells = [f"{s.t:.2f}", p.pid, p.label, *(f"{m:.1f}" for m in mibs)]
                w.writerow([*cells, f"{p.cpu_s:.2f}"])


# --------------------------------------------------------------------------------------
# Processes grouped by role
# --------------------------------------------------------------------------------------


# How Ray workers look before they take their title (``ray::...``): runtime-env set-up,
# then the worker script
WORKER_SCRIPTS = frozenset({"setup_worker.py", "default_worker.py"})


def role(label: str) -> str:
    """Group a process label: actors by class, task and idle workers together."""
    if label in WORKER_SCRIPTS:
        return TASK_WORKERS
    if not label.startswith("ray::"):
        return label
    # "ray::EmbedActor.process", or "ray::<actor name>:EmbedActor.__init__" while it starts
    title = label.removeprefix("ray::").split(".")[0].rsplit(":", 1)[-1]
    if title[:1].isupper() and title != "IDLE":
        return f"ray::{title}"  # an actor (stage replica or Ray's own agents)
    return TASK_WORKERS


def _rank(label: str) -> int:
    """How telling a label is of its process's role: actor title > worker > script."""
    if label.startswith("ray::") and role(label) != TASK_WORKERS:
        return 2
    return 1 if role(label) == TASK_WORKERS else 0


def pid_roles(timeline: list[TreeSample]) -> dict[int, str]:
    """Each process's role over the whole run, from its most telling, then commonest label.

    A Ray worker runs ``setup_worker.py``, then ``default_worker.py``, before it takes
    its actor or task title; a Ray agent starts as its script; a stage actor's title
    changes with the method it runs; a process sampled while it execs may show only its
    executable's name. A process that was ever an actor counts as that actor throughout.
    """
    seen: dict[int, Counter[str]] = defaultdict(Counter)
    for s in timeline:
        for p in s.procs:
            seen[p.pid][p.label] += 1
    return {
        pid: role(max(labels, key=lambda lb: (_rank(lb), labels[lb])))
        for pid, labels in seen.items()
    }


def by_role(sample: TreeSample, roles: dict[int, str]) -> dict[str, ProcSample]:
    """Per role: RSS and its split summed over the role's processes (pid = count)."""
    out: dict[str, ProcSample] = {}
    for p in sample.procs:
        r = roles.get(p.pid) or role(p.label)
        agg = out.setdefault(r, ProcSample(0, r, 0))
        agg.pid += 1
        agg.rss += p.rss
        agg.anon += p.anon
        agg.file += p.file
        agg.shmem += p.shmem
    return out


def role_series(run: Run) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per role: sample times and RSS in bytes (0 where the role had no process)."""
    t = np.array([s.t for s in run.timeline])
    series: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(len(t)))
    roles = pid_roles(run.timeline)
    for i, s in enumerate(run.timeline):
        for r, agg in by_role(s, roles).items():
            series[r][i] = agg.rss
    return {r: (t, v) for r, v in series.items()}


def at_time(t: np.ndarray, v: np.ndarray, when: float) -> float:
    return float(v[int(np.abs(t - when).argmin())])


def late_growth(run: Run, t: np.ndarray, v: np.ndarray) -> float | None:
    """Median RSS over the last fifth of processing minus that around its middle (bytes).

    A process whose memory grows with the documents it has seen keeps growing here, and
    by about ``factor`` times more in the larger run, which streams ``factor`` times longer.
    """
    start, end = run.window

    def median(lo: float, hi: float) -> float | None:
        inside = (t >= start + lo * (end - start)) & (t <= start + hi * (end - start))
        return float(np.median(v[inside])) if inside.sum() >= MIN_WINDOW_SAMPLES else None

    mid, late = median(*MID_WINDOW), median(*LATE_WINDOW)
    return None if mid is None or late is None else late - mid


def phase(run: Run, t: float) -> str:
    start, end = run.window
    if t < start:
        return "start-up"
    if t <= end:
        return f"processing, {100 * (t - start) / (end - start):.0f}% through"
    return "after processing (final counts, manifest, shutdown)"


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "—"


def main_table(small: Run, big: Run) -> list[str]:
    head = [
        "corpus",
        "documents",
        "sentences",
        "wall s",
        "processing s",
        "docs/s (processing)",
        "CPU s (processing)",
        "peak RSS MiB",
    ]
    lines = [md_row(head), md_row(["---", *["---:"] * (len(head) - 1)])]
    for r in (small, big):
        c = r.corpus
        lines.append(
            md_row(
                [
                    f"{c.name} ({c.files} files, {c.row_groups} row groups)",
                    f"{r.documents:,}",
                    f"{r.sentences:,}",
                    fmt(r.measured.wall_s, 1),
                    fmt(r.processing_s, 1),
                    fmt(r.docs_per_s, 1),
                    fmt(r.cpu.processing_s, 0),
                    fmt(r.peak_bytes / MIB, 0),
                ]
            )
        )
    name = f"ratio {big.corpus.name}/{small.corpus.name}"
    lines.append(
        md_row(
            [
                name,
                _ratio(big.documents, small.documents),
                _ratio(big.sentences, small.sentences),
                _ratio(big.measured.wall_s, small.measured.wall_s),
                f"**{_ratio(big.processing_s, small.processing_s)}**",
                _ratio(big.docs_per_s, small.docs_per_s),
                _ratio(big.cpu.processing_s, small.cpu.processing_s),
                f"**{_ratio(big.peak_bytes, small.peak_bytes)}**",
            ]
        )
    )
    return lines


def cpu_line(run: Run) -> str:
    c = run.cpu
    line = (
        f"CPU during {run.corpus.name}: the run {c.run_s:,.0f} s, this script's sampling "
        f"{c.sampler_s:,.1f} s, other processes on the machine {c.other_s:,.0f} s, of "
        f"{c.available_s:,.0f} core-seconds"
    )
    if c.other_s > OTHER_CPU_WARN * c.available_s:
        line += (
            f" — WARNING: other processes took {100 * c.other_s / c.available_s:.0f}% of the "
            "cores, so this run's times are slower than on a quiet machine"
        )
    return line + "."


def verdict(small: Run, big: Run) -> list[str]:
    rss = big.peak_bytes / small.peak_bytes
    ok = rss <= MAX_RSS_RATIO
    docs = big.documents / small.documents
    time_ratio = big.processing_s / small.processing_s
    cpu_ratio = big.cpu.processing_s / small.cpu.processing_s if small.cpu.processing_s else 0.0
    return [
        f"**Peak RSS {big.corpus.name}/{small.corpus.name} = {rss:.2f}x "
        f"({'within' if ok else 'ABOVE'} the {MAX_RSS_RATIO:g}x bound).**",
        f"Processing time {time_ratio:.2f}x for {docs:.2f}x the documents: time per document "
        f"{big.corpus.name}/{small.corpus.name} = {time_ratio / docs:.2f}x "
        f"(1.00x = exactly linear). Wall time includes ~{small.startup_s:.0f} s of start-up "
        "(checks, Ray start, model loads) that does not scale with the corpus.",
        f"CPU seconds of the run's processes during processing: {cpu_ratio:.2f}x for "
        f"{docs:.2f}x the documents, {cpu_ratio / docs:.2f}x per document (less sensitive than "
        "wall time to other processes competing for the cores).",
    ]


def role_table(small: Run, big: Run) -> list[str]:
    """RSS by role at each run's peak, each role's own maximum, and the big peak's split."""
    ps, pb = small.measured.peak.at_peak, big.measured.peak.at_peak
    assert ps is not None and pb is not None  # detail=True runs always record the peak
    at_s, at_b = by_role(ps, pid_roles(small.timeline)), by_role(pb, pid_roles(big.timeline))
    series_s, series_b = role_series(small), role_series(big)
    ns, nb = small.corpus.name, big.corpus.name
    head = [
        "process (count at peak)",
        f"{ns} at peak",
        f"{nb} at peak",
        f"{nb} - {ns}",
        f"{ns} max",
        f"{nb} max",
        f"{nb} at peak: anon / file / shmem",
        f"growth mid → end of processing {ns} / {nb}",
    ]
    lines = [md_row(head), md_row(["---", *["---:"] * (len(head) - 1)])]
    empty = ProcSample(0, "", 0)
    roles = sorted(set(at_s) | set(at_b), key=lambda r: -at_b.get(r, empty).rss)
    for r in roles:
        a, b = at_s.get(r, empty), at_b.get(r, empty)
        ms = float(series_s[r][1].max()) if r in series_s else 0.0
        mb = float(series_b[r][1].max()) if r in series_b else 0.0
        gs = late_growth(small, *series_s[r]) if r in series_s else None
        gb = late_growth(big, *series_b[r]) if r in series_b else None
        lines.append(
            md_row(
                [
                    f"{r} ({a.pid} / {b.pid})",
                    fmt(a.rss / MIB, 0),
                    fmt(b.rss / MIB, 0),
                    f"{(b.rss - a.rss) / MIB:+,.0f}",
                    fmt(ms / MIB, 0),
                    fmt(mb / MIB, 0),
                    " / ".join(fmt(getattr(b, k) / MIB, 0) for k in SPLIT),
                    " / ".join("—" if g is None else f"{g / MIB:+,.0f}" for g in (gs, gb)),
                ]
            )
        )
    ts, tb = sum(a.rss for a in at_s.values()), sum(b.rss for b in at_b.values())
    lines.append(
        md_row(
            [
                "**total**",
                fmt(ts / MIB, 0),
                fmt(tb / MIB, 0),
                f"{(tb - ts) / MIB:+,.0f}",
                "",
                "",
                " / ".join(fmt(sum(getattr(b, k) for b in at_b.values()) / MIB, 0) for k in SPLIT),
                "",
            ]
        )
    )
    return lines


def over_time_table(run: Run) -> list[str]:
    """RSS by role at points of the processing window (does anything grow as it streams?)."""
    start, end = run.window
    head = ["process", *(f"{100 * q:.0f}%" for q in WINDOW_POINTS)]
    lines = [md_row(head), md_row(["---", *["---:"] * (len(head) - 1)])]
    points = [start + q * (end - start) for q in WINDOW_POINTS]
    series = role_series(run)
    totals = np.zeros(len(points))
    for r, (t, v) in sorted(series.items(), key=lambda kv: -kv[1][1].max()):
        vals = [at_time(t, v, p) for p in points]
        totals += vals
        lines.append(md_row([r, *(fmt(x / MIB, 0) for x in vals)]))
    lines.append(md_row(["**total**", *(fmt(x / MIB, 0) for x in totals)]))
    return lines


def peak_line(run: Run) -> str:
    peak = run.measured.peak
    t = peak.at_peak.t if peak.at_peak is not None else 0.0
    return (
        f"- {run.corpus.name} peak {peak.rss_bytes / MIB:,.0f} MiB at {t:.1f} s "
        f"({phase(run, t)}; processing from {run.window[0]:.1f} s to {run.window[1]:.1f} s), "
        f"{peak.processes_at_peak} processes (max {peak.max_processes}, {peak.samples} samples)"
    )


def peak_processes(run: Run) -> str:
    sample = run.measured.peak.at_peak
    assert sample is not None
    ranked = sorted(sample.procs, key=lambda p: -p.rss)
    return ", ".join(f"{p.label} [{p.pid}] {p.rss / MIB:.0f}" for p in ranked) + " (MiB)"


def code_version() -> str:
    """The commit measured, and whether the pipeline's files differ from it."""

    def git(*a: str) -> str:
        done = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--", *CODE_PATHS)
    where = ", ".join(f"{p}/" for p in CODE_PATHS)
    state = "have uncommitted changes" if dirty else "as committed"
    return f"code: commit {head}; {where} {state}"


def _setup_lines(args: argparse.Namespace, small: Run, big: Run, load: str) -> list[str]:
    """The report's title and set-up: machine, code, load, commands, corpora."""
    ns, nb = small.corpus.name, big.corpus.name
    return [
        f"# docintel memory scaling: {ns} ({small.documents:,} documents) vs {nb} "
        f"({big.documents:,} documents)",
        "",
        *(f"- {m}" for m in machine_lines()),
        f"- {code_version()}",
        f"- load average (1, 5, 15 min): {load}",
        f"- command: `{shlex.join([sys.executable, *sys.argv])}`",
        *(f"- {r.corpus.name}: `{shlex.join(r.measured.command)}`" for r in (small, big)),
        f"- corpora: data/demo/documents.parquet x{args.base} = {small.documents:,} documents, "
        f"files of {args.docs_per_file} documents in row groups of {ROW_GROUP_DOCS}; {nb} is "
        f"{args.factor} copies of {ns}'s files with unique ids",
        "",
    ]


def report(args: argparse.Namespace, small: Run, big: Run, load: str, kept: Path | None) -> str:
    ns, nb = small.corpus.name, big.corpus.name
    lines = [
        *_setup_lines(args, small, big, load),
        *main_table(small, big),
        "",
        *verdict(small, big),
        "",
        *(cpu_line(r) for r in (small, big)),
        "",
        "Processing s and docs/s are the manifest's `timings.processing_seconds` (streaming "
        "every batch, after start-up); wall s is the subprocess's. Peak RSS: the maximum, over "
        f"samples every {args.interval:g} s, of the RSS summed over the driver and all its "
        "descendants (Ray daemons and workers); shared pages count once per process that "
        "maps them.",
        "",
        "## Where the memory is",
        "",
        *(peak_line(r) for r in (small, big)),
        "",
        "RSS (MiB) by process at each run's peak sample, each process group's own maximum "
        "over the run, the split of the larger run's peak into private anonymous / file-backed "
        "/ shared memory (for Ray processes, shared = plasma object-store pages touched), and "
        "how much each group's RSS grows from the middle to the end of processing (median "
        f"over {100 * MID_WINDOW[0]:.0f}-{100 * MID_WINDOW[1]:.0f}% vs "
        f"{100 * LATE_WINDOW[0]:.0f}-{100 * LATE_WINDOW[1]:.0f}% of the processing window; "
        f"memory that grows with the documents seen grows ~{args.factor}x more in the larger "
        "run):",
        "",
        *role_table(small, big),
        "",
        "The worker group's figures move with how many short-lived task workers exist at "
        "that moment (Ray starts and retires them), not with the growth of one process.",
        "",
        f"{nb} RSS (MiB) by process at points of its processing window (nearest sample):",
        "",
        *over_time_table(big),
        "",
        *(f"- {r.corpus.name} processes at peak: {peak_processes(r)}" for r in (small, big)),
        *(
            f"- {r.corpus.name} stage busy seconds (summed over batches): "
            + ", ".join(f"{s} {v:.1f}" for s, v in r.stage_seconds.items())
            + f"; start-up {r.startup_s:.1f} s"
            for r in (small, big)
        ),
    ]
    lines += [
        f"- WARNING: {r.corpus.name}: {r.errors} documents failed" for r in (small, big) if r.errors
    ]
    if kept is not None:
        lines.append(f"- per-process samples: {kept}/timeline-{{{ns},{nb}}}.csv")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> None:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="docintel-mem-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    keep = args.workdir is not None or args.keep
    try:
        load = load_average()
        base = repeated_demo(args.base)
        corpora = [
            write_copies(base, n, work / f"corpus-x{n}", args.docs_per_file)
            for n in (1, args.factor)
        ]
        for c in corpora:
            print(f"corpus {c.name}: {c.documents:,} documents, {c.files} files", file=sys.stderr)
        small, big = (run_corpus(c, work, args.interval) for c in corpora)
        for r in (small, big):
            write_timeline(r, work / f"timeline-{r.corpus.name}.csv")
        load += " at start; " + load_average() + " at end"
        text = report(args, small, big, load, work if keep else None)
        print(text)
        if args.output_md:
            Path(args.output_md).write_text(text)
    finally:
        if keep:
            print(f"kept the corpora, outputs, logs and timelines in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--base", type=int, default=DEFAULT_BASE, help="demo copies in corpus x1")
    p.add_argument(
        "--factor", type=int, default=DEFAULT_FACTOR, help="copies of x1 in the larger corpus"
    )
    p.add_argument(
        "--docs-per-file", type=int, default=DOCS_PER_FILE, help="documents per Parquet file"
    )
    p.add_argument("--output-md", help="also write the markdown report to this file")
    p.add_argument("--interval", type=float, default=SAMPLE_INTERVAL_S, help="RSS sample period")
    p.add_argument("--workdir", help="folder for the corpora, outputs, logs and timelines (kept)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = p.parse_args(argv)
    if args.base < 1 or args.factor < 2 or args.docs_per_file < 1:
        p.error("--base and --docs-per-file must be at least 1, --factor at least 2")
    return args


def main() -> None:
    bench(parse_args())


if __name__ == "__main__":
    main()
