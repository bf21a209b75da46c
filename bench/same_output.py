"""Does a change keep every output byte for byte? The same run, by two commits, compared.

    python bench/same_output.py                       # main's parent commit vs this tree
    python bench/same_output.py --old 7962d48 --new HEAD --input data/demo/documents.parquet

Each side runs ``docintel run INPUT OUT --run-id same`` (CPU pools, the default models) from
its own tree: a ``git worktree`` of each commit (or this checkout for WORKTREE), imported
through the namespace shim of bench/ab_commits.py (``docintel.pipeline`` ->
``<tree>/pipeline``...). Then every table file is compared: names, bytes, and,
where the bytes differ, the Arrow tables. The manifests are compared key by key, leaving
out what differs by nature (times, paths, the replicas' pids and nodes). Prints a table;
exit 1 when a table file differs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from ab_commits import WORKTREE, drop_tree, make_tree, side_env  # bench/: the script's dir

REPO = Path(__file__).resolve().parents[1]
TABLES = ("documents", "sentences", "errors")
# manifest keys that differ between any two runs of the same thing
VOLATILE = {"finished", "timings", "replicas", "output", "input", "parts"}


def _run(tree: Path, work: Path, inp: Path, out: Path) -> str:
    """Run docintel from ``tree`` into ``out``; the module file it imported (a check)."""
    env = side_env(tree, work)
    code = "import docintel.pipeline, sys; print(docintel.pipeline.__file__)"
    where = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    cmd = [sys.executable, "-m", "docintel.jobs.cli", "run", str(inp), str(out),
           "--run-id", "same", "--no-progress"]  # fmt: skip
    subprocess.run(cmd, env=env, check=True, cwd=tree, capture_output=True)
    return where


def _files(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes()
        for t in TABLES
        for p in sorted((out / t).glob("*.parquet"))
    }


def _compare_tables(old: Path, new: Path) -> list[tuple[str, str]]:
    a, b = _files(old), _files(new)
    rows = []
    for name in sorted(a.keys() | b.keys()):
        if name not in a or name not in b:
            rows.append((name, "only in " + ("new" if name in b else "old")))
        elif a[name] == b[name]:
            rows.append((name, f"identical bytes ({len(a[name]):,} B)"))
        else:
            same = pq.read_table(old / name).equals(pq.read_table(new / name), check_metadata=True)
            rows.append((name, "same rows, other bytes" if same else "DIFFERENT ROWS"))
    return rows


def _diff(a: object, b: object, at: str = "") -> str:
    """Where two JSON values differ (the first few paths)."""
    if isinstance(a, dict) and isinstance(b, dict):
        parts = [_diff(a.get(k), b.get(k), f"{at}.{k}") for k in sorted(a.keys() | b.keys())]
        return "; ".join(p for p in parts if p)[:300]
    return "" if a == b else f"{at or 'value'} {json.dumps(a)} -> {json.dumps(b)}"


def _compare_manifests(old: Path, new: Path) -> list[tuple[str, str]]:
    a = json.loads((old / "_manifest.json").read_text())
    b = json.loads((new / "_manifest.json").read_text())
    rows = []
    for key in sorted((a.keys() | b.keys()) - VOLATILE):
        if a.get(key) != b.get(key):
            rows.append((f"_manifest.json {key}", "differs: " + _diff(a.get(key), b.get(key))))
    return rows or [("_manifest.json", f"same, but for {', '.join(sorted(VOLATILE))}")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", default="HEAD~1", help="the commit before the change")
    ap.add_argument("--new", default=WORKTREE, help="a commit, or WORKTREE (this checkout)")
    ap.add_argument("--input", default=str(REPO / "data/demo/documents.parquet"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="same-output-") as tmp:
        work = Path(tmp)
        outs, trees = {}, {}
        for side, rev in (("old", args.old), ("new", args.new)):
            outs[side] = work / f"out-{side}"
            trees[side] = make_tree(rev, work)
            used = _run(trees[side], work, Path(args.input).resolve(), outs[side])
            print(f"{side}: {rev} (imports {used})")
        rows = _compare_tables(outs["old"], outs["new"]) + _compare_manifests(*outs.values())
        width = max(len(r[0]) for r in rows)
        for name, verdict in rows:
            print(f"{name:<{width}}  {verdict}")
        for tree in trees.values():
            drop_tree(tree)
    return 1 if any("DIFFERENT" in v or "only in" in v for _, v in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
