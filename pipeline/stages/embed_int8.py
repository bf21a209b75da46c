"""The int8 CPU encoder: ONNX Runtime over the artefact of `docintel quantize`.

Same contract as the fp32 Embedder (it reuses its ``__call__``): length-sorted packing,
truncation that keeps [CLS] … [SEP], mean pooling and L2 normalisation; no torch import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from docintel.pipeline.artefacts import (
    FP32_MODEL_FILE,
    INT8_MODEL_FILE,
    META_SOURCE_FINGERPRINT,
    RECIPE_FILE,
)
from docintel.pipeline.config import EmbedConfig
from docintel.pipeline.errors import ModelError
from docintel.pipeline.schema import BACKEND_CPU_FP32_ONNX, BACKEND_CPU_INT8
from docintel.pipeline.stages.base import Placement, usable_cores
from docintel.pipeline.stages.embed import Embedder, pack_by_length
from docintel.pipeline.versions import fingerprint


class Frontend:
    """Tokenization, truncation and length-sorted packing exactly as Embedder.encode."""

    def __init__(self, tok_dir: Path, cfg: EmbedConfig) -> None:
        from tokenizers import Tokenizer

        self.cfg = cfg
        self.tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        self.tok.no_truncation()  # truncation is ours, flagged per sentence
        self.tok.no_padding()
        tcfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
        self.max_length = min(cfg.max_length, int(tcfg.get("model_max_length", cfg.max_length)))
        probe = self.tok.encode("a").special_tokens_mask
        self.n_lead = probe.index(0)
        self.n_tail = list(reversed(probe)).index(0)
        self.pad = self.tok.token_to_id(str(tcfg.get("pad_token", "[PAD]"))) or 0

    def prepare(self, texts: list[str]) -> tuple[list[list[int]], np.ndarray]:
        full = [e.ids for e in self.tok.encode_batch(texts)]
        limit = self.max_length
        truncated = np.array([len(x) > limit for x in full], dtype=bool)
        room = limit - self.n_lead - self.n_tail  # keep [CLS] ... [SEP] around a cut body
        ids = [
            x if len(x) <= limit else x[: self.n_lead + room] + x[len(x) - self.n_tail :]
            for x in full
        ]
        return ids, truncated

    def batches(self, ids: list[list[int]]) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
        """(row indices, input_ids int64 [b, w], attention_mask int64 [b, w]) per batch."""
        lengths = [len(x) for x in ids]
        out = []
        for group in pack_by_length(lengths, self.cfg.token_budget, self.cfg.max_microbatch):
            width = lengths[group[0]]
            input_ids = np.full((len(group), width), self.pad, dtype=np.int64)
            mask = np.zeros((len(group), width), dtype=np.int64)
            for row, i in enumerate(group):
                input_ids[row, : lengths[i]] = ids[i]
                mask[row, : lengths[i]] = 1
            out.append((group, input_ids, mask))
        return out


def mean_pool_normalize(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over unmasked tokens, then L2 normalisation (sentence-transformers recipe)."""
    m = mask[..., None].astype(np.float32)
    pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    norm = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return (pooled / norm).astype(np.float32)


class Int8Embedder(Embedder):
    backend: str = BACKEND_CPU_INT8
    name: ClassVar[str] = "embed"

    def __init__(
        self,
        cfg: EmbedConfig,
        artefact_dir: Path,
        replicas: int = 1,
        threads: int = 0,
        model_file: str = INT8_MODEL_FILE,
    ) -> None:
        super().__init__(cfg, replicas=replicas, placement=Placement())
        self.dir = artefact_dir
        self.threads = threads  # 0 = [embed] torch_threads, else the cores / replicas
        self.model_file = model_file  # benchmarks also load other ONNX variants
        self.session: Any = None

    def setup(self) -> None:
        import onnxruntime as ort

        if not (self.dir / self.model_file).is_file():
            raise ModelError(
                f"ONNX encoder {self.dir / self.model_file} does not exist; build it with "
                "`docintel quantize` (a run builds what it needs on the driver first; on a "
                "cluster the cache folder must be one every node sees, or in the image)"
            )
        self.frontend = Frontend(self.dir, self.cfg)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = (
            self.threads or self.cfg.torch_threads or max(1, usable_cores() // self.replicas)
        )
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle intra-op threads sleep instead of spinning: between calls, and while the
        # replica tokenizes, spinning threads would take the cores that the other stages'
        # replicas and the I/O tasks on the same machine need (measured: 5% more
        # sentences/s alone, and fewer CPU-s per sentence).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            str(self.dir / self.model_file), opts, providers=["CPUExecutionProvider"]
        )
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.dim = int(json.loads((self.dir / "config.json").read_text())["hidden_size"])
        recipe_path = self.dir / RECIPE_FILE
        source = (
            json.loads(recipe_path.read_text())["source_fingerprint"]
            if recipe_path.is_file()
            else "unrecorded"
        )
        self.backend = BACKEND_CPU_INT8
        self.version = f"{source}+int8@{fingerprint(self.dir)[-12:]}"

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Embed ``texts``: (float32 [n, dim] unit vectors, token counts, truncated flags)."""
        if not texts:
            return np.zeros((0, self.dim), np.float32), np.zeros(0, np.int32), np.zeros(0, bool)
        ids, truncated = self.frontend.prepare(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for group, input_ids, mask in self.frontend.batches(ids):
            feed = {"input_ids": input_ids, "attention_mask": mask}
            if "token_type_ids" in self.input_names:
                feed["token_type_ids"] = np.zeros_like(input_ids)
            (hidden,) = self.session.run(["last_hidden_state"], feed)
            out[group] = mean_pool_normalize(hidden, mask)
        return out, np.array([len(x) for x in ids], dtype=np.int32), truncated

    def teardown(self) -> None:
        self.session = None


class OnnxEmbedder(Int8Embedder):
    """The same encoder's fp32 weights as a fused ONNX graph on ONNX Runtime: the default
    CPU path. Exact to PyTorch fp32 (cosine 1.0000 on the validation set) and ~1.8x as
    fast on CPUs (bench/quantize_embedder.md, ort-fp32); no torch import."""

    backend: str = BACKEND_CPU_FP32_ONNX

    def __init__(
        self, cfg: EmbedConfig, artefact_dir: Path, replicas: int = 1, threads: int = 0
    ) -> None:
        super().__init__(cfg, artefact_dir, replicas, threads, model_file=FP32_MODEL_FILE)

    def setup(self) -> None:
        super().setup()
        meta = self.session.get_modelmeta().custom_metadata_map
        self.backend = BACKEND_CPU_FP32_ONNX
        self.version = f"{meta.get(META_SOURCE_FINGERPRINT, 'unrecorded')}+onnx"
