"""The default CPU encoder: the same weights as a fused fp32 ONNX graph on ONNX Runtime.

Exact to PyTorch fp32 on the whole vendored validation split (cosine >= 0.9999 mean and
>= 0.999 min, identical labels), built once per encoder version, on first need."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from docintel.pipeline.artefacts import FP32_MODEL_FILE
from docintel.pipeline.config import Config, EmbedConfig
from docintel.pipeline.layout import CPU_POOL, build_stage, stage_layout
from docintel.pipeline.plan import ensure_derived
from docintel.pipeline.schema import BACKEND_CPU_FP32, EMBEDDING, N_TOKENS, TEXT, TRUNCATED
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
    assert any("building the fused fp32 ONNX encoder" in s for s in said), said
    again: list[str] = []
    ensure_derived(cfg, again.append)  # cached by version: never built twice
    assert again == []
    return folder


def test_the_default_cpu_embed_replica_runs_the_onnx_graph(onnx_dir: Path) -> None:
    cfg = Config().with_overrides({"embed.int8_dir": str(onnx_dir)})
    (pool,) = stage_layout(cfg)["embed"]
    assert pool.kind == CPU_POOL and pool.precision == "fp32"
    assert isinstance(build_stage(cfg, pool), OnnxEmbedder)
    torch_cfg = cfg.with_overrides({"embed.cpu_runtime": "torch"})
    assert type(build_stage(torch_cfg, stage_layout(torch_cfg)["embed"][0])) is Embedder


def test_onnx_fp32_is_exact_to_torch_on_the_validation_split(
    onnx_dir: Path, embedder: Embedder, classifier
) -> None:
    with SENT_VALID.open(newline="", encoding="utf-8") as f:
        texts = [r["text"] for r in csv.DictReader(f)]
    onnx = OnnxEmbedder(EmbedConfig(), onnx_dir)
    onnx.setup()
    assert onnx.backend == BACKEND_CPU_FP32
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
