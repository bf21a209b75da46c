"""Benchmark: the driver's memory while planning a run, by corpus size (1 M and 10 M docs).

Before any cluster work the driver runs ``docintel.pipeline.run.plan.prepare``: it checks the
models (reads the bundled classifier's metadata; no torch/TensorFlow model is loaded),
lists the input files, reads their footers (``split_readable``), plans the work units
(``plan``) and checks the document ids (``check_ids``: streaming, hash-partitioned
duplicate detection on local disk, ``pipeline/input/idcheck.py``). The issue "Bounded at any
size" asks that this take memory that does not grow with the corpus.

For each size N (``--sizes``) the script writes N synthetic documents over ``--files``
Parquet files (columns ``doc_id`` = "doc-000000123", unique, and ``text`` = a short
constant; row groups of 50,000 rows; zstd) under ``--workdir``, reused on later runs.
Then, each in a FRESH Python subprocess so that its peak RSS belongs to that size alone:

* ``prepare``: exactly what the driver does,
  ``prepare(load_config(None, {"run.show_progress": False}), folder)``. Its phases are
  timed by wrapping the functions ``prepare`` calls (timing only; the calls are the same).
  The id check's spill directory is pointed at the work folder and its size sampled
  every 50 ms (the peak should be 8 bytes per id).
* ``counter``: the naive check the old code did, the "before" baseline: every file's id
  column read whole, ``pc.cast(col, pa.string()).to_pylist()`` and
  ``collections.Counter.update`` over all of them (the old code also kept a dict of each
  id's first file, so its real footprint was larger still).

Both children import the same modules (docintel.pipeline.run.plan, its config, pyarrow)
before measuring, so their baselines match. Reported per child: wall time; the RSS just
before the measured call (baseline, after imports and a gc); the peak RSS during the call
(VmHWM, reset to the baseline just before the call by writing 5 to /proc/self/clear_refs;
where that is not allowed, ``ru_maxrss``); the growth of that peak over the baseline;
``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (KiB on Linux) before and after the call,
shown as well: it is the whole process's peak (imports included; on Linux it also starts
at the parent's RSS at fork, which is why the parent imports nothing heavy); documents,
work units, batches and, for ``prepare``, the time and VmHWM after each phase and the
deep size of the plan's unit and file lists.

The environment passes to the children, so allocator settings can be compared, e.g.
``MALLOC_MMAP_THRESHOLD_=131072`` (glibc: a fixed mmap threshold instead of the dynamic
one, which lets the heap keep freed numpy buffers).

Run from the repository root (generating 10 M documents took 4 s on 2 cores, 100 M 38 s,
done once and cached):

    .venv/bin/python bench/plan_scaling.py
    .venv/bin/python bench/plan_scaling.py --sizes 30000000,100000000 --approaches prepare
    .venv/bin/python bench/plan_scaling.py --sizes 100000,1000000 --json /tmp/plan.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_WORKDIR = "/tmp/docintel-plan-bench"
DEFAULT_SIZES = "1000000,10000000"
DEFAULT_FILES = 200
ROW_GROUP_ROWS = 50_000  # rows per Parquet row group
CHUNK_ROWS = 100_000  # ids formatted per chunk while generating (a multiple of the above)
TEXT_VALUE = "Revenue rose. Costs fell."
ID_FORMAT = "doc-{:09d}"
DATA_FORMAT = 1  # bump when the generated layout changes: cached inputs are rebuilt
MARKER = "_complete.json"  # leading "_": the pipeline's file listing skips it
APPROACHES = ("prepare", "counter")
DISK_SAMPLE_S = 0.05
MIB = 1024 * 1024
RESULT_PREFIX = "RESULT "
PHASES = ("check_models", "resolve_input", "split_readable", "plan", "check_ids")
# the function of docintel.pipeline.run.plan each phase times, where its name differs
PHASE_FUNCTIONS = {"plan": "plan_sized"}


# --------------------------------------------------------------------------------------
# Synthetic inputs
# --------------------------------------------------------------------------------------


def build_inputs(workdir: Path, n: int, n_files: int) -> Path:
    """``n`` documents over ``n_files`` Parquet files, cached under ``workdir``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = workdir / f"docs-{n}-f{n_files}"
    want = {"n": n, "files": n_files, "row_group_rows": ROW_GROUP_ROWS, "format": DATA_FORMAT}
    marker = folder / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == want:
        log(f"reusing {folder}")
        return folder
    partial = folder.with_name(folder.name + ".partial")
    for stale in (folder, partial):
        shutil.rmtree(stale, ignore_errors=True)
    partial.mkdir(parents=True)
    schema = pa.schema([("doc_id", pa.string()), ("text", pa.string())])
    started = time.perf_counter()
    start = 0
    for i in range(n_files):
        rows = n // n_files + (1 if i < n % n_files else 0)
        with pq.ParquetWriter(partial / f"part-{i:05d}.parquet", schema, compression="zstd") as w:
            for a in range(start, start + rows, CHUNK_ROWS):
                b = min(a + CHUNK_ROWS, start + rows)
                ids = pa.array([ID_FORMAT.format(j) for j in range(a, b)], pa.string())
                text = pa.repeat(pa.scalar(TEXT_VALUE, pa.string()), b - a)
                w.write_table(pa.table([ids, text], schema=schema), row_group_size=ROW_GROUP_ROWS)
        start += rows
    (partial / MARKER).write_text(json.dumps(want))
    partial.rename(folder)
    mib = sum(p.stat().st_size for p in folder.glob("*.parquet")) / MIB
    log(
        f"wrote {n:,} documents in {n_files} files ({mib:.1f} MiB) to {folder} "
        f"in {time.perf_counter() - started:.0f} s"
    )
    return folder


# --------------------------------------------------------------------------------------
# Measuring (in the child process)
# --------------------------------------------------------------------------------------


def _status_kib() -> dict[str, int]:
    out = {}
    with Path("/proc/self/status").open() as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with Path("/proc/self/clear_refs").open("w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class DiskSampler:
    """Peak total size of the files under a folder, sampled in a thread."""

    def __init__(self, root: Path):
        self.root = root
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _size(self) -> int:
        total = 0
        for path in self.root.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # unlinked while we looked
                st = path.stat()
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._size())
            self._stop.wait(DISK_SAMPLE_S)

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def deep_size(obj: object, seen: set[int]) -> int:
    """Bytes of ``obj`` and everything it holds, each object counted once (small ints,
    shared singletons, are not counted)."""
    if id(obj) in seen or obj is None or isinstance(obj, bool):
        return 0
    if isinstance(obj, int) and -5 <= obj <= 256:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(deep_size(x, seen) for x in obj)
    elif isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif dataclasses.is_dataclass(obj) and hasattr(obj, "__dict__"):
        size += deep_size(vars(obj), seen)
    return size


def child_prepare(folder: Path, tmp_root: Path) -> dict:
    import gc
    import tempfile

    from docintel.pipeline.config import load_config
    from docintel.pipeline.run import plan as plan_mod

    phases: dict[str, dict[str, float]] = {}

    def timed(name: str, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[name] = {
                    "s": time.perf_counter() - t0,
                    "hwm_kib": _status_kib()["VmHWM"],
                    "rss_kib": _status_kib()["VmRSS"],
                }

        return wrapper

    for name in PHASES:  # prepare() looks these up in its module's globals
        fn = PHASE_FUNCTIONS.get(name, name)
        setattr(plan_mod, fn, timed(name, getattr(plan_mod, fn)))
    cfg = load_config(None, {"run.show_progress": False})
    tmp_root.mkdir(parents=True, exist_ok=True)
    tempfile.tempdir = str(tmp_root)  # where check_ids spills its hash buckets
    gc.collect()
    base = _status_kib()["VmRSS"]
    maxrss_before = _maxrss_kib()
    hwm_reset = _reset_hwm()
    with DiskSampler(tmp_root) as disk:
        t0 = time.perf_counter()
        p = plan_mod.prepare(cfg, str(folder))
        seconds = time.perf_counter() - t0
    peak_hwm = _status_kib()["VmHWM"]
    peak_maxrss = _maxrss_kib()
    after = _status_kib()["VmRSS"]
    seen: set[int] = set()
    files_bytes = deep_size(p.files, seen)
    units_bytes = deep_size(p.units, seen)  # InputFiles already counted with files
    return {
        "seconds": seconds,
        "baseline_kib": base,
        "maxrss_before_kib": maxrss_before,
        "maxrss_kib": peak_maxrss,
        "hwm_kib": peak_hwm if hwm_reset else None,
        "rss_after_kib": after,
        "n_documents": p.n_documents,
        "files": len(p.files),
        "units": len(p.units),
        "batches": sum(len(u.batch_ids) for u in p.units),
        "units_bytes": units_bytes,
        "files_bytes": files_bytes,
        "temp_disk_peak": disk.peak,
        "phases": phases,
        "warnings": p.warnings,
    }


def child_counter(folder: Path) -> dict:
    import gc
    from collections import Counter

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # the same imports and config as the prepare child: the same baseline
    from docintel.pipeline import plan as _plan_mod  # noqa: F401
    from docintel.pipeline.config import load_config

    load_config(None, {"run.show_progress": False})
    gc.collect()
    base = _status_kib()["VmRSS"]
    maxrss_before = _maxrss_kib()
    hwm_reset = _reset_hwm()
    t0 = time.perf_counter()
    seen: Counter[str] = Counter()
    paths = sorted(folder.glob("*.parquet"))
    for path in paths:
        col = pq.ParquetFile(path).read(columns=["doc_id"]).column(0)
        seen.update(pc.cast(col, pa.string()).to_pylist())
    duplicates = sum(1 for k in seen.values() if k > 1)
    n_docs = sum(seen.values())
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "baseline_kib": base,
        "maxrss_before_kib": maxrss_before,
        "maxrss_kib": _maxrss_kib(),
        "hwm_kib": _status_kib()["VmHWM"] if hwm_reset else None,
        "rss_after_kib": _status_kib()["VmRSS"],
        "n_documents": n_docs,
        "files": len(paths),
        "duplicates": duplicates,
    }


# --------------------------------------------------------------------------------------
# Driver (parent process)
# --------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[plan_scaling] {msg}", file=sys.stderr, flush=True)


def run_child(child: str, *extra: str) -> dict:
    """Run this script as ``--child CHILD`` in a fresh interpreter; its RESULT line.

    Children are started from this parent, which imports nothing heavy: on Linux a
    child's ``ru_maxrss`` starts at its parent's RSS at fork time, carried through exec.
    """
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", child, *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"{child} child failed (exit {proc.returncode}); see its stderr above")
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise SystemExit(f"{child} child printed no result:\n{proc.stdout[-2000:]}")


def mib(kib: float) -> float:
    return kib / 1024


def peak_kib(r: dict) -> int:
    """Peak RSS during the measured call: VmHWM reset at the baseline, else ru_maxrss
    (which also holds any peak from the imports before the call)."""
    return r["hwm_kib"] or r["maxrss_kib"]


def growth_kib(r: dict) -> int:
    return peak_kib(r) - r["baseline_kib"]


def fmt_row(cells: list[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


RESULTS_HEADER = [
    "size",
    "approach",
    "planning s",
    "peak RSS MiB",
    "RSS growth over baseline MiB",
    "units",
    "batches",
    "baseline RSS MiB",
    "ru_maxrss before -> after MiB",
    "id-check temp disk MiB",
]


def _result_row(r: dict) -> str:
    prep = r["approach"] == "prepare"
    return fmt_row(
        [
            f"{r['size']:,}",
            r["approach"],
            f"{r['seconds']:.1f}",
            f"{mib(peak_kib(r)):.0f}",
            f"{mib(growth_kib(r)):.0f}",
            f"{r['units']:,}" if prep else "-",
            f"{r['batches']:,}" if prep else "-",
            f"{mib(r['baseline_kib']):.0f}",
            f"{mib(r['maxrss_before_kib']):.0f} -> {mib(r['maxrss_kib']):.0f}",
            f"{r['temp_disk_peak'] / MIB:.1f}" if prep else "-",
        ]
    )


def _growth_lines(results: list[dict]) -> list[str]:
    """Per approach, the largest size against the smallest: RSS growth, peak and time."""
    sizes = sorted({r["size"] for r in results})
    if len(sizes) < 2:
        return []
    lo, hi = sizes[0], sizes[-1]
    lines = [""]
    for approach in APPROACHES:
        pair = {r["size"]: r for r in results if r["approach"] == approach}
        if lo in pair and hi in pair:
            g = growth_kib(pair[hi]) / max(growth_kib(pair[lo]), 1)
            p = peak_kib(pair[hi]) / peak_kib(pair[lo])
            t = pair[hi]["seconds"] / pair[lo]["seconds"]
            lines.append(
                f"- {approach}: {hi:,} vs {lo:,} documents ({hi / lo:g}x): RSS growth "
                f"x{g:.2f}, peak RSS x{p:.2f}, time x{t:.2f}"
            )
    return lines


def _phase_table(phase_rows: list[dict]) -> list[str]:
    """``prepare``'s phases: seconds, and VmHWM / VmRSS after each."""
    lines = [
        "",
        fmt_row(["size", "phase", "s", "VmHWM after phase MiB", "VmRSS after phase MiB"]),
        fmt_row(["---:", "---", "---:", "---:", "---:"]),
    ]
    for r in phase_rows:
        for name in PHASES:
            ph = r["phases"].get(name)
            if ph:
                lines.append(
                    fmt_row(
                        [
                            f"{r['size']:,}",
                            name,
                            f"{ph['s']:.2f}",
                            f"{mib(ph['hwm_kib']):.0f}",
                            f"{mib(ph['rss_kib']):.0f}",
                        ]
                    )
                )
    return lines


PLAN_SIZE_HEADER = [
    "size",
    "files",
    "units",
    "batches",
    "units deep size KiB",
    "bytes/unit",
    "bytes/batch",
    "files deep size KiB",
]


def _plan_size_table(phase_rows: list[dict]) -> list[str]:
    """The deep size of ``prepare``'s unit and file lists, per unit and per batch."""
    lines = ["", fmt_row(PLAN_SIZE_HEADER), fmt_row(["---:"] * 8)]
    for r in phase_rows:
        lines.append(
            fmt_row(
                [
                    f"{r['size']:,}",
                    r["files"],
                    f"{r['units']:,}",
                    f"{r['batches']:,}",
                    f"{r['units_bytes'] / 1024:.0f}",
                    f"{r['units_bytes'] / max(r['units'], 1):,.0f}",
                    f"{r['units_bytes'] / max(r['batches'], 1):,.0f}",
                    f"{r['files_bytes'] / 1024:.0f}",
                ]
            )
        )
    return lines


def report(results: list[dict]) -> str:
    lines = [
        fmt_row(RESULTS_HEADER),
        fmt_row(["---:", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:"]),
        *(_result_row(r) for r in results),
        *_growth_lines(results),
    ]
    phase_rows = [r for r in results if r["approach"] == "prepare"]
    if phase_rows:
        lines += [*_phase_table(phase_rows), *_plan_size_table(phase_rows)]
    return "\n".join(lines)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s.replace("_", "")) for s in text.split(",") if s.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--sizes: {e}") from e
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("--sizes: positive integers, comma-separated")
    return sizes


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="Peak driver memory and time of planning a run (docintel.pipeline.run.plan."
        "prepare: model checks, file listing, footers, work units, id check) against the "
        "naive Counter-of-all-ids check, each size in a fresh subprocess.",
        epilog="Run from the repository root: .venv/bin/python bench/plan_scaling.py",
    )
    ap.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(DEFAULT_SIZES),
        help=f"documents per corpus, comma-separated (default {DEFAULT_SIZES})",
    )
    ap.add_argument(
        "--files",
        type=int,
        default=DEFAULT_FILES,
        help=f"Parquet files per corpus (default {DEFAULT_FILES})",
    )
    ap.add_argument(
        "--workdir",
        type=Path,
        default=Path(DEFAULT_WORKDIR),
        help="where the synthetic corpora are written and reused, and where the "
        f"id check spills (default {DEFAULT_WORKDIR})",
    )
    ap.add_argument(
        "--approaches",
        default=",".join(APPROACHES),
        help="which to measure: prepare (the driver's real planning), counter "
        "(the old naive Counter over every id) (default: both)",
    )
    ap.add_argument("--json", type=Path, help="also write the raw results to this JSON file")
    ap.add_argument("--child", choices=("build", *APPROACHES), help=argparse.SUPPRESS)
    ap.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--tmp-dir", type=Path, help=argparse.SUPPRESS)
    return ap


def _child_main(args: argparse.Namespace) -> None:
    """In a child: build the inputs, or run one approach; the result as a RESULT line."""
    if args.child == "build":
        out = {"folder": str(build_inputs(args.workdir, args.sizes[0], args.files))}
    elif args.child == "prepare":
        out = child_prepare(args.folder, args.tmp_dir)
    else:
        out = child_counter(args.folder)
    print(RESULT_PREFIX + json.dumps(out), flush=True)


def _measure(args: argparse.Namespace, approaches: list[str]) -> list[dict]:
    """Every approach at every size, each in a fresh child, the inputs built (or reused)
    by a child first."""
    results = []
    for n in args.sizes:
        where = ["--workdir", str(args.workdir), "--sizes", str(n), "--files", str(args.files)]
        build = run_child("build", *where)
        folder = Path(build["folder"])
        for approach in approaches:
            log(f"{approach}: {n:,} documents ...")
            tmp = args.workdir / f"tmp-{approach}-{n}"
            r = run_child(approach, "--folder", str(folder), "--tmp-dir", str(tmp))
            r.update(size=n, approach=approach)
            if r["n_documents"] != n:
                raise SystemExit(f"{approach} counted {r['n_documents']:,} documents, not {n:,}")
            log(
                f"  {r['seconds']:.1f} s, peak RSS {mib(peak_kib(r)):.0f} MiB "
                f"(baseline {mib(r['baseline_kib']):.0f} MiB)"
            )
            results.append(r)
    return results


def main() -> None:
    ap = _parser()
    args = ap.parse_args()
    if args.child:
        _child_main(args)
        return

    approaches = [a.strip() for a in args.approaches.split(",") if a.strip()]
    if not approaches or any(a not in APPROACHES for a in approaches):
        ap.error(f"--approaches: choose from {', '.join(APPROACHES)}")
    if args.files < 1 or min(args.sizes) < args.files:
        ap.error("--files must be at least 1 and at most the smallest size")
    results = _measure(args, approaches)
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
