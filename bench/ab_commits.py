"""A/B of two commits' embed stage: the same sentences, alternating runs, CPU seconds.

    python bench/ab_commits.py --old dd853ca --new HEAD
    python bench/ab_commits.py --old dd853ca --new WORKTREE --rounds 5 --threads 1
    python bench/ab_commits.py --old dd853ca --new HEAD --pipeline    # whole runs instead

Each side is a fresh process importing its commit's code: a detached ``git worktree``
(or this checkout, for WORKTREE), through a namespace shim on PYTHONPATH
(``docintel.pipeline`` -> ``<tree>/pipeline``...), as bench/same_output.py does.

Stage mode (the default): each side builds the CPU default embed stage (``OnnxEmbedder``:
the fused fp32 ONNX graph on ONNX Runtime) over ONE ONNX file for both sides (the default
artefact folder of ``--new``'s default model; build it with `docintel quantize`), embeds
64 sentences to warm up, then all of them, timed: the process's CPU seconds over the call
(``time.process_time``: every thread; far steadier than wall time on a shared machine)
and its wall seconds. Rounds alternate the order (old-new, new-old, ...). The two sides'
embeddings are compared (max |diff|): the same code path must give the same vectors.

Pipeline mode (``--pipeline``): each side runs ``docintel run`` on the documents with its own
default model and artefacts (as a user would); reported: the manifest's embed stage seconds
and wall seconds, the embed replica's CPU seconds and the whole process tree's (sampled by
bench/common.py's TreeSampler), and the driver's CPU seconds, in total and per document.
The driver is this script's ``--child-run`` process calling the side's CLI in-process, so
its CPU is exact: ``time.process_time()`` (every thread of the driver, from interpreter
start: imports, planning, Ray start, dispatch, commit, shutdown) read by the last exit
handler, after Ray's own; the Ray daemons and workers it starts are not in it.

Input: ``--input`` documents (default: ``--docs`` 300 documents of 17 headlines each, the
corpus of bench/pipeline_vs_loop.py --corpus long: 5,175 sentences), split into sentences by this
checkout's sentencizer. Results: bench/ab_commits.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("pipeline", "actors", "jobs", "models")
WORKTREE = "WORKTREE"  # --new: this checkout, uncommitted changes included
WARM_UP = 64  # sentences embedded before the timed call (first-call allocations)
SAMPLE_S = 0.5  # pipeline mode: process-tree sampling period
RUN_ID = "ab"


# --------------------------------------------------------------------------------------
# The two trees
# --------------------------------------------------------------------------------------


def make_tree(rev: str, work: Path) -> Path:
    """A checkout of ``rev``: this tree for WORKTREE, else a detached git worktree."""
    if rev == WORKTREE:
        return REPO
    where = work / f"tree-{rev}"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(where), rev],
                   check=True, capture_output=True)  # fmt: skip
    return where


def drop_tree(tree: Path) -> None:
    if tree != REPO:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                       check=False, capture_output=True)  # fmt: skip


def side_env(tree: Path, work: Path) -> dict[str, str]:
    """The environment that makes ``import docintel`` load ``tree``'s code (a shim folder
    whose ``docintel/<folder>`` links to the tree's folders, first on PYTHONPATH)."""
    shim = work / f"shim-{tree.name}"
    (shim / "docintel").mkdir(parents=True, exist_ok=True)
    for name in FOLDERS:
        link = shim / "docintel" / name
        if not link.exists():
            link.symlink_to(tree / name, target_is_directory=True)
    # the run's workers get this too, as the cluster's WORKER_ENV
    return {**os.environ, "PYTHONPATH": str(shim), "TOKENIZERS_PARALLELISM": "false"}


def in_side(env: dict[str, str], tree: Path, args: list[str]) -> dict:
    """Run this script with ``args`` in a side's environment; its last stdout line, parsed."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    done = subprocess.run(cmd, check=False, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------
# Inside a side's process (imports that side's docintel)
# --------------------------------------------------------------------------------------


def child_artefact() -> dict:
    """The default ONNX artefact folder of this side's default model."""
    from docintel.pipeline.config import Config

    folder = Config().embed.resolved_int8_dir()
    return {"folder": str(folder), "exists": (folder / "model.fp32.onnx").is_file()}


def child_stage(texts_file: str, folder: str, threads: int, save: str) -> dict:
    """Embed every sentence of ``texts_file`` with this side's ONNX fp32 embed stage."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    import docintel.pipeline
    from docintel.pipeline.config import Config
    from docintel.pipeline.stages.embed_int8 import OnnxEmbedder

    texts = pq.read_table(texts_file).column("text").to_pylist()
    stage = OnnxEmbedder(Config().embed, Path(folder), replicas=1, threads=threads)
    c0 = time.process_time()
    stage.setup()
    setup_cpu = time.process_time() - c0
    stage(pa.table({"text": texts[:WARM_UP]}))
    c0, w0 = time.process_time(), time.perf_counter()
    out = stage(pa.table({"text": texts}))
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    emb = out.column("embedding").combine_chunks().flatten().to_numpy()
    np.save(save, emb.reshape(len(texts), -1))
    code = str(Path(docintel.pipeline.__file__).parent)
    return {"cpu": cpu, "wall": wall, "setup_cpu": setup_cpu, "n": len(texts), "code": code}


def child_run(docs: str, out: str) -> None:
    """Be the driver of a side's ``docintel run``; at exit, print its own CPU seconds.

    The handler is registered before docintel (and Ray, which registers its shutdown at
    import) is imported, so it runs last: the driver's whole life is counted."""
    import atexit

    def report() -> None:
        print(json.dumps({"driver_cpu": time.process_time()}), flush=True)

    atexit.register(report)
    from docintel.jobs.cli import app

    app(["run", docs, out, "--run-id", RUN_ID, "--no-progress"], prog_name="docintel")


# --------------------------------------------------------------------------------------
# Input
# --------------------------------------------------------------------------------------


def documents(path: str | None, n_docs: int, work: Path) -> Path:
    """The documents file: ``path``, or ``n_docs`` long-headline documents built into
    ``work``."""
    if path:
        return Path(path).resolve()
    from pipeline_vs_loop import build_long_corpus  # bench/ is on sys.path (script dir)

    target = work / f"long-{n_docs}x17.parquet"
    build_long_corpus(n_docs, 17, target)
    return target


def sentences(docs: Path, work: Path) -> Path:
    """The documents split by this checkout's sentencizer, as a one-column file."""
    import pyarrow.parquet as pq

    from docintel.pipeline.stages.sentencize import SentencizeConfig, Sentencizer

    stage = Sentencizer(SentencizeConfig())
    stage.setup()
    target = work / "sentences.parquet"
    pq.write_table(stage(pq.read_table(docs)).select(["text"]), target)
    return target


# --------------------------------------------------------------------------------------
# Rounds
# --------------------------------------------------------------------------------------


def orders(rounds: int) -> list[tuple[int, str]]:
    """(round, side) in run order: old-new, new-old, old-new, ..."""
    out = []
    for r in range(1, rounds + 1):
        pair = ("old", "new") if r % 2 else ("new", "old")
        out += [(r, side) for side in pair]
    return out


def stage_rounds(args: argparse.Namespace, sides: dict, texts: Path, work: Path) -> list[dict]:
    """The stage A/B: one row per (round, side); embeddings saved as <work>/emb-<side>.npy."""
    folder = args.artefact or in_side(*sides["new"], ["--child-artefact"])["folder"]
    if not (Path(folder) / "model.fp32.onnx").is_file():
        raise SystemExit(f"no {folder}/model.fp32.onnx: build it with `docintel quantize`")
    rows = []
    for r, side in orders(args.rounds):
        save = str(work / f"emb-{side}.npy")
        child = ["--child-stage", str(texts), folder, str(args.threads), save]
        row = in_side(*sides[side], child)
        rows.append({"round": r, "side": side, **row})
        print(f"  round {r} {side}: {row['cpu']:.1f} CPU-s, {row['wall']:.1f} s", flush=True)
    return rows


def pipeline_run(env: dict[str, str], tree: Path, docs: Path, out: Path) -> dict:
    """One ``docintel run`` of a side (its driver: ``--child-run``), its process tree
    sampled for CPU seconds, the driver's own CPU as it reports it at exit."""
    import pyarrow.parquet as pq
    from common import TreeSampler

    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-run", str(docs), str(out)]
    proc = subprocess.Popen(cmd, env=env, cwd=tree, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    sampler = TreeSampler(proc.pid, SAMPLE_S, detail=True)
    sampler.start()
    stdout, err = proc.communicate()
    peak = sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"docintel run ({tree}) failed:\n{err[-3000:]}")
    driver_cpu = json.loads(stdout.strip().splitlines()[-1])["driver_cpu"]
    manifest = json.loads((out / "_manifest.json").read_text())
    # the embed replica: the manifest's pid (newer manifests), else its actor's title
    pids = {r.get("pid") for r in manifest["replicas"] if r["stage"] == "embed"} - {None}
    embed_cpu: dict[int, float] = {}
    for sample in peak.timeline:
        for p in sample.procs:
            if p.pid in pids or "embed" in p.label.lower():
                embed_cpu[p.pid] = max(embed_cpu.get(p.pid, 0.0), p.cpu_s)
    timings = manifest["timings"]
    n_docs = pq.ParquetFile(docs).metadata.num_rows
    return {"cpu": sum(embed_cpu.values()), "wall": timings["stage_seconds"]["embed"],
            "run_wall": timings["wall_seconds"], "tree_cpu": peak.cpu_s,
            "driver_cpu": driver_cpu, "driver_ms_doc": driver_cpu / n_docs * 1e3,
            "sentences": manifest["counts"]["sentences"]}  # fmt: skip


def pipeline_rounds(args: argparse.Namespace, sides: dict, docs: Path, work: Path) -> list[dict]:
    rows = []
    for r, side in orders(args.rounds):
        row = pipeline_run(*sides[side], docs, work / f"out-{r}-{side}")
        rows.append({"round": r, "side": side, **row})
        print(f"  round {r} {side}: embed {row['cpu']:.1f} CPU-s, {row['wall']:.1f} s; "
              f"run {row['run_wall']:.1f} s, {row['tree_cpu']:.1f} CPU-s; "
              f"driver {row['driver_cpu']:.2f} CPU-s", flush=True)  # fmt: skip
    return rows


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def table(rows: list[dict], revs: dict[str, str], pipeline: bool) -> str:
    """Markdown: one row per run, then each side's median and range (min-max), new/old."""
    cols = ["cpu", "wall"]
    names = {"cpu": "embed CPU s", "wall": "embed wall s"}
    if pipeline:  # the replica's whole process (imports, model load) and the stage's time
        cols += ["run_wall", "tree_cpu", "driver_cpu", "driver_ms_doc", "sentences"]
        names = {"cpu": "embed replica CPU s", "wall": "embed stage s", "run_wall": "run wall s",
                 "tree_cpu": "run tree CPU s", "driver_cpu": "driver CPU s",
                 "driver_ms_doc": "driver CPU ms/doc", "sentences": "sentences"}  # fmt: skip
    head = ["round", "side", *(names[c] for c in cols)]
    lines = ["| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for row in rows:
        vals = [str(row["round"]), f"{row['side']} ({revs[row['side']]})"]
        lines.append("| " + " | ".join(vals + [_cell(row[c]) for c in cols]) + " |")
    med = {}
    for s in ("old", "new"):
        runs = {c: [r[c] for r in rows if r["side"] == s] for c in cols}
        med[s] = {c: statistics.median(v) for c, v in runs.items()}
        lines.append(f"| median | {s} | " + " | ".join(_cell(med[s][c]) for c in cols) + " |")
        spread = [f"{_cell(min(v))}-{_cell(max(v))}" for v in runs.values()]
        lines.append(f"| range | {s} | " + " | ".join(spread) + " |")
    ratio = [f"**{med['new'][c] / med['old'][c]:.3f}**" for c in cols]
    lines.append("| new / old | | " + " | ".join(ratio) + " |")
    return "\n".join(lines)


def _cell(value: float) -> str:
    """A count as a whole number, a measurement with two decimals."""
    return f"{value:,}" if isinstance(value, int) else f"{value:.2f}"


def same_vectors(work: Path) -> str:
    import numpy as np

    a, b = np.load(work / "emb-old.npy"), np.load(work / "emb-new.npy")
    if a.shape != b.shape:
        return f"embeddings: shapes differ, {a.shape} vs {b.shape}"
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    same = "bit-identical" if np.array_equal(a, b) else "not identical"
    return f"embeddings old vs new: {a.shape[0]:,} x {a.shape[1]}, max |diff| {diff:.3g} ({same})"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", default="dd853ca", help="the commit before the change")
    ap.add_argument("--new", default="HEAD", help=f"a commit, or {WORKTREE} (this checkout)")
    ap.add_argument("--input", help="documents (doc_id, text); default: --docs long documents")
    ap.add_argument("--docs", type=int, default=300, help="long documents built (default 300)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="stage mode: ORT intra-op threads")
    ap.add_argument("--artefact", help="stage mode: the ONNX folder (default: --new's)")
    ap.add_argument("--pipeline", action="store_true", help="whole `docintel run`s instead")
    ap.add_argument("--child-artefact", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-stage", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--child-run", nargs=2, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.child_run:  # the driver of a side's run: docintel's CLI exits this process
        child_run(*args.child_run)
        return 0
    if args.child_artefact or args.child_stage:  # inside a side's process
        c = args.child_stage
        result = (
            child_artefact() if args.child_artefact else child_stage(c[0], c[1], int(c[2]), c[3])
        )
        print(json.dumps(result))
        return 0
    revs = {"old": args.old, "new": args.new}
    with tempfile.TemporaryDirectory(prefix="ab-commits-") as tmp:
        work = Path(tmp)
        trees = {s: make_tree(rev, work) for s, rev in revs.items()}
        try:
            sides = {s: (side_env(t, work), t) for s, t in trees.items()}
            docs = documents(args.input, args.docs, work)
            if args.pipeline:
                rows = pipeline_rounds(args, sides, docs, work)
                note = "each side's own default model and artefacts"
            else:
                texts = sentences(docs, work)
                rows = stage_rounds(args, sides, texts, work)
                note = f"{args.threads} ORT threads; " + same_vectors(work)
        finally:
            for tree in trees.values():
                drop_tree(tree)
    print(f"\n{'pipeline' if args.pipeline else 'stage'} A/B, {note}\n")
    print(table(rows, revs, args.pipeline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
