"""A run with a fine-tuned encoder and its head (`docintel train --fine-tune`) on a local
Ray: every sentence row records the fine-tuned encoder's version (the fingerprint of its
weights), on the default CPU path (the fused ONNX graph built from the adapter merged into
its base) and on PyTorch; a head paired with another encoder is refused before any work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from docintel.actors.runner import execute
from docintel.pipeline.artefacts.paths import ENCODER_SUBDIR
from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.errors import ModelError
from tests.conftest import REPO, assert_exactly_once, run_config, write_docs
from tests.finetuned import LABEL_NAMES, train_tiny

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, _ = train_tiny(tmp_path_factory.mktemp("ft"), "lora")
    return model


@pytest.fixture
def corpus(tmp_path: Path, headlines: list[str]) -> tuple[Path, list[str]]:
    ids = [f"d{i}" for i in range(6)]
    texts = [" ".join(headlines[3 * i : 3 * i + 3]) for i in range(6)]
    return write_docs(tmp_path / "docs.parquet", ids, texts), ids


@pytest.mark.parametrize(("runtime", "suffix"), [("onnx", "+onnx"), ("torch", "")])
def test_run_records_the_fine_tuned_version(
    tmp_path: Path, tuned: Path, corpus: tuple[Path, list[str]], runtime: str, suffix: str
) -> None:
    path, ids = corpus
    encoder = tuned / ENCODER_SUBDIR
    cfg = run_config(
        **{
            "embed.model_path": str(encoder),
            "embed.cpu_runtime": runtime,
            "classify.model_dir": str(tuned),
        }
    )
    out = tmp_path / "out"
    summary = execute(cfg, str(path), str(out))
    tables: dict[str, Any] = assert_exactly_once(out, ids)
    sentences = tables["sentences"]
    assert len(sentences) > 0 and summary.errors == 0
    version = fingerprint(encoder)
    assert version.startswith("encoder@")
    assert (sentences["embed_model"] == version + suffix).all()
    # the head runs as its fp32 ONNX graph on CPU replicas (the default runtime)
    assert (sentences["classify_model"] == fingerprint(tuned) + "+onnx").all()
    assert set(sentences["label"]) <= set(LABEL_NAMES)


def test_head_of_another_encoder_is_refused_before_work(
    tmp_path: Path, tuned: Path, corpus: tuple[Path, list[str]]
) -> None:
    path, _ = corpus
    cfg = run_config(
        **{
            "embed.model_path": str(tuned / ENCODER_SUBDIR),
            "classify.model_dir": str(REPO / "models" / "finsent"),
        }
    )
    with pytest.raises(ModelError, match="was trained on embeddings of the encoder"):
        execute(cfg, str(path), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "_manifest.json").exists()
