"""Cluster tier: a head plus two worker nodes on this machine; a worker node dies mid-run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.cluster.multinode_run import RESULT
from tests.conftest import REPO, assert_exactly_once, write_docs


def test_losing_a_worker_node_loses_nothing(tmp_path: Path, headlines: list[str]) -> None:
    ids = [f"n{i:03d}" for i in range(40)]
    texts = [" ".join(h.rstrip(".") + "." for h in headlines[2 * i : 2 * i + 2]) for i in range(40)]
    inp = write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=4)
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "tests.cluster.multinode_run", str(inp), str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith(RESULT))
    result = json.loads(line[len(RESULT) :])
    assert len(result["removed"]) == 1, "no worker node was removed"
    assert result["batches"] == 20 and result["errors"] == 0 and result["documents"] == 40
    assert_exactly_once(out, ids)
