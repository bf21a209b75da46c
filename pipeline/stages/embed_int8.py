"""The ONNX Runtime encoders over the artefacts of `docintel quantize`: int8 and fused fp32.

Both are the one embed stage (``Embedder``) with an ONNX runtime picked
(encoder_runtimes.py); these classes only keep the constructors that the layout,
benchmarks and tests call, and give each path a type of its own. Same contract as the
PyTorch path by construction (one shared front end); no torch import.
"""

from __future__ import annotations

from pathlib import Path

from docintel.pipeline.artefacts.paths import FP32_MODEL_FILE, INT8_MODEL_FILE
from docintel.pipeline.stages.embed import Embedder
from docintel.pipeline.stages.embed_settings import EmbedConfig

__all__ = ["Int8Embedder", "OnnxEmbedder"]


class Int8Embedder(Embedder):
    """The int8 copy of the encoder (``onnx-int8``): the CPU spill replicas' encoder.
    ``model_file``: benchmarks also load other ONNX variants from ``artefact_dir``."""

    def __init__(
        self,
        cfg: EmbedConfig,
        artefact_dir: Path,
        replicas: int = 1,
        threads: int = 0,
        model_file: str = INT8_MODEL_FILE,
    ) -> None:
        path = artefact_dir / model_file
        super().__init__(cfg, replicas, runtime="onnx-int8", path=path, threads=threads)


class OnnxEmbedder(Embedder):
    """The encoder's fp32 weights as a fused ONNX graph (``onnx-fp32``): the default CPU
    path, exact to PyTorch fp32 and ~1.8x as fast on CPUs."""

    def __init__(
        self, cfg: EmbedConfig, artefact_dir: Path, replicas: int = 1, threads: int = 0
    ) -> None:
        path = artefact_dir / FP32_MODEL_FILE
        super().__init__(cfg, replicas, runtime="onnx-fp32", path=path, threads=threads)
