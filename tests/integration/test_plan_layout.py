"""The plan carries the cluster's shape and the stage layout: GPUs are detected once per
run (one nvidia-smi), not once per layout computed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from docintel.actors.runner import execute
from tests.conftest import assert_exactly_once, run_config, write_docs

pytestmark = pytest.mark.usefixtures("ray_cluster")

FAKE_SMI = """#!/bin/sh
echo called >> "{log}"
"""


def test_nvidia_smi_runs_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "smi.log"
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(log=log))  # lists no card: a machine without GPUs
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    ids = [f"n{i}" for i in range(6)]
    inp = write_docs(tmp_path / "in.parquet", ids, ["Profits rose. Costs fell."] * 6)
    cfg = run_config(**{"run.run_id": "smi-once", "run.num_gpus": "auto"})
    summary = execute(cfg, str(inp), str(tmp_path / "out"))
    assert summary.documents == len(ids)
    assert_exactly_once(tmp_path / "out", ids)
    assert log.read_text().splitlines() == ["called"]
