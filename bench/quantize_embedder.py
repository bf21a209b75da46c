"""Benchmark: int8 CPU paths for the sentence encoder against the fp32 PyTorch embedder.

Bars (issue): on real sentences, int8 vs fp32 embeddings have mean cosine >= 0.99 and
minimum cosine >= 0.95; int8 is at least as fast (sentences/s, same length-sorted
micro-batches, same thread count) as the fp32 CPU embedder; the bundled classifier's
macro-F1 on sent_valid.csv drops by at most 0.005 with int8 embeddings; resident memory
is reported for both.

Candidates (each built into ``--workdir`` from the installed MiniLM folder, offline):

* ``torch-fp32``           the reference: ``docintel.pipeline.stages.embed.Embedder`` itself.
* ``ort-fp32``             ONNX export, ORT transformer fusions; speed reference only.
* ``ort-int8``             ONNX export (unfused), dynamic int8, per-channel weights.
* ``ort-int8-keep``        as ort-int8, FFN output MatMuls (1536->384) left fp32.
* ``ort-int8-fused``       fused graph (Attention, SkipLayerNorm, BiasGelu), then dynamic
                           int8 per-channel on MatMul + Attention (QAttention).
* ``ort-int8-fused-rr``    as above with ``reduce_range`` (7-bit weights: no u8s8
                           saturation on AVX2 without VNNI).
* ``ort-int8-fused-keep``  fused, per-channel, FFN output MatMuls (1536->384) left fp32.
* ``ort-int8-static``      static QDQ int8 (per-channel weights, uint8 activations),
                           calibrated on training sentences, MatMul inputs only.
* ``torch-int8-keep``      torch.ao dynamic per-channel, attention-output and FFN-output
                           projections kept fp32 (the best torch-only recipe seen before).

Sentences: all of sent_valid.csv plus the first ``--train-sample`` of sent_train.csv for
the cosines; sent_valid.csv alone for macro-F1. Speed: ``--rounds`` alternating timing
rounds over the same ``--timing-sample`` sentences (each round times every candidate,
in a rotated order); reported are the median sentences/s and the median of per-round
ratios to torch-fp32. RSS: each candidate is loaded in a fresh subprocess which encodes
``--timing-sample`` sentences; reported are RSS at start, after loading, and the
peak (VmHWM), and the load time.

The recommended path is ``build_int8`` (offline, for ``docintel quantize``) and
``Int8Embedder`` (load + encode, same contract as ``Embedder.encode``).

Run from the repository root:

    .venv/bin/python bench/quantize_embedder.py --output-md bench/quantize_embedder.md
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from docintel.pipeline.config import EmbedConfig  # noqa: E402 (after the sys.path fix above)
from docintel.pipeline.offline.quantize import (  # noqa: E402 - the shipped recipe, measured here
    INT8_MODEL_FILE,
    TOKENIZER_FILES,
    build_int8,
    export_onnx,
    ffn_output_matmuls,
)
from docintel.pipeline.stages.embed_int8 import Int8Embedder  # noqa: E402
from docintel.pipeline.stages.encoder_frontend import EncoderFrontend  # noqa: E402

DATA = REPO / "data" / "twitter_fin_sentiment"
LABEL_NAMES = ["Bearish", "Bullish", "Neutral"]  # sent_*.csv labels 0, 1, 2
MIB = 1024 * 1024

THREADS = 2  # the machine's cores; the fp32 and int8 paths get the same count
DEFAULT_TRAIN_SAMPLE = 1000  # training sentences added to sent_valid.csv for the cosines
DEFAULT_TIMING_SAMPLE = 1000  # sentences per timing round (about 5 s per candidate)
DEFAULT_ROUNDS = 5  # alternating A/B rounds; medians damp noise from other processes
CALIBRATION_SENTENCES = 256  # static int8: training sentences seen by the calibrator
NUM_HEADS = 12  # all-MiniLM-L6-v2: 12 heads of 32 over a 384-d hidden state
COS_MEAN_BAR, COS_MIN_BAR, SPEED_BAR, F1_DROP_BAR = 0.99, 0.95, 1.0, 0.005


# --------------------------------------------------------------------------------------
# Building the artefact (offline; what `docintel quantize` calls)
# --------------------------------------------------------------------------------------


def fuse_onnx(src: Path, dst: Path, hidden_size: int) -> dict[str, int]:
    """ORT's offline BERT fusions: EmbedLayerNorm, Attention, SkipLayerNorm, BiasGelu."""
    from onnxruntime.transformers.optimizer import optimize_model

    opt = optimize_model(
        str(src), model_type="bert", num_heads=NUM_HEADS, hidden_size=hidden_size, opt_level=1
    )
    opt.save_model_to_file(str(dst))
    return {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}


def quantize_dynamic_onnx(
    src: Path, dst: Path, *, reduce_range: bool = False, exclude: Sequence[str] = ()
) -> None:
    """Dynamic int8: per-channel int8 weights, activations quantized per call (uint8)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(src),
        str(dst),
        per_channel=True,
        reduce_range=reduce_range,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul", "Attention"],
        nodes_to_exclude=list(exclude),
        # contrib ops of the fused graph (Attention, SkipLayerNorm) defeat ONNX shape
        # inference; every tensor here is float
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def _model_hidden_size(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["hidden_size"])


# --------------------------------------------------------------------------------------
# Loading and running it (what a CPU-int8 embed actor would hold)
# --------------------------------------------------------------------------------------


class TorchInt8Embedder:
    """torch.ao dynamic per-channel int8 with selected Linear layers kept fp32."""

    def __init__(self, cfg: EmbedConfig, keep_fp32: Callable[[str], bool]) -> None:
        from docintel.pipeline.stages.embed import Embedder

        self.inner = Embedder(cfg)
        self.keep_fp32 = keep_fp32

    def setup(self) -> None:
        import torch
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        self.inner.setup()
        names = [
            n
            for n, m in self.inner.model.named_modules()
            if isinstance(m, torch.nn.Linear) and not self.keep_fp32(n)
        ]
        spec = dict.fromkeys(names, per_channel_dynamic_qconfig)
        self.inner.model = quantize_dynamic(self.inner.model, spec, dtype=torch.qint8)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.inner.encode(texts)


def keep_attn_and_ffn_output(name: str) -> bool:
    """``attention.output.dense`` and the FFN's ``output.dense`` (not the pooler)."""
    return name.endswith("output.dense")


# --------------------------------------------------------------------------------------
# Candidates
# --------------------------------------------------------------------------------------


@dataclass
class Candidate:
    name: str
    note: str
    artefact: Path | None = None  # the model file whose size is reported
    make: Callable[[], Any] = field(default=lambda: None)


@dataclass
class Result:
    name: str
    note: str
    artefact_mib: float = 0.0
    sps: list[float] = field(default_factory=list)  # sentences/s per round
    ratios: list[float] = field(default_factory=list)  # per round, vs torch-fp32
    cos_mean: float = 1.0
    cos_min: float = 1.0
    cos_p01: float = 1.0
    macro_f1: float = 0.0
    flips: int = 0  # sent_valid.csv sentences whose predicted label differs from fp32's
    rss: dict[str, float] = field(default_factory=dict)


def fp32_weights() -> Path:
    """The fp32 encoder's weights file; for a LoRA adapter folder (the shipped default),
    its base's, which is what the merged encoder weighs in memory and on disk."""
    from docintel.pipeline.stages.encoder_folder import adapter_base, is_adapter_dir

    folder = EmbedConfig().resolved_model_path()
    return (adapter_base(folder)[0] if is_adapter_dir(folder) else folder) / "model.safetensors"


def default_head_name() -> str:
    """The default head's folder, relative to the repository when it is inside it."""
    from docintel.pipeline.config import ClassifyConfig

    head = ClassifyConfig().resolved_model_dir().resolve()
    return str(head.relative_to(REPO)) if head.is_relative_to(REPO) else str(head)


def fp32_cfg() -> EmbedConfig:
    return EmbedConfig(torch_threads=THREADS)


def calibration_reader(model_path: Path, tok_dir: Path, texts: list[str]) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    front = EncoderFrontend(tok_dir, fp32_cfg())
    ids, _ = front.prepare(texts)
    feeds = [
        {"input_ids": x, "attention_mask": m, "token_type_ids": np.zeros_like(x)}
        for _, x, m in front.batches(ids)
    ]
    del model_path

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    return Reader()


def build_all(work: Path, model_dir: Path, calib: list[str], names: set[str]) -> None:
    """Build every ONNX file the candidates need into ``work`` (skips existing files)."""
    hidden = _model_hidden_size(model_dir)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file() and not (work / name).exists():
            shutil.copy2(model_dir / name, work / name)
    raw, fused = work / "fp32.onnx", work / "fp32.fused.onnx"
    steps: list[tuple[str, Path, Callable[[], object]]] = [
        ("export", raw, lambda: export_onnx(model_dir, raw)),
        ("fuse", fused, lambda: fuse_onnx(raw, fused, hidden)),
        ("ort-int8", work / "int8.onnx", lambda: quantize_dynamic_onnx(raw, work / "int8.onnx")),
        (
            "ort-int8-keep",
            work / "int8.keep.onnx",
            lambda: quantize_dynamic_onnx(
                raw, work / "int8.keep.onnx", exclude=ffn_output_matmuls(raw)
            ),
        ),
        (
            "ort-int8-fused",
            work / "int8.fused.onnx",
            lambda: quantize_dynamic_onnx(fused, work / "int8.fused.onnx"),
        ),
        (
            "ort-int8-fused-rr",
            work / "int8.fused.rr.onnx",
            lambda: quantize_dynamic_onnx(fused, work / "int8.fused.rr.onnx", reduce_range=True),
        ),
        (
            "ort-int8-fused-keep",
            work / "int8.fused.keep.onnx",
            lambda: quantize_dynamic_onnx(
                fused, work / "int8.fused.keep.onnx", exclude=ffn_output_matmuls(fused)
            ),
        ),
        ("ort-int8-static", work / "int8.static.onnx", lambda: build_static(raw, work, calib)),
    ]
    for step, path, fn in steps:
        if path.exists() or (step not in {"export", "fuse"} and step not in names):
            continue
        t = time.perf_counter()
        fn()
        print(f"built {path.name} ({step}) in {time.perf_counter() - t:.1f}s", flush=True)


def build_static(raw: Path, work: Path, calib: list[str]) -> None:
    import contextlib

    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = work / "fp32.pre.onnx"
    # the pre-processing and calibration write temporary files into the working folder
    with contextlib.chdir(work):
        quant_pre_process(str(raw), str(pre), skip_symbolic_shape=True)
        quantize_static(
            str(pre),
            str(work / "int8.static.onnx"),
            calibration_data_reader=calibration_reader(pre, work, calib),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            reduce_range=False,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            # histogram methods (percentile, entropy) need equal shapes across calibration
            # batches; length-sorted batches differ, so min/max with a moving average
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"CalibMovingAverage": True},
        )


# The ORT candidates: name, what it is, its model file in --workdir (build_all makes it)
ORT_CANDIDATES = (
    ("ort-fp32", "ORT fp32, fused graph (speed reference)", "fp32.fused.onnx"),
    ("ort-int8", "ORT dynamic int8 per-channel, unfused graph", "int8.onnx"),
    ("ort-int8-keep", "as ort-int8, FFN output MatMuls fp32", "int8.keep.onnx"),
    ("ort-int8-fused", "ORT fusions, then dynamic int8 per-channel", "int8.fused.onnx"),
    ("ort-int8-fused-rr", "as ort-int8-fused, reduce_range (7-bit weights)", "int8.fused.rr.onnx"),
    ("ort-int8-fused-keep", "as ort-int8-fused, FFN output MatMuls fp32", "int8.fused.keep.onnx"),
    ("ort-int8-static", "ORT static QDQ int8 (MatMul inputs), calibrated", "int8.static.onnx"),
)


def candidates(work: Path) -> list[Candidate]:
    from docintel.pipeline.stages.embed import Embedder

    def ort(file: str) -> Callable[[], Any]:
        return lambda: Int8Embedder(fp32_cfg(), work, threads=THREADS, model_file=file)

    return [
        Candidate(
            "torch-fp32",
            "Embedder (PyTorch fp32), the reference",
            fp32_weights(),
            lambda: Embedder(fp32_cfg()),
        ),
        *(Candidate(name, note, work / file, ort(file)) for name, note, file in ORT_CANDIDATES),
        Candidate(
            "torch-int8-keep",
            "torch dynamic per-channel, attn/FFN output fp32",
            None,
            lambda: TorchInt8Embedder(fp32_cfg(), keep_attn_and_ffn_output),
        ),
    ]


# --------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------


def read_csv(path: Path) -> tuple[list[str], np.ndarray]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [r["text"] for r in rows], np.array([int(r["label"]) for r in rows], dtype=np.int64)


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / MIB


def rss_probe(name: str, work: Path, n: int) -> dict[str, float]:
    """Run in a fresh process: RSS at start, after load, and peak after encoding."""
    texts, _ = read_csv(DATA / "sent_valid.csv")
    before = rss_mib()
    cand = next(c for c in candidates(work) if c.name == name)
    enc = cand.make()
    imported = rss_mib()
    t = time.perf_counter()
    enc.setup()
    load_s = time.perf_counter() - t
    loaded = rss_mib()
    enc.encode(texts[:n])
    after = rss_mib()
    # VmHWM is reset by exec; ru_maxrss is not (it would report the parent's peak)
    status = Path("/proc/self/status").read_text().splitlines()
    peak = next(int(x.split()[1]) for x in status if x.startswith("VmHWM:")) / 1024
    return {
        "start": before,
        "imported": imported,
        "loaded": loaded,
        "after_encode": after,
        "peak": peak,
        "load_s": load_s,
    }


def rss_in_subprocess(name: str, work: Path, n: int) -> dict[str, float]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--rss-probe",
        name,
        "--workdir",
        str(work),
        "--timing-sample",
        str(n),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def predict_f1(classifier: Any, emb: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Predicted label indices and macro-F1 (docintel.pipeline.offline.train.metrics)."""
    from docintel.pipeline.offline.train import metrics

    pred = classifier.predict(emb).argmax(1)
    return pred, float(metrics(y, pred, LABEL_NAMES)["macro_f1"])


@dataclass
class Texts:
    """The sentences of one run of the benchmark."""

    valid: list[str]  # sent_valid.csv: macro-F1
    y_valid: np.ndarray
    cosine: list[str]  # sent_valid.csv + --train-sample of sent_train.csv: cosines
    calibration: list[str]  # the last of sent_train.csv (disjoint from the above)
    timing: list[str]  # --timing-sample of the cosine sentences, seeded


def read_texts(train_sample: int, timing_sample: int) -> Texts:
    valid, y_valid = read_csv(DATA / "sent_valid.csv")
    train, _ = read_csv(DATA / "sent_train.csv")
    cos_texts = valid + train[:train_sample]
    calib = train[-CALIBRATION_SENTENCES:]  # disjoint from the cosine sample
    rng = np.random.default_rng(0)
    timing = [cos_texts[i] for i in rng.permutation(len(cos_texts))[:timing_sample]]
    return Texts(valid, y_valid, cos_texts, calib, timing)


def compare_embeddings(
    cands: list[Candidate], encs: dict[str, Any], texts: list[str], results: dict[str, Result]
) -> dict[str, np.ndarray]:
    """Every candidate's embeddings of ``texts``, its cosines to torch-fp32's in
    ``results``. Tokenization parity: the int8 front end must cut and count exactly as
    Embedder does."""
    ref_vec, ref_len, ref_trunc = encs["torch-fp32"].encode(texts)
    embs: dict[str, np.ndarray] = {"torch-fp32": ref_vec}
    for c in cands[1:]:
        vec, n_tok, trunc = encs[c.name].encode(texts)
        if not (np.array_equal(n_tok, ref_len) and np.array_equal(trunc, ref_trunc)):
            raise SystemExit(f"{c.name}: token counts or truncation flags differ from Embedder")
        cos = cosines(vec, ref_vec)
        r = results[c.name]
        r.cos_mean, r.cos_min = float(cos.mean()), float(cos.min())
        r.cos_p01 = float(np.quantile(cos, 0.01))
        embs[c.name] = vec
        print(f"{c.name}: cos mean {r.cos_mean:.4f} min {r.cos_min:.4f}", flush=True)
    return embs


def time_rounds(
    cands: list[Candidate],
    encs: dict[str, Any],
    timing: list[str],
    rounds: int,
    results: dict[str, Result],
) -> None:
    """``rounds`` timing rounds, each over every candidate in a rotated order: sentences/s
    and the ratio to torch-fp32 per round, in ``results``."""
    for c in cands:  # warm-up (allocator, ORT kernels, OMP pool)
        encs[c.name].encode(timing[:128])
    for rnd in range(rounds):
        order = cands[rnd % len(cands) :] + cands[: rnd % len(cands)]
        this: dict[str, float] = {}
        for c in order:
            t = time.perf_counter()
            encs[c.name].encode(timing)
            this[c.name] = len(timing) / (time.perf_counter() - t)
        for name, sps in this.items():
            results[name].sps.append(sps)
            results[name].ratios.append(sps / this["torch-fp32"])
        print(
            f"round {rnd + 1}: " + ", ".join(f"{k} {v:.0f}/s" for k, v in this.items()), flush=True
        )


def score_labels(embs: dict[str, np.ndarray], texts: Texts, results: dict[str, Result]) -> None:
    """The bundled classifier on each candidate's sent_valid.csv embeddings: macro-F1, and
    labels changed against torch-fp32's, in ``results``."""
    from docintel.pipeline.config import ClassifyConfig
    from docintel.pipeline.stages.classify import Classifier

    clf = Classifier(ClassifyConfig(), threads=THREADS)
    clf.setup()
    if clf.labels != LABEL_NAMES:
        raise SystemExit(f"classifier labels {clf.labels} are not {LABEL_NAMES}")
    n_valid = len(texts.valid)
    ref_pred, _ = predict_f1(clf, embs["torch-fp32"][:n_valid], texts.y_valid)
    for name, vec in embs.items():
        pred, results[name].macro_f1 = predict_f1(clf, vec[:n_valid], texts.y_valid)
        results[name].flips = int((pred != ref_pred).sum())


def run(args: argparse.Namespace) -> list[Result]:
    import torch

    torch.set_num_threads(THREADS)
    work: Path = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    model_dir = EmbedConfig().resolved_model_path()
    texts = read_texts(args.train_sample, args.timing_sample)

    cands = [c for c in candidates(work) if c.name in args.candidates or c.name == "torch-fp32"]
    build_all(work, model_dir, texts.calibration, {c.name for c in cands})
    encs: dict[str, Any] = {}
    for c in cands:
        encs[c.name] = c.make()
        encs[c.name].setup()
    results = {
        c.name: Result(c.name, c.note, (c.artefact.stat().st_size / MIB) if c.artefact else 0.0)
        for c in cands
    }
    embs = compare_embeddings(cands, encs, texts.cosine, results)
    time_rounds(cands, encs, texts.timing, args.rounds, results)
    encs.clear()
    score_labels(embs, texts, results)

    if not args.no_rss:
        for c in cands:
            results[c.name].rss = rss_in_subprocess(c.name, work, args.timing_sample)
    return list(results.values())


def verdict(r: Result, ref: Result) -> str:
    if r.name == ref.name:
        return "reference"
    fails = []
    if r.cos_mean < COS_MEAN_BAR:
        fails.append("cos mean")
    if r.cos_min < COS_MIN_BAR:
        fails.append("cos min")
    if float(np.median(r.ratios)) < SPEED_BAR:
        fails.append("speed")
    if ref.macro_f1 - r.macro_f1 > F1_DROP_BAR:
        fails.append("F1")
    if r.name.endswith("fp32"):
        return "(fp32, reference only)"
    return "meets all bars" if not fails else "fails: " + ", ".join(fails)


def table(results: list[Result], args: argparse.Namespace) -> str:
    import platform

    import onnxruntime
    import torch

    ref = results[0]
    lines = [
        f"# int8 sentence encoder vs fp32 ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, {THREADS} threads each)",
        "",
        f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}; cosines over "
        f"{2486 + args.train_sample} sentences (sent_valid.csv + {args.train_sample} of "
        f"sent_train.csv); speed: median of {args.rounds} alternating rounds of "
        f"{args.timing_sample} sentences, EmbedConfig batching (token_budget "
        f"{EmbedConfig().token_budget}, max_microbatch {EmbedConfig().max_microbatch}); "
        f"macro-F1 of the default head ({default_head_name()}) on sent_valid.csv.",
        "",
        "| candidate | sent/s (median) | speed vs fp32 (median of rounds) | cos mean | "
        "cos min | cos p1 | macro-F1 | F1 drop | labels changed | RSS loaded / peak MiB | "
        "model file MiB | verdict | how |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rss = f"{r.rss['loaded']:.0f} / {r.rss['peak']:.0f}" if r.rss else "-"
        lines.append(
            f"| {r.name} | {np.median(r.sps):.0f} | {np.median(r.ratios):.2f}x "
            f"({min(r.ratios):.2f}-{max(r.ratios):.2f}) | {r.cos_mean:.4f} | {r.cos_min:.4f} | "
            f"{r.cos_p01:.4f} | {r.macro_f1:.4f} | {ref.macro_f1 - r.macro_f1:+.4f} | "
            f"{r.flips} | {rss} | {r.artefact_mib:.1f} | {verdict(r, ref)} | {r.note} |"
        )
    lines += [
        "",
        "RSS (MiB) is the whole process, each candidate in a fresh process: 'at start' "
        "has the bench imports (torch too for the torch candidates); 'after load' adds "
        "the model (and onnxruntime for ORT; the ORT path never imports torch); peak after "
        "encoding the timing sentences. 'labels changed': sent_valid.csv sentences whose "
        "predicted label differs from the fp32 prediction (F1 moves by ~0.001 per few flips).",
        "",
    ]
    if any(r.rss for r in results):
        lines += [
            "| candidate | at start | after load | after encode | peak (VmHWM) | load s |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.name} | {r.rss['start']:.0f} | {r.rss['loaded']:.0f} | "
            f"{r.rss['after_encode']:.0f} | {r.rss['peak']:.0f} | {r.rss['load_s']:.1f} |"
            for r in results
            if r.rss
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", type=Path, default=Path("/tmp/q8/work"))
    p.add_argument("--train-sample", type=int, default=DEFAULT_TRAIN_SAMPLE)
    p.add_argument("--timing-sample", type=int, default=DEFAULT_TIMING_SAMPLE)
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument("--candidates", nargs="*", default=[c.name for c in candidates(Path())])
    p.add_argument("--no-rss", action="store_true")
    p.add_argument("--output-md", type=Path)
    p.add_argument(
        "--build-int8",
        type=Path,
        metavar="OUT_DIR",
        help="only build the recommended artefact into OUT_DIR and exit",
    )
    p.add_argument("--rss-probe", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rss_probe:
        if args.rss_probe.startswith("torch"):
            import torch

            torch.set_num_threads(THREADS)
        print(json.dumps(rss_probe(args.rss_probe, args.workdir, args.timing_sample)))
        return 0
    if args.build_int8:
        out = build_int8(EmbedConfig().resolved_model_path(), args.build_int8)
        print(f"wrote {out / INT8_MODEL_FILE}")
        return 0
    md = table(run(args), args)
    print(md)
    if args.output_md:
        args.output_md.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
