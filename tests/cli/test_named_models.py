"""`docintel evaluate default|stock` from outside the checkout (the bundled models are
package data), quiet by default (no framework log lines), and `docintel run --model DIR`
with a freshly trained head and its fine-tuned encoder, without a config file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_exactly_once, write_docs
from tests.finetuned import tiny_labelled, train_tiny

# What TensorFlow, absl, torch and ONNX Runtime print unless --verbose.
NOISE = ("oneDNN", "absl::InitializeLog", "TracerWarning", "onnxruntime", "I0000 ")


def _docintel(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "docintel.jobs.cli", *map(str, args)],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=900, check=False,
    )  # fmt: skip


def test_evaluate_named_models_outside_the_checkout(tmp_path: Path) -> None:
    data = tiny_labelled(tmp_path / "tiny.csv", per_class=4)
    for name in ("default", "stock"):
        r = _docintel("evaluate", name, data.name, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"{name} on tiny.csv: accuracy" in r.stdout
        noise = [line for line in r.stderr.splitlines() if any(n in line for n in NOISE)]
        assert not noise, f"framework lines reached the terminal: {noise}"


@pytest.mark.integration
def test_run_with_a_trained_model_folder(tmp_path: Path) -> None:
    model, _ = train_tiny(tmp_path / "train")
    docs = write_docs(
        tmp_path / "docs.parquet",
        ["a", "b"],
        ["Profits collapsed and the dividend was suspended.", "Shares jumped 10%."],
    )
    out = tmp_path / "out"
    cfg = tmp_path / "fast.toml"  # eager runtimes: no ONNX build for this one-off encoder
    cfg.write_text('[embed]\ncpu_runtime = "torch"\n[classify]\ncpu_runtime = "keras"\n')
    r = _docintel("run", docs, out, "--model", model, "-c", cfg, "--num-cpus", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    tables = assert_exactly_once(out, ["a", "b"])
    assert set(tables["sentences"]["label"]) <= {"Bearish", "Bullish", "Neutral"}
    used = json.loads((out / "_manifest.json").read_text())["config"]
    assert used["classify"]["model_dir"] == str(model.resolve())
    assert used["embed"]["model_path"] == str((model / "encoder").resolve())
