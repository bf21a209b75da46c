"""One backend vocabulary: the config's ``cpu_runtime`` values, the registry's backends and
the encoder runtimes use the same keys, and a row's label is derived from its key by one
function (the labels written in outputs are unchanged)."""

from __future__ import annotations

import typing

import pytest

from docintel.pipeline import registry, schema
from docintel.pipeline.config import ClassifyConfig, EmbedConfig, load_config
from docintel.pipeline.search.query import query_embedder
from docintel.pipeline.stages.encoder_runtimes import RUNTIMES


def _values(model: type, field: str) -> set[str]:
    return set(typing.get_args(model.model_fields[field].annotation))


def test_config_registry_and_runtimes_share_their_keys() -> None:
    assert set(registry.EMBED.backends) == set(RUNTIMES)
    assert _values(EmbedConfig, "cpu_runtime") <= set(registry.EMBED.backends)
    assert _values(ClassifyConfig, "cpu_runtime") <= set(registry.CLASSIFY.backends)
    assert set(registry.SENTENCIZE.backends) == {schema.SPACY}


def test_todays_config_values_still_work() -> None:
    cfg = load_config(None, {"embed.cpu_runtime": "onnx", "classify.cpu_runtime": "onnx"})
    assert cfg.embed.cpu_runtime == cfg.classify.cpu_runtime == schema.ONNX_FP32
    assert EmbedConfig().cpu_runtime == ClassifyConfig().cpu_runtime == schema.ONNX_FP32
    cfg = load_config(None, {"embed.cpu_runtime": "torch", "classify.cpu_runtime": "keras"})
    assert (cfg.embed.cpu_runtime, cfg.classify.cpu_runtime) == (schema.TORCH, schema.KERAS)


@pytest.mark.parametrize(
    ("key", "where", "label"),
    [
        (schema.ONNX_FP32, {}, "cpu-fp32-onnx"),
        (schema.ONNX_INT8, {}, "cpu-int8"),
        (schema.TORCH, {}, "cpu-fp32"),
        (schema.KERAS, {"gpu": True}, "gpu-sim"),
        (schema.TORCH, {"gpu": True, "cuda": True, "dtype": "fp16"}, "gpu-fp16"),
        (schema.TORCH, {"gpu": True, "cuda": True, "dtype": "bf16"}, "gpu-bf16"),
        (schema.KERAS, {"gpu": True, "cuda": True}, "gpu-fp32"),
        (schema.SPACY, {}, "cpu-fp32"),
        (schema.USER, {"gpu": True}, "gpu-sim"),
    ],
)
def test_row_labels_come_from_the_key(key: str, where: dict, label: str) -> None:
    assert schema.backend_label(key, **where) == label


def test_search_embeds_queries_with_the_registrys_choice() -> None:
    key, stage = query_embedder(EmbedConfig())
    assert key == schema.ONNX_FP32 and stage.runtime_name == schema.ONNX_FP32
    key, stage = query_embedder(EmbedConfig(cpu_runtime="torch"))
    assert key == schema.TORCH and stage.runtime_name == schema.TORCH
