"""The int8 artefacts: built offline, same contracts as the fp32 stages, close to them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from docintel.pipeline import registry
from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.config import ClassifyConfig, Config, EmbedConfig
from docintel.pipeline.errors import ModelError
from docintel.pipeline.offline.quantize import (
    INT8_MODEL_FILE,
    META_LABELS,
    META_RECIPE,
    META_SOURCE_FINGERPRINT,
    RECIPE_FILE,
    build_int8_classifier,
    classifier_int8_path,
    keras_head_to_onnx,
    parity_report,
)
from docintel.pipeline.run.layout import CPU_POOL, GPU_POOL, build_stage, int8_stages, stage_layout
from docintel.pipeline.run.plan import check_models
from docintel.pipeline.schema import BACKEND_CPU_INT8, EMBEDDING
from docintel.pipeline.stages.classify import Classifier, Int8Classifier, OnnxClassifier
from docintel.pipeline.stages.embed_int8 import Int8Embedder
from tests.conftest import REPO, VALID_CSV

HEAD_DIR = REPO / "models" / "finsent_ft"  # the default head (its encoder: the default one)


@pytest.fixture(scope="module")
def int8_stage(int8_encoder: Path) -> Int8Embedder:
    stage = Int8Embedder(EmbedConfig(), int8_encoder)
    stage.setup()
    return stage


def test_artefact_records_its_recipe(int8_encoder: Path) -> None:
    recipe = json.loads((int8_encoder / RECIPE_FILE).read_text())
    assert (int8_encoder / INT8_MODEL_FILE).is_file()
    assert recipe["source_fingerprint"] == fingerprint(EmbedConfig().resolved_model_path())
    assert recipe["source_fingerprint"].startswith("encoder@")  # the fine-tuned default
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
    assert int8_stage.backend == BACKEND_CPU_INT8 and "+int8@" in int8_stage.version
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


# --- the int8 classifier ------------------------------------------------------------------


@pytest.fixture(scope="module")
def int8_head(int8_encoder: Path) -> Int8Classifier:
    stage = Int8Classifier(ClassifyConfig(), int8_encoder, threads=1)
    stage.setup()
    return stage


@pytest.fixture(scope="module")
def valid_sample(embedder, headlines: list[str]) -> np.ndarray:
    """fp32 embeddings of 600 real validation sentences (the parity sample)."""
    return embedder.encode(headlines[:600])[0]


def test_classifier_artefact_is_keyed_by_version_and_self_describing(
    int8_encoder: Path, tmp_path: Path
) -> None:
    import onnx

    path = classifier_int8_path(int8_encoder, HEAD_DIR)
    assert path.is_file()
    assert path.parent == int8_encoder / "classify"
    assert path.name == f"{fingerprint(HEAD_DIR)}.int8.onnx"
    # the whole artefact is one file: its source, labels and recipe travel inside it
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert meta[META_SOURCE_FINGERPRINT] == fingerprint(HEAD_DIR)
    assert json.loads(meta[META_LABELS]) == ["Bearish", "Bullish", "Neutral"]
    assert json.loads(meta[META_RECIPE])["quantization"]["weights"].startswith("int8 per-channel")
    # int8 weights: under a third of the fp32 .keras file
    assert path.stat().st_size < (HEAD_DIR / "model.keras").stat().st_size / 3
    # offline and deterministic: a rebuild gives the same bytes (and the same version);
    # adding it to an int8 folder leaves that folder's (the encoder's) version alone
    (tmp_path / RECIPE_FILE).write_text("{}")
    before = fingerprint(tmp_path)
    again = build_int8_classifier(HEAD_DIR, tmp_path)
    assert again.read_bytes() == path.read_bytes()
    assert fingerprint(tmp_path) == before
    # no temporary left; the artefact's checksum beside it
    assert sorted(p.name for p in again.parent.iterdir()) == [again.name, f"{again.name}.sha256"]


def test_fp32_conversion_is_exact(classifier, valid_sample: np.ndarray, tmp_path: Path) -> None:
    """The ONNX graph rebuilt from the Keras weights computes what Keras computes; only
    the int8 step changes numbers."""
    import onnx

    from docintel.pipeline.artefacts.paths import CLASSIFIER_MODEL_FILE
    from docintel.pipeline.stages.classify import load_keras

    raw = tmp_path / "head.fp32.onnx"
    onnx.save(keras_head_to_onnx(load_keras(HEAD_DIR / CLASSIFIER_MODEL_FILE), HEAD_DIR), str(raw))
    ort32 = Int8Classifier(ClassifyConfig(), tmp_path, artefact=raw)
    ort32.setup()
    np.testing.assert_allclose(
        ort32.predict(valid_sample), classifier.predict(valid_sample), rtol=0, atol=2e-6
    )


def test_int8_classifier_agrees_with_fp32_and_keeps_the_contract(
    int8_head: Int8Classifier, classifier, valid_sample: np.ndarray
) -> None:
    p8, p32 = int8_head.predict(valid_sample), classifier.predict(valid_sample)
    agree = (p8.argmax(1) == p32.argmax(1)).mean()
    assert agree >= 0.97, f"labels agree on {agree:.1%} of 600 validation sentences"
    assert np.abs(p8 - p32).max() < 0.1
    np.testing.assert_allclose(p8.sum(axis=1), 1.0, atol=1e-4)
    assert int8_head.backend == BACKEND_CPU_INT8 and int8_head.labels == classifier.labels
    assert int8_head.version.startswith(f"{classifier.version}+int8@")
    flat = pa.array(valid_sample[:5].reshape(-1), pa.float32())
    table = pa.table({EMBEDDING: pa.FixedSizeListArray.from_arrays(flat, 384)})
    out8, out32 = int8_head(table), classifier(table)
    assert out8.schema == out32.schema
    assert int8_head(table.slice(0, 0)).num_rows == 0


def test_int8_classifier_runs_without_tensorflow(int8_encoder: Path) -> None:
    """A CPU spill replica never imports TensorFlow (that is most of its memory saving)."""
    code = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "from docintel.pipeline.config import ClassifyConfig\n"
        "from docintel.pipeline.stages.classify import Int8Classifier\n"
        f"s = Int8Classifier(ClassifyConfig(), Path({str(int8_encoder)!r}), threads=1)\n"
        "s.setup()\n"
        "p = s.predict(np.full((4, 384), 0.05, np.float32))\n"
        "assert p.shape == (4, 3), p.shape\n"
        "print(sorted(m for m in ('tensorflow', 'keras', 'torch') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_parity_report_covers_classifier_and_end_to_end(int8_encoder: Path, tmp_path: Path) -> None:
    import pandas as pd

    sample = tmp_path / "valid_sample.csv"
    pd.read_csv(VALID_CSV).iloc[::12].to_csv(sample, index=False)  # 199 rows, every label
    report = parity_report(int8_encoder, EmbedConfig(), HEAD_DIR, sample)
    assert report["n"] == 199
    assert set(report) >= {"encoder", "classifier", "end_to_end", "macro_f1_fp32"}
    assert report["encoder"]["cosine_mean"] >= 0.99
    assert report["classifier"]["labels_agree"] >= 0.97
    assert report["end_to_end"]["labels_agree"] >= 0.95
    for part in ("encoder", "classifier", "end_to_end"):
        drop = report[part]["macro_f1_drop"]
        assert drop == pytest.approx(report["macro_f1_fp32"] - report[part]["macro_f1_int8"])
        assert abs(drop) < 0.04  # 199 sentences: one flipped label moves F1 by ~0.005


def test_missing_or_stale_classifier_artefact_is_refused(
    int8_encoder: Path, tmp_path: Path
) -> None:
    # encoder without GPU replicas (fp32 CPU pool), classifier with them (int8 spill pool):
    # the driver asks only for what the layout runs, and names the classifier's file
    cfg = Config().with_overrides(
        {"embed.int8_dir": str(tmp_path / "empty"), "resources.classify.gpu_replicas": 1}
    )
    with pytest.raises(ModelError, match="docintel quantize") as exc:
        check_models(cfg)
    assert "classify" in str(exc.value) and fingerprint(HEAD_DIR) in str(exc.value)
    with pytest.raises(ModelError, match="docintel quantize"):
        Int8Classifier(cfg.classify, tmp_path / "empty").setup()
    # the same layout with the artefact in place passes the driver's check
    ok = cfg.with_overrides({"embed.int8_dir": str(int8_encoder)})
    check_models(ok)
    # an int8 file that was built from another classifier version is refused at load
    other = tmp_path / "other-head"
    shutil.copytree(HEAD_DIR, other)
    stale = classifier_int8_path(tmp_path / "int8", other)
    stale.parent.mkdir(parents=True)
    shutil.copy(classifier_int8_path(int8_encoder, HEAD_DIR), stale)
    with pytest.raises(ModelError, match="was built from finsent_ft@"):
        Int8Classifier(ClassifyConfig(model_dir=str(other)), tmp_path / "int8").setup()
    # a truncated or corrupt file: a ModelError naming it, not ORT's own exception type
    stale.write_bytes(b"not an onnx file")
    with pytest.raises(ModelError, match=re.escape(f"could not load the int8 classifier {stale}")):
        Int8Classifier(ClassifyConfig(model_dir=str(other)), tmp_path / "int8").setup()


def test_unsupported_head_is_refused_naming_the_layer(tmp_path: Path) -> None:
    import keras

    inputs = keras.Input(shape=(8,), name="embedding")
    h = keras.layers.LayerNormalization(name="odd_norm")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="p")(h))
    with pytest.raises(ModelError, match="'odd_norm' is a LayerNormalization"):
        keras_head_to_onnx(model, tmp_path / "model.keras")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"resources.classify.gpu_replicas": 1}, Int8Classifier),  # a spill pool
        ({"resources.classify.gpu_replicas": 1, "run.spill": "cpu-only"}, OnnxClassifier),
        ({"resources.classify.gpu_replicas": 1, "embed.cpu_precision": "fp32"}, OnnxClassifier),
        ({}, OnnxClassifier),  # no GPU replicas: the CPU pool is the main path, fp32 (ONNX)
        ({"classify.cpu_runtime": "keras"}, Classifier),
        ({"embed.cpu_precision": "int8"}, Int8Classifier),
    ],
)
def test_cpu_classify_replicas_run_int8_where_they_are_a_spill_pool(
    overrides: dict[str, object], expected: type, tmp_path: Path
) -> None:
    cfg = Config().with_overrides({"embed.int8_dir": str(tmp_path), **overrides})
    layout = stage_layout(cfg)
    pools = {p.kind: p for p in layout["classify"]}
    assert type(build_stage(registry.chain(cfg), pools[CPU_POOL])) is expected
    if GPU_POOL in pools:  # GPU replicas always run the Keras head
        assert type(build_stage(registry.chain(cfg), pools[GPU_POOL])) is Classifier
    assert ("classify" in int8_stages(layout)) == (expected is Int8Classifier)
    assert all(p.precision == "fp32" for p in layout["sentencize"])  # no weights
