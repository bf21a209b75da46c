"""Compaction cost: small batch parts merged into files of about ``run.part_target_mb``.

Writes the parts of ``--batches`` batches as a run would (``documents``, ``sentences`` with
384-d float32 embeddings, ``errors``: the real schemas, through ``docintel.pipeline.output.sink``),
then merges them with the run's own code (``pipeline/output/compact.py``: plan, merge each group,
delete the members), one group at a time in this process, and prints files before and
after, bytes, and the merge throughput. The run does the same on its I/O tasks, several
groups at once.

    .venv/bin/python bench/compaction.py --batches 200 --docs-per-batch 128 --target-mb 64
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import load_average, machine_lines  # noqa: E402
from docintel.pipeline import compact  # noqa: E402
from docintel.pipeline.batch import Batch  # noqa: E402
from docintel.pipeline.formats.parquet import write_batch  # noqa: E402
from docintel.pipeline.output.sink import TABLES  # noqa: E402
from docintel.pipeline.schema import empty_errors  # noqa: E402

LABELS = ["Bearish", "Bullish", "Neutral"]
DIM = 384
SENTENCES_PER_DOC = 10


def fake_batch(k: int, docs: int, rng: np.random.Generator) -> Batch:
    ids = [f"doc-{k:05d}-{i:04d}" for i in range(docs)]
    n = docs * SENTENCES_PER_DOC
    doc_of = np.repeat(np.arange(docs), SENTENCES_PER_DOC)
    emb = rng.standard_normal((n, DIM), dtype=np.float32)
    probs = rng.dirichlet(np.ones(len(LABELS)), n).astype(np.float32)
    text = [f"Sentence {j} of a document about markets and earnings." for j in range(n)]
    table = pa.table(
        {
            "doc_id": pa.array([ids[d] for d in doc_of]),
            "sent_index": pa.array(np.tile(np.arange(SENTENCES_PER_DOC), docs), pa.int32()),
            "start_char": pa.array(np.zeros(n, np.int64)),
            "end_char": pa.array(np.full(n, 50, np.int64)),
            "text": pa.array(text),
            "n_tokens": pa.array(np.full(n, 12, np.int32)),
            "truncated": pa.array(np.zeros(n, bool)),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), DIM),
            "label": pa.array([LABELS[i] for i in probs.argmax(1)]),
            "score": pa.array(probs.max(1)),
            "probs": pa.FixedSizeListArray.from_arrays(pa.array(probs.ravel()), len(LABELS)),
        }
    )
    return Batch(
        batch_id=f"{k:012x}-00000-{k:05d}",
        doc_ids=pa.array(ids),
        table=table,
        errors=empty_errors(),
        backends=dict.fromkeys(("sentencize", "embed", "classify"), "cpu-fp32"),
        versions=dict.fromkeys(("sentencize", "embed", "classify"), "bench"),
    )


def count(root: Path) -> tuple[int, int]:
    files = [p for t in TABLES for p in (root / t).glob("*.parquet")]
    return len(files), sum(p.stat().st_size for p in files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--docs-per-batch", type=int, default=128)
    ap.add_argument("--target-mb", type=float, default=64.0)
    args = ap.parse_args()
    fs = pafs.LocalFileSystem()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "out"
        t0 = time.perf_counter()
        for k in range(args.batches):
            write_batch(fs, str(root), fake_batch(k, args.docs_per_batch, rng), LABELS, True)
        t_write = time.perf_counter() - t0
        files0, bytes0 = count(root)
        t0 = time.perf_counter()
        groups = compact.plan_groups(fs, str(root), int(args.target_mb * 2**20))
        for g in groups:
            compact.merge_group(fs, str(root), g)
        t_merge = time.perf_counter() - t0
        files1, bytes1 = count(root)
    mb = bytes0 / 2**20
    print("\n".join(machine_lines()))
    print(f"load average at the end: {load_average()}")
    print()
    print(
        "| batches | docs/batch | target MiB | files before | files after | MiB before |"
        " MiB after | write s | merge s | merge MiB/s | merge / write |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {args.batches} | {args.docs_per_batch} | {args.target_mb:g} | {files0} | {files1} "
        f"| {mb:.1f} | {bytes1 / 2**20:.1f} | {t_write:.1f} | {t_merge:.1f} "
        f"| {mb / max(t_merge, 1e-9):.0f} | {t_merge / max(t_write, 1e-9):.2f} |"
    )


if __name__ == "__main__":
    main()
