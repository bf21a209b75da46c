"""int8 CPU artefacts, built offline by `docintel quantize` and loaded by CPU replicas.

The encoder is exported to ONNX and quantized with ONNX Runtime's dynamic int8 (per-channel
int8 weights, uint8 activations computed per call), keeping the six FFN output projections
in fp32: on this 2-core AVX2 machine 2.8x the fp32 torch encoder's sentences/s, mean cosine
0.996 (min 0.989) to fp32 embeddings, macro-F1 -0.0024 end to end (BENCHMARKS.md, "int8").

The Keras classifier head is rebuilt as a plain ONNX graph from its weights (MatMul, Add,
Relu, Softmax, one Sum for the ensemble average) and quantized the same way; it runs on
ONNX Runtime without TensorFlow in the process (bench/quantize_classifier.md: Keras's own
``quantize("int8")`` was 3x slower than fp32 Keras, TFLite dynamic-range as fast as ORT
but needs TensorFlow or a new dependency to run). Both artefacts live in the int8 folder
(``[embed] int8_dir``): the encoder's files at its root, the classifier as one file
``classify/<classifier version>.int8.onnx`` that carries its recipe and labels as ONNX
metadata. A ``.onnx`` file is not fingerprinted, so adding or rebuilding the classifier
does not change the int8 encoder's recorded version.

Every file is staged in the target folder and renamed into place whole, each ONNX artefact
followed by its checksum (``<file>.sha256``; pipeline/artefacts/paths.py, :func:`install`):
readers never load half a file, and a run rebuilds a cached one that fails its checksum.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from docintel.pipeline.artefacts.paths import (
    CLASSIFIER_INPUT,
    CLASSIFIER_MODEL_FILE,
    CLASSIFIER_OUTPUT,
    FP32_MODEL_FILE,
    INT8_MODEL_FILE,
    META_LABELS,
    META_RECIPE,
    META_SOURCE_FINGERPRINT,
    PARITY_FILE,
    RECIPE_FILE,
    TEMP_PREFIX,
    classifier_fp32_path,
    classifier_int8_path,
    install,
    write_whole,
)
from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.errors import ModelError
from docintel.pipeline.stages.embed import check_encoder_dir, load_encoder
from docintel.pipeline.stages.embed_settings import EmbedConfig

if TYPE_CHECKING:
    import numpy as np

ONNX_OPSET = 17  # LayerNormalization is a standard op from 17; ORT fuses it at load
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

    # a fine-tuned adapter is merged into its base first: the graph is the merged encoder
    model = load_encoder(model_dir, attn_implementation="eager").eval()

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


FP32_RECIPE = "ONNX opset 17 export (eager attention), ORT BERT fusions (optimize_model, level 1)"


def copy_tokenizer(model_dir: Path, out_dir: Path) -> None:
    """The encoder's tokenizer and config files, each written whole."""
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            write_whole(out_dir / name, (model_dir / name).read_bytes())


def build_fp32(model_dir: Path, out_dir: Path) -> Path:
    """The encoder's fp32 weights as a fused ONNX graph, ``out_dir/model.fp32.onnx``.

    Export (as for int8), then ORT's offline BERT fusions (Attention, SkipLayerNorm,
    BiasGelu, EmbedLayerNorm); the source's version and the recipe go into the ONNX
    metadata. Written under a temporary name in ``out_dir`` and renamed, then its
    checksum: readers never see half a file. Returns the file's path.
    """
    import onnx
    from onnxruntime.transformers.optimizer import optimize_model

    check_encoder_dir(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads((model_dir / "config.json").read_text())
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX, dir=out_dir) as tmp:
        raw = Path(tmp) / "raw.onnx"
        export_onnx(model_dir, raw)
        fused = optimize_model(
            str(raw),
            model_type="bert",
            num_heads=int(config["num_attention_heads"]),
            hidden_size=int(config["hidden_size"]),
            opt_level=1,
        ).model
        for key, value in (
            (META_SOURCE_FINGERPRINT, fingerprint(model_dir)),
            (META_RECIPE, FP32_RECIPE),
        ):
            entry = fused.metadata_props.add()
            entry.key, entry.value = key, value
        staged = Path(tmp) / FP32_MODEL_FILE
        onnx.save(fused, str(staged))
        copy_tokenizer(model_dir, out_dir)
        return install(staged, out_dir / FP32_MODEL_FILE)


def build_int8(model_dir: Path, out_dir: Path) -> Path:
    """Build the recommended int8 artefact from a local transformers encoder folder.

    The recipe of candidate ``ort-int8-keep``. Offline and deterministic (no hub access):
    export to ONNX (opset 17, eager attention, plain MatMuls), quantize dynamically with
    per-channel int8 weights every MatMul except the six FFN output projections
    (``layer.N/output/dense``, 1536->384: their GELU inputs have the outliers that cost
    most accuracy), copy the tokenizer files, and write ``quantize.json`` saying how it
    was made. Every file is staged in ``out_dir`` and renamed whole, the model last (then
    its checksum). Returns ``out_dir``; load it with ``Int8Embedder(out_dir)``.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    check_encoder_dir(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_layers = int(json.loads((model_dir / "config.json").read_text())["num_hidden_layers"])
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX, dir=out_dir) as tmp:
        raw, staged = Path(tmp) / "fp32.onnx", Path(tmp) / INT8_MODEL_FILE
        export_onnx(model_dir, raw)
        kept = ffn_output_matmuls(raw)
        if len(kept) != n_layers:
            raise ModelError(
                f"{model_dir}: found {len(kept)} FFN output MatMuls, not {n_layers}; is it a "
                "BERT-family encoder?"
            )
        quantize_dynamic(
            str(raw),
            str(staged),
            per_channel=True,
            reduce_range=False,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            nodes_to_exclude=kept,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        copy_tokenizer(model_dir, out_dir)
        recipe = json.dumps(_int8_recipe(model_dir, kept), indent=2) + "\n"
        write_whole(out_dir / RECIPE_FILE, recipe.encode())
        install(staged, out_dir / INT8_MODEL_FILE)
    return out_dir


def _int8_recipe(model_dir: Path, kept: list[str]) -> dict[str, Any]:
    """How the int8 encoder was built (``quantize.json``)."""
    import onnxruntime

    return {
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


def _inbound(layer_cfg: dict[str, Any]) -> list[str]:
    """Names of the layers feeding one layer of a Keras functional config, in order."""
    names: list[str] = []

    def walk(arg: Any) -> None:
        if isinstance(arg, dict) and arg.get("class_name") == "__keras_tensor__":
            names.append(arg["config"]["keras_history"][0])
        elif isinstance(arg, list | tuple):
            for a in arg:
                walk(a)

    for node in layer_cfg.get("inbound_nodes", []):
        walk(node.get("args", []))
    return names


@dataclass
class _HeadGraph:
    """The ONNX nodes and initializers of a Keras head, added layer by layer in the order of
    its config; ``where`` (the .keras file) names the head in errors."""

    where: Path
    nodes: list[Any] = field(default_factory=list)
    inits: list[Any] = field(default_factory=list)
    out_of: dict[str, str] = field(default_factory=dict)  # layer -> ONNX tensor of its output

    def add_layer(self, model: Any, layer_cfg: dict[str, Any]) -> None:
        """Convert one layer of the head's functional config; refuse unsupported kinds."""
        kind, name = layer_cfg["class_name"], layer_cfg["name"]
        src = [self.out_of[n] for n in _inbound(layer_cfg)]
        if kind == "InputLayer":
            self.out_of[name] = CLASSIFIER_INPUT
        elif kind == "Dropout":  # identity at inference
            self.out_of[name] = src[0]
        elif kind == "Dense":
            self.out_of[name] = self.dense(model, layer_cfg, src[0])
        elif kind == "Average":
            self.out_of[name] = self.average(name, src)
        else:
            raise ModelError(
                f"{self.where}: layer {name!r} is a {kind}; the int8 classifier converts heads "
                "of Dense, Dropout and Average layers (as `docintel train` writes). Set [embed] "
                'cpu_precision = "fp32" to run this classifier in fp32 on CPU replicas'
            )

    def dense(self, model: Any, layer_cfg: dict[str, Any], src: str) -> str:
        """MatMul, Add of the bias (if any), then Relu or Softmax; the output tensor's name."""
        import numpy as np
        from onnx import helper, numpy_helper

        name = layer_cfg["name"]
        weights = [np.asarray(w, np.float32) for w in model.get_layer(name).get_weights()]
        act = layer_cfg["config"]["activation"]
        if act not in ("linear", "relu", "softmax"):
            raise ModelError(
                f"{self.where}: layer {name!r} has activation {act!r}; the int8 classifier "
                "supports linear, relu and softmax (heads written by `docintel train`)"
            )
        out = f"{name}/out"
        pre = f"{name}/pre" if act != "linear" else out
        self.inits.append(numpy_helper.from_array(weights[0], f"{name}/kernel"))
        mm = f"{name}/mm" if len(weights) > 1 else pre
        self.nodes.append(
            helper.make_node("MatMul", [src, f"{name}/kernel"], [mm], name=f"{name}/MatMul")
        )
        if len(weights) > 1:  # use_bias
            self.inits.append(numpy_helper.from_array(weights[1], f"{name}/bias"))
            self.nodes.append(
                helper.make_node("Add", [mm, f"{name}/bias"], [pre], name=f"{name}/Add")
            )
        if act == "relu":
            self.nodes.append(helper.make_node("Relu", [pre], [out], name=f"{name}/Relu"))
        elif act == "softmax":
            self.nodes.append(
                helper.make_node("Softmax", [pre], [out], axis=-1, name=f"{name}/Softmax")
            )
        return out

    def average(self, name: str, src: list[str]) -> str:
        """Sum of the inputs times 1/n; the output tensor's name."""
        import numpy as np
        from onnx import helper, numpy_helper

        out = f"{name}/out"
        self.inits.append(numpy_helper.from_array(np.float32(1 / len(src)), f"{name}/inv_n"))
        self.nodes += [
            helper.make_node("Sum", src, [f"{name}/sum"], name=f"{name}/Sum"),
            helper.make_node("Mul", [f"{name}/sum", f"{name}/inv_n"], [out], name=f"{name}/Mul"),
        ]
        return out


def keras_head_to_onnx(model: Any, where: Path) -> Any:
    """The fp32 ONNX graph of a classifier head written by `docintel train`.

    Supports what `docintel train` builds (Input, Dense with linear/relu/softmax, Dropout,
    Average); anything else is refused with the layer's name, because a silently wrong
    conversion would mislabel every spilled sentence. Built from the weights with
    ``onnx.helper``: tf2onnx does not install beside TensorFlow 2.21 / protobuf 7.
    """
    import onnx
    from onnx import TensorProto, helper

    cfg = model.get_config()
    head = _HeadGraph(where)
    for layer_cfg in cfg["layers"]:
        head.add_layer(model, layer_cfg)
    final = head.out_of[cfg["output_layers"][0]]
    head.nodes.append(helper.make_node("Identity", [final], [CLASSIFIER_OUTPUT], name="output"))
    dim, n_out = int(model.input_shape[-1]), int(model.output_shape[-1])
    graph = helper.make_graph(
        head.nodes,
        "docintel_head",
        [helper.make_tensor_value_info(CLASSIFIER_INPUT, TensorProto.FLOAT, ["batch", dim])],
        [helper.make_tensor_value_info(CLASSIFIER_OUTPUT, TensorProto.FLOAT, ["batch", n_out])],
        head.inits,
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    onnx.checker.check_model(onnx_model)
    return onnx_model


def quantize_classifier_onnx(src: Path, dst: Path, per_channel: bool = True) -> None:
    """ORT dynamic int8 of every MatMul (int8 weights, uint8 activations per call)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(src),
        str(dst),
        per_channel=per_channel,
        reduce_range=False,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
    )


def build_int8_classifier(classifier_dir: Path, int8_dir: Path) -> Path:
    """Build ``classifier_int8_path(int8_dir, classifier_dir)`` and return it.

    Offline and deterministic: the head's fp32 graph from its weights, ORT dynamic int8 with
    per-channel weights on every MatMul, and the source's version, labels and recipe stored
    as ONNX metadata (the file is the whole artefact). Written to a temporary name first and
    renamed, so a reader never sees half a file. Imports TensorFlow (to read the .keras).
    """
    return _build_head(classifier_dir, classifier_int8_path(int8_dir, classifier_dir), True)


def build_fp32_classifier(classifier_dir: Path, int8_dir: Path) -> Path:
    """Build ``classifier_fp32_path(int8_dir, classifier_dir)``: the head's fp32 graph as
    :func:`build_int8_classifier` makes it, not quantized (the default CPU classify path:
    identical labels to Keras, no TensorFlow in the replica). Imports TensorFlow once."""
    return _build_head(classifier_dir, classifier_fp32_path(int8_dir, classifier_dir), False)


def _build_head(classifier_dir: Path, target: Path, int8: bool) -> Path:
    import onnx
    import onnxruntime

    from docintel.pipeline.stages.classify import load_keras, read_classifier_meta

    labels, _ = read_classifier_meta(classifier_dir)
    model = load_keras(classifier_dir / CLASSIFIER_MODEL_FILE)
    fp32 = keras_head_to_onnx(model, classifier_dir / CLASSIFIER_MODEL_FILE)
    source = fingerprint(classifier_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    recipe: dict[str, Any] = {
        "source": str(classifier_dir),
        "format": "onnx",
        "opset": ONNX_OPSET,
        "graph": "Keras head rebuilt from its weights (MatMul/Add/Relu/Softmax, Sum for the "
        "ensemble average)",
        "quantization": None,
        "onnxruntime": onnxruntime.__version__,
    }
    if int8:
        recipe["quantization"] = {
            "mode": "dynamic",
            "weights": "int8 per-channel (symmetric)",
            "activations": "uint8 per-tensor, computed per call",
            "op_types": ["MatMul"],
            "reduce_range": False,
        }
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX, dir=target.parent) as tmp:
        raw, quant = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(fp32, str(raw))
        if int8:
            quantize_classifier_onnx(raw, quant, per_channel=True)
        q = onnx.load(str(quant if int8 else raw))
        for key, value in (
            (META_SOURCE_FINGERPRINT, source),
            (META_LABELS, json.dumps(labels)),
            (META_RECIPE, json.dumps(recipe)),
        ):
            entry = q.metadata_props.add()
            entry.key, entry.value = key, value
        staged = Path(tmp) / target.name
        onnx.save(q, str(staged))
        return install(staged, target)


@dataclass(frozen=True)
class _Parity:
    """Class probabilities of one labelled file under the four encoder x classifier
    precisions, and its true classes: what :func:`parity_report` compares."""

    y: np.ndarray
    labels: list[str]
    p32_32: np.ndarray  # fp32 encoder, fp32 classifier: the reference
    p8_32: np.ndarray  # int8 encoder, fp32 classifier
    p32_8: np.ndarray  # fp32 encoder, int8 classifier
    p8_8: np.ndarray  # int8 encoder, int8 classifier

    def f1(self, p: np.ndarray) -> float:
        from docintel.pipeline.offline.metrics import metrics

        return float(metrics(self.y, p.argmax(axis=1), self.labels)["macro_f1"])

    def agree(self, p: np.ndarray) -> float:
        return float((p.argmax(axis=1) == self.p32_32.argmax(axis=1)).mean())


def _embed_fp32_int8(
    embed_cfg: EmbedConfig, artefact_dir: Path, texts: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """The texts' embeddings by the fp32 encoder and by the int8 one in ``artefact_dir``."""
    from docintel.pipeline.stages.embed import Embedder
    from docintel.pipeline.stages.embed_int8 import Int8Embedder

    fp32 = Embedder(embed_cfg)
    fp32.setup()
    int8 = Int8Embedder(embed_cfg, artefact_dir)
    int8.setup()
    x32, _, _ = fp32.encode(texts)
    x8, _, _ = int8.encode(texts)
    return x32, x8


def _classifiers_fp32_int8(classifier_dir: Path, artefact_dir: Path) -> tuple[Any, Any]:
    """The Keras classifier in ``classifier_dir`` and its int8 build in ``artefact_dir``."""
    from docintel.pipeline.stages.classify import Classifier, ClassifyConfig, Int8Classifier

    clf_cfg = ClassifyConfig(model_dir=str(classifier_dir))
    clf = Classifier(clf_cfg)
    clf.setup()
    clf8 = Int8Classifier(clf_cfg, artefact_dir)
    clf8.setup()
    return clf, clf8


def _parity_sections(
    p: _Parity, cos: np.ndarray, encoder_artefact: Path, clf8: Any
) -> dict[str, dict[str, Any]]:
    """The report's ``encoder``, ``classifier`` and ``end_to_end`` parts."""
    import numpy as np

    f1_ref = p.f1(p.p32_32)
    return {
        "encoder": {
            "artefact": str(encoder_artefact),
            "cosine_mean": float(cos.mean()),
            "cosine_min": float(cos.min()),
            "macro_f1_int8": p.f1(p.p8_32),
            "macro_f1_drop": f1_ref - p.f1(p.p8_32),
            "labels_agree": p.agree(p.p8_32),
        },
        "classifier": {
            "artefact": str(clf8.artefact_path()),
            "version": clf8.version,
            "macro_f1_int8": p.f1(p.p32_8),
            "macro_f1_drop": f1_ref - p.f1(p.p32_8),
            "labels_agree": p.agree(p.p32_8),
            "max_prob_diff": float(np.abs(p.p32_8 - p.p32_32).max()) if len(p.y) else 0.0,
        },
        "end_to_end": {
            "macro_f1_int8": p.f1(p.p8_8),
            "macro_f1_drop": f1_ref - p.f1(p.p8_8),
            "labels_agree": p.agree(p.p8_8),
        },
    }


def parity_report(
    artefact_dir: Path,
    embed_cfg: EmbedConfig,
    classifier_dir: Path,
    data: Path,
    label_names: list[str] | None = None,
) -> dict[str, Any]:
    """int8 vs fp32 on a labelled file, for each int8 artefact and for both together.

    ``encoder``: embedding cosines and macro-F1 of int8 encoder + fp32 classifier;
    ``classifier``: fp32 encoder + int8 classifier (labels agree with fp32 on the same
    embeddings); ``end_to_end``: int8 + int8, what a spilled sentence gets, against fp32 +
    fp32. Drops are fp32 minus int8 (positive = int8 is worse).
    """
    import numpy as np

    from docintel.pipeline.offline.train import apply_label_names, load_labelled

    texts, raw = load_labelled(data)
    x32, x8 = _embed_fp32_int8(embed_cfg, artefact_dir, texts)
    cos = (x32 * x8).sum(axis=1)
    clf, clf8 = _classifiers_fp32_int8(classifier_dir, artefact_dir)
    integer_ids = all(r.isdigit() for r in raw)
    labels = apply_label_names(raw, (label_names or clf.labels) if integer_ids else None)
    y = np.array([clf.labels.index(lb) for lb in labels])
    p = _Parity(
        y,
        clf.labels,
        p32_32=clf.predict(x32),
        p8_32=clf.predict(x8),
        p32_8=clf8.predict(x32),
        p8_8=clf8.predict(x8),
    )
    return {
        "data": str(data),
        "n": len(texts),
        "macro_f1_fp32": p.f1(p.p32_32),
        **_parity_sections(p, cos, artefact_dir / INT8_MODEL_FILE, clf8),
    }


def write_parity(int8_dir: Path, report: dict[str, Any]) -> Path:
    """Write the parity report beside the int8 artefacts; returns its path."""
    path = int8_dir / PARITY_FILE
    write_whole(path, (json.dumps(report, indent=2) + "\n").encode())
    return path
