"""Encoder runtimes: what runs the model, and nothing else.

A runtime loads one encoder and maps padded token ids to its last hidden state. Everything
around that (tokenization, truncation, packing, pooling) is the shared front end
(encoder_frontend.py), so adding a runtime (OpenVINO, TensorRT, a remote server) is one
``EncoderRuntime`` subclass plus one line in ``RUNTIMES``; the stage that uses them picks
one by name. Heavy frameworks are imported in ``load()`` only.
"""

from __future__ import annotations

import inspect
import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from docintel.pipeline.artefacts.paths import (
    FP32_MODEL_FILE,
    INT8_MODEL_FILE,
    META_SOURCE_FINGERPRINT,
    RECIPE_FILE,
)
from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.errors import ModelError
from docintel.pipeline.schema import ONNX_FP32, ONNX_INT8, TORCH, backend_label
from docintel.pipeline.stages.base import Placement
from docintel.pipeline.stages.embed_settings import EmbedConfig
from docintel.pipeline.stages.encoder_folder import check_encoder_dir, load_encoder
from docintel.pipeline.stages.onnx_session import onnx_session

CPU, CUDA = "cpu", "cuda"  # EncoderRuntime.device: where the forward pass computes


class EncoderRuntime(ABC):
    """Runs an encoder's forward pass; the shared front end does everything else.

    ``__init__`` stores what to load (cheap, picklable); ``load()`` loads it once per
    replica and sets ``backend`` (how it runs, e.g. ``cpu-int8``), ``version`` (the model
    it runs), ``dim`` (hidden size) and ``device`` (``cuda`` packs to the GPU token
    budget, anything else to the CPU one). ``path`` is what to load, in the runtime's
    terms (a model folder, an ONNX file); None = the runtime's default for ``cfg``.
    ``threads`` is the replica's share of the cores, already resolved by the caller.
    """

    backend: str = ""
    version: str = ""
    dim: int = 0
    device: str = CPU
    model: Any = None  # what the framework runs (a torch module, an ORT session)

    def __init__(
        self,
        cfg: EmbedConfig,
        threads: int = 1,
        placement: Placement | None = None,
        path: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.threads = threads
        self.placement = placement or Placement()
        self.path = path

    @property
    @abstractmethod
    def tokenizer_dir(self) -> Path:
        """The folder holding this model's tokenizer files (tokenizer.json, ...)."""

    @abstractmethod
    def load(self) -> None:
        """Load the model; raise ``ModelError`` saying which file and how to fix it."""

    @abstractmethod
    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Last hidden state, float32 [b, w, dim], of int64 [b, w] ids and mask."""

    def close(self) -> None:
        """Free the model (and the device memory it holds)."""
        self.model = None


class TorchRuntime(EncoderRuntime):
    """The Hugging Face folder (or merged LoRA adapter) on PyTorch: fp32 on the CPU; on a
    GPU placement half precision on CUDA within the replica's fraction of the card, or
    fp32 on the CPU (``gpu-sim``) where there is no CUDA."""

    uses_token_types = False  # whether the model's forward takes token_type_ids

    @property
    def source(self) -> Path:
        """The model folder (default: ``[embed] model_path``, resolved)."""
        return self.path or self.cfg.resolved_model_path()

    @property
    def tokenizer_dir(self) -> Path:
        return self.source  # an adapter folder carries its tokenizer too

    def load(self) -> None:
        path = self.source
        check_encoder_dir(path)
        import torch
        import transformers

        # the weight-loading progress bar in every actor's log is noise
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        torch.set_num_threads(self.threads)
        self.model = load_encoder(path).eval()
        self._place(torch)
        self.dim = int(self.model.config.hidden_size)
        self.uses_token_types = "token_type_ids" in inspect.signature(self.model.forward).parameters
        self.version = fingerprint(path)

    def _place(self, torch: Any) -> None:
        """Cap a GPU replica at its fraction and use half precision; else fp32 on the CPU."""
        self.backend = backend_label(TORCH)
        if not self.placement.wants_gpu:
            return
        if not torch.cuda.is_available():
            self.backend = backend_label(TORCH, gpu=True)
            return
        torch.cuda.set_per_process_memory_fraction(self.placement.gpu_fraction)
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        self.model = self.model.to(CUDA, dtype=dtype)
        self.device = CUDA
        half = "bf16" if dtype == torch.bfloat16 else "fp16"
        self.backend = backend_label(TORCH, gpu=True, cuda=True, dtype=half)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        import torch

        feed = {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
        }
        if self.uses_token_types:
            feed["token_type_ids"] = torch.zeros_like(feed["input_ids"])
        with torch.inference_mode():
            feed = {k: v.to(self.device) for k, v in feed.items()}
            hidden = self.model(**feed).last_hidden_state
            return hidden.float().cpu().numpy()


class OnnxRuntime(EncoderRuntime):
    """The encoder's fp32 weights as a fused ONNX graph (built by `docintel quantize`, or a
    run's first need) on ONNX Runtime: the default CPU path. Exact to PyTorch fp32 (cosine
    1.0000 on the validation set) and ~1.8x as fast on CPUs (bench/quantize_embedder.md,
    ort-fp32); no torch import. ``path`` is the .onnx file; its folder holds the
    tokenizer and config.json, as `docintel quantize` writes them."""

    backend = backend_label(ONNX_FP32)
    model_file: ClassVar[str] = FP32_MODEL_FILE  # in the derived-artefact folder

    input_names: frozenset[str] = frozenset()  # the graph's inputs, read at load

    @property
    def file(self) -> Path:
        """The .onnx file (default: ``model_file`` in the configured derived-artefact
        folder, where `docintel quantize` and a run's first need put it)."""
        return self.path or self.cfg.resolved_int8_dir() / self.model_file

    @property
    def tokenizer_dir(self) -> Path:
        return self.file.parent

    def load(self) -> None:
        path = self.file
        if not path.is_file():
            raise ModelError(
                f"ONNX encoder {path} does not exist; build it with `docintel quantize` (a "
                "run builds what it needs on the driver first; on a cluster the cache "
                "folder must be one every node sees, or in the image)"
            )
        try:
            self.model = onnx_session(path, self.threads)
        except Exception as e:  # ORT's InvalidProtobuf/Fail/... derive from Exception only
            raise ModelError(
                f"could not load the ONNX encoder {path}: {e}; rebuild it with `docintel quantize`"
            ) from e
        self.input_names = frozenset(i.name for i in self.model.get_inputs())
        self.dim = int(json.loads((path.parent / "config.json").read_text())["hidden_size"])
        self.version = self.model_version()

    def model_version(self) -> str:
        """The source encoder's version, as the graph's metadata records it, plus ``+onnx``:
        the same weights in another format."""
        meta = self.model.get_modelmeta().custom_metadata_map
        return f"{meta.get(META_SOURCE_FINGERPRINT, 'unrecorded')}+onnx"

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feed = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in self.input_names:
            feed["token_type_ids"] = np.zeros_like(input_ids)
        (hidden,) = self.model.run(["last_hidden_state"], feed)
        return np.asarray(hidden)


class OnnxInt8Runtime(OnnxRuntime):
    """The int8 copy of the encoder (built by `docintel quantize`, or a run's first need)
    on ONNX Runtime: the CPU spill replicas' encoder."""

    backend = backend_label(ONNX_INT8)
    model_file: ClassVar[str] = INT8_MODEL_FILE

    def model_version(self) -> str:
        """The source encoder's version (from the build recipe) plus the int8 folder's
        fingerprint: different weights than the source's, so a different version."""
        folder = self.file.parent
        recipe = folder / RECIPE_FILE
        source = (
            json.loads(recipe.read_text())["source_fingerprint"]
            if recipe.is_file()
            else "unrecorded"
        )
        return f"{source}+int8@{fingerprint(folder)[-12:]}"


# Runtimes by backend key (pipeline/schema.py: the config's and the registry's keys too).
# A new one is one EncoderRuntime subclass and one line here.
RUNTIMES: dict[str, type[EncoderRuntime]] = {
    TORCH: TorchRuntime,
    ONNX_FP32: OnnxRuntime,
    ONNX_INT8: OnnxInt8Runtime,
}
DEFAULT_RUNTIME = TORCH  # the source folder itself: works for any local encoder, any device
