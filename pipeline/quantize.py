"""int8 CPU artefacts, built offline by `docintel quantize` and loaded by CPU replicas.

The encoder is exported to ONNX and quantized with ONNX Runtime's dynamic int8 (per-channel
int8 weights, uint8 activations computed per call), keeping the six FFN output projections
in fp32: on this 2-core AVX2 machine 2.8x the fp32 torch encoder's sentences/s, mean cosine
0.996 (min 0.989) to fp32 embeddings, macro-F1 -0.0024 end to end (BENCHMARKS.md, "int8").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pipeline.config import EmbedConfig
from pipeline.errors import ModelError
from pipeline.stages.embed import check_encoder_dir
from pipeline.versions import fingerprint

ONNX_OPSET = 17  # LayerNormalization is a standard op from 17; ORT fuses it at load
INT8_MODEL_FILE = "model.int8.onnx"
RECIPE_FILE = "quantize.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "config.json",
)


def export_onnx(model_dir: Path, path: Path) -> None:
    """Export the encoder's last_hidden_state to ONNX (dynamic batch and sequence axes).

    Eager attention exports plain MatMul/Softmax, which ORT's BERT optimizer fuses into
    its Attention kernel; SDPA would export a form it does not recognise.
    """
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class LastHidden(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor,
        ) -> torch.Tensor:
            out = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.last_hidden_state

    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]])
    mask = (ids != 0).long()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "seq"} for n in [*names, "last_hidden_state"]}
    with torch.inference_mode():
        torch.onnx.export(
            LastHidden(model),
            (ids, mask, torch.zeros_like(ids)),
            str(path),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=ONNX_OPSET,
            dynamo=False,
        )


def ffn_output_matmuls(path: Path) -> list[str]:
    """Names of the FFN output MatMuls (weight [intermediate, hidden]) of an ONNX graph."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    shapes = {t.name: numpy_helper.to_array(t).shape for t in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and len(node.input) == 2:
            shape = shapes.get(node.input[1])
            if shape is not None and len(shape) == 2 and shape[0] > shape[1]:
                out.append(node.name)
    return out


def build_int8(model_dir: Path, out_dir: Path) -> Path:
    """Build the recommended int8 artefact from a local transformers encoder folder.

    The recipe of candidate ``ort-int8-keep``. Offline and deterministic (no hub access):
    export to ONNX (opset 17, eager attention, plain MatMuls), quantize dynamically with
    per-channel int8 weights every MatMul except the six FFN output projections
    (``layer.N/output/dense``, 1536->384: their GELU inputs have the outliers that cost
    most accuracy), copy the tokenizer files, and write ``quantize.json`` saying how it
    was made. Returns ``out_dir``; load it with ``Int8Embedder(out_dir)``.
    """
    import tempfile

    import onnx
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    check_encoder_dir(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_layers = int(json.loads((model_dir / "config.json").read_text())["num_hidden_layers"])
    with tempfile.TemporaryDirectory(prefix="docintel-quantize-") as tmp:
        raw = Path(tmp) / "fp32.onnx"
        export_onnx(model_dir, raw)
        kept = ffn_output_matmuls(raw)
        if len(kept) != n_layers:
            raise ModelError(
                f"{model_dir}: found {len(kept)} FFN output MatMuls, not {n_layers}; is it a "
                "BERT-family encoder?"
            )
        quantize_dynamic(
            str(raw),
            str(out_dir / INT8_MODEL_FILE),
            per_channel=True,
            reduce_range=False,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            nodes_to_exclude=kept,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out_dir / name)
    recipe = {
        "source": str(model_dir),
        "source_fingerprint": fingerprint(model_dir),
        "format": "onnx",
        "opset": ONNX_OPSET,
        "graph": "unfused export; ORT fuses at session load (ORT_ENABLE_ALL)",
        "quantization": {
            "mode": "dynamic",
            "weights": "int8 per-channel (symmetric)",
            "activations": "uint8 per-tensor, computed per call",
            "op_types": ["MatMul"],
            "kept_fp32": kept,
            "reduce_range": False,
        },
        "onnxruntime": onnxruntime.__version__,
    }
    (out_dir / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")
    return out_dir


def parity_report(
    artefact_dir: Path,
    embed_cfg: EmbedConfig,
    classifier_dir: Path,
    data: Path,
    label_names: list[str] | None = None,
) -> dict[str, Any]:
    """int8 vs fp32 on a labelled file: embedding cosines and end-to-end macro-F1."""
    import numpy as np

    from pipeline.config import ClassifyConfig
    from pipeline.stages.classify import Classifier
    from pipeline.stages.embed import Embedder
    from pipeline.stages.embed_int8 import Int8Embedder
    from pipeline.train import apply_label_names, load_labelled, metrics

    texts, raw = load_labelled(data)
    fp32 = Embedder(embed_cfg)
    fp32.setup()
    int8 = Int8Embedder(embed_cfg, artefact_dir)
    int8.setup()
    x32, _, _ = fp32.encode(texts)
    x8, _, _ = int8.encode(texts)
    cos = (x32 * x8).sum(axis=1)
    clf = Classifier(ClassifyConfig(model_dir=str(classifier_dir)))
    clf.setup()
    integer_ids = all(r.isdigit() for r in raw)
    labels = apply_label_names(raw, (label_names or clf.labels) if integer_ids else None)
    y = np.array([clf.labels.index(lb) for lb in labels])
    f1_32 = metrics(y, clf.predict(x32).argmax(axis=1), clf.labels)["macro_f1"]
    f1_8 = metrics(y, clf.predict(x8).argmax(axis=1), clf.labels)["macro_f1"]
    return {
        "data": str(data),
        "n": len(texts),
        "cosine_mean": float(cos.mean()),
        "cosine_min": float(cos.min()),
        "macro_f1_fp32": f1_32,
        "macro_f1_int8": f1_8,
        "macro_f1_drop": f1_32 - f1_8,
        "labels_agree": float((clf.predict(x32).argmax(1) == clf.predict(x8).argmax(1)).mean()),
    }
