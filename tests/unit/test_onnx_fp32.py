"""The default CPU encoder and classifier: the same weights as fp32 ONNX graphs on ONNX
Runtime.

The encoder is exact to PyTorch fp32 on the whole vendored validation split (cosine >=
0.9999 mean and >= 0.999 min, identical labels); the head gives Keras's labels on every
sentence of it. Each is built once per model version, on first need."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from docintel.pipeline import registry
from docintel.pipeline.artefacts.paths import FP32_MODEL_FILE, classifier_fp32_path
from docintel.pipeline.config import Config, EmbedConfig
from docintel.pipeline.run.layout import CPU_POOL, build_stage, stage_layout
from docintel.pipeline.run.plan import ensure_derived
from docintel.pipeline.schema import (
    BACKEND_CPU_FP32_ONNX,
    EMBEDDING,
    N_TOKENS,
    TEXT,
    TRUNCATED,
)
from docintel.pipeline.stages.classify import Classifier, OnnxClassifier
from docintel.pipeline.stages.embed import Embedder
from docintel.pipeline.stages.embed_int8 import OnnxEmbedder
from tests.unit.conftest import SENT_VALID


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("onnx")
    said: list[str] = []
    cfg = Config().with_overrides({"embed.int8_dir": str(folder)})
    ensure_derived(cfg, said.append)  # the default layout needs it: built once, here
    assert (folder / FP32_MODEL_FILE).is_file()
    assert classifier_fp32_path(folder, cfg.classify.resolved_model_dir()).is_file()
    assert any("building the fused fp32 ONNX encoder" in s for s in said), said
    assert any("building the fp32 ONNX classifier" in s for s in said), said
    again: list[str] = []
    ensure_derived(cfg, again.append)  # cached by version: never built twice
    assert again == []
    return folder


def test_the_default_cpu_embed_replica_runs_the_onnx_graph(onnx_dir: Path) -> None:
    cfg = Config().with_overrides({"embed.int8_dir": str(onnx_dir)})
    (pool,) = stage_layout(cfg)["embed"]
    assert pool.kind == CPU_POOL and pool.precision == "fp32"
    assert isinstance(build_stage(registry.chain(cfg), pool), OnnxEmbedder)
    torch_cfg = cfg.with_overrides({"embed.cpu_runtime": "torch"})
    assert (
        type(build_stage(registry.chain(torch_cfg), stage_layout(torch_cfg)["embed"][0]))
        is Embedder
    )


def test_the_default_cpu_classify_replica_runs_the_onnx_head(onnx_dir: Path) -> None:
    cfg = Config().with_overrides({"embed.int8_dir": str(onnx_dir)})
    (pool,) = stage_layout(cfg)["classify"]
    assert isinstance(build_stage(registry.chain(cfg), pool), OnnxClassifier)
    keras_cfg = cfg.with_overrides({"classify.cpu_runtime": "keras"})
    assert (
        type(build_stage(registry.chain(keras_cfg), stage_layout(keras_cfg)["classify"][0]))
        is Classifier
    )
    # a GPU replica runs Keras on the card whatever the CPU runtime
    gpu_cfg = cfg.with_overrides({"resources.classify.gpu_replicas": 1, "run.num_gpus": 1})
    gpu = next(p for p in stage_layout(gpu_cfg)["classify"] if p.kind == "gpu")
    assert type(build_stage(registry.chain(gpu_cfg), gpu)) is Classifier


def test_onnx_fp32_is_exact_to_torch_on_the_validation_split(
    onnx_dir: Path, embedder: Embedder, classifier
) -> None:
    with SENT_VALID.open(newline="", encoding="utf-8") as f:
        texts = [r["text"] for r in csv.DictReader(f)]
    onnx = OnnxEmbedder(EmbedConfig(), onnx_dir)
    onnx.setup()
    assert onnx.backend == BACKEND_CPU_FP32_ONNX
    assert onnx.version == embedder.version + "+onnx"  # built from the default encoder
    ref = embedder(pa.table({TEXT: texts}))
    got = onnx(pa.table({TEXT: texts}))
    a = np.array(ref[EMBEDDING].to_pylist(), np.float32)
    b = np.array(got[EMBEDDING].to_pylist(), np.float32)
    cos = (a * b).sum(axis=1)
    assert cos.mean() >= 0.9999 and cos.min() >= 0.999, (cos.mean(), cos.min())
    assert got[N_TOKENS].to_pylist() == ref[N_TOKENS].to_pylist()
    assert got[TRUNCATED].to_pylist() == ref[TRUNCATED].to_pylist()
    labels_ref = classifier.predict(a).argmax(axis=1)
    labels_onnx = classifier.predict(b).argmax(axis=1)
    assert (labels_ref == labels_onnx).all(), int((labels_ref != labels_onnx).sum())


def test_onnx_head_gives_the_keras_labels_on_the_validation_split(
    onnx_dir: Path, embedder: Embedder, classifier
) -> None:
    with SENT_VALID.open(newline="", encoding="utf-8") as f:
        texts = [r["text"] for r in csv.DictReader(f)]
    x = np.array(embedder(pa.table({TEXT: texts}))[EMBEDDING].to_pylist(), np.float32)
    head = OnnxClassifier(classifier.cfg, onnx_dir)
    head.setup()
    assert head.backend == BACKEND_CPU_FP32_ONNX
    assert head.version == classifier.version + "+onnx"
    assert head.labels == classifier.labels
    ref, got = classifier.predict(x), head.predict(x)
    assert (ref.argmax(axis=1) == got.argmax(axis=1)).all()
    assert np.abs(ref - got).max() < 1e-5, np.abs(ref - got).max()
