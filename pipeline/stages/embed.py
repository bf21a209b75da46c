"""Sentence embeddings from a BERT-family encoder: the embed stage.

One stage class whatever runs the model: a runtime (encoder_runtimes.py: PyTorch, or ONNX
Runtime over the fused fp32 or the int8 artefact) only runs the forward pass, and the
shared front end (encoder_frontend.py) tokenizes, truncates, packs sentences by token
length under a padded-token budget, and mean-pools and L2-normalises (the
sentence-transformers recipe for all-MiniLM-L6-v2).

The encoder folder is a Hugging Face model folder (the stock MiniLM, any local encoder,
or one fully fine-tuned by `docintel train --fine-tune --method full`), or a LoRA adapter
(``--method lora``) that :func:`load_encoder` merges into its base's weights at load, so
inference costs what the base costs. Either way the version recorded on every row is the
fingerprint of the folder's files (an adapter's ``base.json`` pins its base's version).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from docintel.pipeline.errors import ConfigError
from docintel.pipeline.schema import EMBEDDING, N_TOKENS, TEXT, TRUNCATED
from docintel.pipeline.stages.base import Placement, Stage, usable_cores
from docintel.pipeline.stages.embed_settings import EmbedConfig
from docintel.pipeline.stages.encoder_folder import (
    adapter_base,
    check_encoder_dir,
    embedding_dim,
    is_adapter_dir,
    load_encoder,
)
from docintel.pipeline.stages.encoder_frontend import (
    ENCODE_CHUNK,
    MAX_CHARS_PER_TOKEN,
    EncoderFrontend,
    pack_by_length,
)
from docintel.pipeline.stages.encoder_runtimes import (
    CPU,
    CUDA,
    DEFAULT_RUNTIME,
    RUNTIMES,
    EncoderRuntime,
)

# Re-exported: callers use the encoder-folder helpers and tune the front end's limits
# through this module (tests patch ENCODE_CHUNK).
__all__ = [
    "ENCODE_CHUNK",
    "MAX_CHARS_PER_TOKEN",
    "Embedder",
    "adapter_base",
    "check_encoder_dir",
    "embedding_dim",
    "is_adapter_dir",
    "load_encoder",
    "pack_by_length",
]


class Embedder(Stage):
    """The embed stage: one class whatever runs the model.

    ``runtime`` names an entry of ``RUNTIMES`` (encoder_runtimes.py): ``torch`` (the
    default: the model folder itself, on the CPU or a GPU), ``onnx-fp32`` or ``onnx-int8``
    (the derived ONNX artefacts). The shared front end tokenizes, truncates, packs and
    pools for all of them, so token counts and truncation flags never depend on the
    runtime. ``path``: what the runtime loads (None = its default for ``cfg``);
    ``threads``: 0 = ``[embed] torch_threads``, else the usable cores / ``replicas``.
    """

    name: ClassVar[str] = "embed"
    input_columns: ClassVar[tuple[str, ...]] = (TEXT,)
    output_columns: ClassVar[tuple[str, ...]] = (EMBEDDING, N_TOKENS, TRUNCATED)

    def __init__(
        self,
        cfg: EmbedConfig,
        replicas: int = 1,
        placement: Placement | None = None,
        *,
        runtime: str = DEFAULT_RUNTIME,
        path: Path | None = None,
        threads: int = 0,
    ) -> None:
        if runtime not in RUNTIMES:
            raise ConfigError(
                f"unknown encoder runtime {runtime!r}; expected one of {', '.join(RUNTIMES)}"
            )
        self.cfg = cfg
        self.replicas = replicas
        self.placement = placement or Placement()
        self.runtime_name = runtime
        self.path = path
        self.threads = threads
        self.device = CPU  # the runtime's, after setup(): picks the token budget
        self.runtime: EncoderRuntime | None = None
        self.frontend: EncoderFrontend | None = None
        self.dim = 0

    def setup(self) -> None:
        threads = self.threads or self.cfg.torch_threads or max(1, usable_cores() // self.replicas)
        runtime = RUNTIMES[self.runtime_name](self.cfg, threads, self.placement, self.path)
        runtime.load()
        self.frontend = EncoderFrontend(runtime.tokenizer_dir, self.cfg)
        self.runtime = runtime
        self.backend, self.version = runtime.backend, runtime.version
        self.dim, self.device = runtime.dim, runtime.device

    @property
    def model(self) -> Any:
        """The runtime's model object (the torch module of ``torch``): benchmarks and tests
        inspect or swap it (an fp16 copy, a compiled one)."""
        return self.runtime.model if self.runtime is not None else None

    @model.setter
    def model(self, value: Any) -> None:
        self._loaded()[1].model = value

    @property
    def token_budget(self) -> int:
        """Padded tokens per forward pass: the CUDA budget on a card, else the CPU one."""
        return self.cfg.gpu_token_budget if self.device == CUDA else self.cfg.token_budget

    def _loaded(self) -> tuple[EncoderFrontend, EncoderRuntime]:
        if self.frontend is None or self.runtime is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not run (or teardown() has)")
        return self.frontend, self.runtime

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Embed ``texts``: (float32 [n, dim] unit vectors, token counts, truncated flags)."""
        frontend, runtime = self._loaded()
        budget, max_items = self.token_budget, self.cfg.max_microbatch
        return frontend.encode(texts, runtime.forward, self.dim, budget, max_items)

    def __call__(self, table: pa.Table) -> pa.Table:
        """Embed every sentence, ENCODE_CHUNK per tokenizer call, each cut to
        MAX_CHARS_PER_TOKEN characters per token of max_length first (the front end's
        ``encode_chunked`` says why). ENCODE_CHUNK is read here, at call time, so that
        it can be tuned on this module."""
        frontend, _ = self._loaded()
        texts = table[TEXT].to_pylist()
        vectors, n_tokens, truncated = frontend.encode_chunked(texts, self.encode, ENCODE_CHUNK)
        flat = pa.array(vectors.reshape(-1), type=pa.float32())
        emb = pa.FixedSizeListArray.from_arrays(flat, self.dim)
        for name, col in (
            (EMBEDDING, emb),
            (N_TOKENS, pa.array(n_tokens)),
            (TRUNCATED, pa.array(truncated)),
        ):
            table = table.append_column(name, col)
        return table

    def teardown(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
        self.runtime = None
        self.frontend = None
