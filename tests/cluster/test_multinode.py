"""Cluster tier: a head plus worker nodes on this machine; nodes leave and join mid-run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.cluster.multinode_run import RESULT
from tests.conftest import REPO, assert_exactly_once, write_docs


def _run(mode: str, inp: Path, out: Path) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "tests.cluster.multinode_run", mode, str(inp), str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith(RESULT))
    return json.loads(line[len(RESULT) :])


def test_losing_a_worker_node_loses_nothing(tmp_path: Path, headlines: list[str]) -> None:
    ids = [f"n{i:03d}" for i in range(40)]
    texts = [" ".join(h.rstrip(".") + "." for h in headlines[2 * i : 2 * i + 2]) for i in range(40)]
    inp = write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=4)
    out = tmp_path / "out"
    result = _run("remove", inp, out)
    assert len(result["removed"]) == 1, "no worker node was removed"
    assert result["batches"] == 20 and result["errors"] == 0 and result["documents"] == 40
    assert_exactly_once(out, ids)
    # the manifest's replicas list: the removed node's replicas left, the others served
    gone = [r for r in result["replicas"] if r["node"] == result["removed"][0]]
    assert gone and all(r["left_because"] == "its node left the cluster" for r in gone), gone
    survivors = [r for r in result["replicas"] if r["node"] != result["removed"][0]]
    for stage in ("sentencize", "embed", "classify"):
        assert sum(r["batches"] for r in survivors if r["stage"] == stage) > 0, stage


def test_a_gpu_node_joining_mid_run_gets_replicas_that_serve(
    tmp_path: Path, headlines: list[str]
) -> None:
    n = 600  # long enough (about a minute here) for the new replicas to load and serve
    ids = [f"j{i:04d}" for i in range(n)]
    texts = [
        " ".join(h.rstrip(".") + "." for h in headlines[(8 * i) % 2000 : (8 * i) % 2000 + 8])
        for i in range(n)
    ]
    inp = write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=40)
    out = tmp_path / "out"
    result = _run("join-gpu", inp, out)
    assert len(result["joined"]) == 1
    assert result["errors"] == 0 and result["documents"] == n
    assert_exactly_once(out, ids)
    on_gpu = [r for r in result["replicas"] if r["pool"] == "gpu"]
    assert {r["stage"] for r in on_gpu} == {"sentencize", "embed", "classify"}, on_gpu
    assert all(r["node"] == result["joined"][0] and r["joined"] for r in on_gpu), on_gpu
    for r in on_gpu:
        assert r["batches"] > 0 and r["backend"] == "gpu-sim", r
    assert result["backends"]["embed"].get("gpu-sim", 0) > 0, result["backends"]
    # the encoder replica beyond what the first worker held waited as demand, then joined
    pending = [
        r for r in result["replicas"] if (r["stage"], r["pool"], r["index"]) == ("embed", "cpu", 1)
    ]
    assert len(pending) == 1 and pending[0]["joined"], pending
    assert pending[0]["node"] == result["joined"][0], pending
