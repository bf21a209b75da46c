"""Row-group shape: the same documents as one row group vs one row group per document.

Before the fix, every read task re-parsed its file's whole footer and every row group was
its own task, so N one-row row groups cost O(N**2) footer parsing (5.8x slower at 2,000).
Work units now merge small row groups up to a batch, so the two shapes should cost about
the same. Target: 2,000 one-row row groups <= 1.5x the time of one row group.

Each measurement is a full `docintel run` (embedded Ray, start-up included) in its own
process; the two shapes alternate, ``--pairs`` times, and the table reports each run and
the median ratio.

    .venv/bin/python bench/rowgroups.py --docs 2000 --pairs 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEMO_CORPUS, docintel_executable, machine_lines, md_row


def build(docs: int, folder: Path) -> dict[str, Path]:
    """The first ``docs`` demo sentences-worth of short documents, in both shapes."""
    demo = pq.read_table(DEMO_CORPUS)
    texts = [t.split(". ")[0] + "." for t in demo["text"].to_pylist()]
    texts = (texts * (docs // len(texts) + 1))[:docs]
    table = pa.table({"doc_id": [f"d{i:06d}" for i in range(docs)], "text": texts})
    shapes = {"one row group": docs, "one row per row group": 1}
    paths = {}
    for name, size in shapes.items():
        path = folder / f"{size}.parquet"
        pq.write_table(table, path, row_group_size=size)
        paths[name] = path
    return paths


def run(path: Path, out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [docintel_executable(), "run", str(path), str(out), "--no-progress", "--no-embeddings"],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=2000, help="documents in each shape")
    ap.add_argument("--pairs", type=int, default=3, help="alternating pairs of runs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="docintel-rg-") as tmp:
        paths = build(args.docs, Path(tmp))
        times: dict[str, list[float]] = {name: [] for name in paths}
        for i in range(args.pairs):
            for name, path in paths.items():
                times[name].append(run(path, Path(tmp) / f"out-{i}-{path.stem}"))
    one, many = (statistics.median(t) for t in times.values())
    print("\n".join(machine_lines()))
    print(f"\n{args.docs:,} documents, {args.pairs} alternating pairs, full `docintel run`\n")
    print(md_row(["shape", "runs (s)", "median s"]))
    print(md_row(["---", "---", "---:"]))
    for name, t in times.items():
        print(md_row([name, ", ".join(f"{x:.1f}" for x in t), f"{statistics.median(t):.1f}"]))
    print(f"\nratio one-row row groups / one row group: {many / one:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
