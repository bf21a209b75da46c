"""Benchmark: int8 paths for the Keras classifier head against the fp32 Keras classifier.

Bars (issue 3): labels agree with fp32 on sent_valid.csv; the end-to-end macro-F1 drop of
int8 encoder + int8 classifier vs fp32 + fp32 is at most 0.005; the classify stage's rows/s
on a 1,024-row batch on CPU, fp32 vs int8; resident memory of a process holding each.

Candidates (each built into ``--workdir`` from ``models/finsent``, offline):

* ``keras-fp32``   the reference: ``docintel.pipeline.stages.classify.Classifier`` itself (TF).
* ``keras-int8``   Keras 3 ``model.quantize("int8")``, saved as .keras and reloaded with
                   ``keras.saving.load_model``, run by the same Classifier class.
* ``tflite-dr``    TFLiteConverter with ``Optimize.DEFAULT`` (dynamic-range int8),
                   run by ``tf.lite.Interpreter`` (TensorFlow in the process).
* ``litert-dr``    the same .tflite file on ``ai_edge_litert`` (no TensorFlow); only when
                   ``ai_edge_litert`` imports (``--litert-path`` adds a folder holding it:
                   it is not a project dependency).
* ``ort-fp32``     the head rebuilt as ONNX from its weights, fp32 on ONNX Runtime (checks
                   the conversion; speed reference).
* ``ort-int8``     that graph, ORT dynamic int8, per-channel weights: the shipped recipe,
                   ``build_int8_classifier`` + ``Int8Classifier``.
* ``ort-int8-pt``  as ort-int8 with per-tensor weights.

Every candidate runs as a classify Stage (``__call__`` on an Arrow table with an
``embedding`` column), single-threaded as the pipeline's classify replicas
(``CLASSIFY_THREADS``). Speed: ``--rounds`` alternating rounds, each timing
``--calls`` calls per candidate on the same 1,024-row batch of real sent_valid.csv
embeddings (rotated order); reported are the median rows/s and the median per-round
ratio to keras-fp32. Quality on all of sent_valid.csv: labels agreeing with keras-fp32
on fp32 embeddings, macro-F1 with fp32 embeddings, and end to end with the int8 encoder's
embeddings (``build_int8``, the shipped encoder recipe) against fp32 + fp32. RSS: each
candidate in a fresh process (start, after load, peak after its timing calls).

Run from the repository root:

    .venv/bin/python bench/quantize_classifier.py --output-md bench/quantize_classifier.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from docintel.pipeline.artefacts.paths import (  # noqa: E402
    CLASSIFIER_MODEL_FILE,
    LABELS_FILE,
    TRAINING_FILE,
)
from docintel.pipeline.config import ClassifyConfig, EmbedConfig  # noqa: E402
from docintel.pipeline.offline.quantize import (  # noqa: E402 - the shipped recipe, measured here
    build_int8,
    build_int8_classifier,
    classifier_int8_path,
    keras_head_to_onnx,
    quantize_classifier_onnx,
)
from docintel.pipeline.registry import CLASSIFY_THREADS  # noqa: E402 (after the sys.path fix above)
from docintel.pipeline.schema import EMBEDDING  # noqa: E402
from docintel.pipeline.stages.classify import (  # noqa: E402
    Classifier,
    Int8Classifier,
    load_keras,
)

DATA = REPO / "data" / "twitter_fin_sentiment"
LABEL_NAMES = ["Bearish", "Bullish", "Neutral"]  # sent_*.csv labels 0, 1, 2
MIB = 1024 * 1024
BATCH_ROWS = 1024  # the pipeline's classify batch ([classify] batch_size default)
DEFAULT_ROUNDS = 7
DEFAULT_CALLS = 20  # calls per candidate per round (~1 s for the slowest)
AGREE_BAR, F1_DROP_BAR = 0.97, 0.005
THREADS = CLASSIFY_THREADS


# --------------------------------------------------------------------------------------
# Candidates: each is a classify Stage (setup, predict, __call__ from Classifier)
# --------------------------------------------------------------------------------------


class TFLiteClassifier(Classifier):
    """A .tflite head on tf.lite.Interpreter (``litert=False``) or ai_edge_litert."""

    def __init__(self, cfg: ClassifyConfig, path: Path, litert: bool) -> None:
        super().__init__(cfg, threads=THREADS)
        self.path = path
        self.litert = litert

    def setup(self) -> None:
        from docintel.pipeline.stages.classify import read_classifier_meta

        self.labels, _ = read_classifier_meta(self.cfg.resolved_model_dir())
        if self.litert:
            from ai_edge_litert.interpreter import Interpreter
        else:
            import tensorflow as tf

            Interpreter = tf.lite.Interpreter
        self.interp = Interpreter(model_path=str(self.path), num_threads=THREADS)
        self.inp = self.interp.get_input_details()[0]
        self.out = self.interp.get_output_details()[0]
        self.rows = 0
        self.input_dim = int(self.inp["shape"][-1])
        self.backend, self.version = "cpu-int8", self.path.name

    def predict(self, x: np.ndarray) -> np.ndarray:
        parts = []
        for i in range(0, len(x), self.cfg.batch_size):
            chunk = np.ascontiguousarray(x[i : i + self.cfg.batch_size], np.float32)
            if len(chunk) != self.rows:  # resizing re-plans the graph: only when it changes
                self.interp.resize_tensor_input(self.inp["index"], list(chunk.shape))
                self.interp.allocate_tensors()
                self.rows = len(chunk)
            self.interp.set_tensor(self.inp["index"], chunk)
            self.interp.invoke()
            parts.append(self.interp.get_tensor(self.out["index"]).copy())
        return np.concatenate(parts) if parts else np.zeros((0, len(self.labels)), np.float32)


@dataclass
class Candidate:
    name: str
    note: str
    artefact: Path | None
    make: Callable[[], Classifier]


def litert_available() -> bool:
    try:
        import ai_edge_litert.interpreter  # noqa: F401 - probing the import
    except ImportError:
        return False
    return True


def candidates(work: Path) -> list[Candidate]:
    finsent = ClassifyConfig().resolved_model_dir()
    keras8 = work / "keras-int8"
    out = [
        Candidate(
            "keras-fp32",
            "Classifier (Keras fp32 on TF), the reference",
            finsent / CLASSIFIER_MODEL_FILE,
            lambda: Classifier(ClassifyConfig(), threads=THREADS),
        ),
        Candidate(
            "keras-int8",
            'Keras model.quantize("int8"), saved + load_model',
            keras8 / CLASSIFIER_MODEL_FILE,
            lambda: Classifier(ClassifyConfig(model_dir=str(keras8)), threads=THREADS),
        ),
        Candidate(
            "tflite-dr",
            "TFLite dynamic range (Optimize.DEFAULT), tf.lite.Interpreter",
            work / "head.dr.tflite",
            lambda: TFLiteClassifier(ClassifyConfig(), work / "head.dr.tflite", litert=False),
        ),
        Candidate(
            "litert-dr",
            "same .tflite on ai_edge_litert (no TF import)",
            work / "head.dr.tflite",
            lambda: TFLiteClassifier(ClassifyConfig(), work / "head.dr.tflite", litert=True),
        ),
        Candidate(
            "ort-fp32",
            "head rebuilt as ONNX from its weights, fp32 on ORT",
            work / "head.fp32.onnx",
            lambda: Int8Classifier(
                ClassifyConfig(), work, threads=THREADS, artefact=work / "head.fp32.onnx"
            ),
        ),
        Candidate(
            "ort-int8",
            "ONNX head, ORT dynamic int8, per-channel (shipped)",
            classifier_int8_path(work, finsent),
            lambda: Int8Classifier(ClassifyConfig(), work, threads=THREADS),
        ),
        Candidate(
            "ort-int8-pt",
            "as ort-int8, per-tensor weights",
            work / "head.int8.pt.onnx",
            lambda: Int8Classifier(
                ClassifyConfig(), work, threads=THREADS, artefact=work / "head.int8.pt.onnx"
            ),
        ),
    ]
    return [c for c in out if c.name != "litert-dr" or litert_available()]


def build_all(work: Path) -> None:
    """Every artefact the candidates need, into ``work`` (skips files that exist)."""
    finsent = ClassifyConfig().resolved_model_dir()
    keras8 = work / "keras-int8"
    if not (keras8 / CLASSIFIER_MODEL_FILE).is_file():
        model = load_keras(finsent / CLASSIFIER_MODEL_FILE)
        model.quantize("int8")  # Dense layers; Input/Dropout/Average warn and stay as they are
        keras8.mkdir(parents=True, exist_ok=True)
        model.save(keras8 / CLASSIFIER_MODEL_FILE)
        for name in (LABELS_FILE, TRAINING_FILE):
            shutil.copy2(finsent / name, keras8 / name)
    if not (work / "head.dr.tflite").is_file():
        import tensorflow as tf

        conv = tf.lite.TFLiteConverter.from_keras_model(load_keras(finsent / CLASSIFIER_MODEL_FILE))
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        (work / "head.dr.tflite").write_bytes(conv.convert())
    raw = work / "head.fp32.onnx"
    if not raw.is_file():
        import onnx

        onnx.save(
            keras_head_to_onnx(load_keras(finsent / CLASSIFIER_MODEL_FILE), finsent), str(raw)
        )
    if not (work / "head.int8.pt.onnx").is_file():
        quantize_classifier_onnx(raw, work / "head.int8.pt.onnx", per_channel=False)
    if not classifier_int8_path(work, finsent).is_file():
        build_int8_classifier(finsent, work)


# --------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    note: str
    artefact_mib: float = 0.0
    rps: list[float] = field(default_factory=list)  # rows/s per round
    ratios: list[float] = field(default_factory=list)  # per round, vs keras-fp32
    agree: float = 1.0  # labels equal to keras-fp32's, fp32 embeddings
    max_prob_diff: float = 0.0
    macro_f1: float = 0.0  # fp32 embeddings
    e2e_f1: float = 0.0  # int8 encoder embeddings
    e2e_agree: float = 1.0  # vs fp32 encoder + keras-fp32
    rss: dict[str, float] = field(default_factory=dict)


def read_valid() -> tuple[list[str], np.ndarray]:
    import csv

    with (DATA / "sent_valid.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [r["text"] for r in rows], np.array([int(r["label"]) for r in rows], dtype=np.int64)


def embeddings(work: Path) -> tuple[np.ndarray, np.ndarray]:
    """sent_valid.csv through the fp32 Embedder and the int8 encoder (cached in ``work``)."""
    f32, i8 = work / "valid.fp32.npy", work / "valid.int8.npy"
    if not (f32.is_file() and i8.is_file()):
        from docintel.pipeline.stages.embed import Embedder
        from docintel.pipeline.stages.embed_int8 import Int8Embedder

        texts, _ = read_valid()
        enc_dir = work / "encoder"
        if not (enc_dir / "model.int8.onnx").is_file():
            build_int8(EmbedConfig().resolved_model_path(), enc_dir)
        fp32 = Embedder(EmbedConfig())
        fp32.setup()
        np.save(f32, fp32.encode(texts)[0])
        int8 = Int8Embedder(EmbedConfig(), enc_dir)
        int8.setup()
        np.save(i8, int8.encode(texts)[0])
    return np.load(f32), np.load(i8)


def batch_table(x: np.ndarray) -> pa.Table:
    flat = pa.array(x.reshape(-1), pa.float32())
    return pa.table({EMBEDDING: pa.FixedSizeListArray.from_arrays(flat, x.shape[1])})


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / MIB


def rss_probe(name: str, work: Path, calls: int) -> dict[str, float]:
    """In a fresh process: RSS at start, after load, and peak after ``calls`` batches."""
    before = rss_mib()
    x = np.load(work / "valid.fp32.npy")[:BATCH_ROWS]
    table = batch_table(x)
    stage = next(c for c in candidates(work) if c.name == name).make()
    t = time.perf_counter()
    stage.setup()
    load_s = time.perf_counter() - t
    loaded = rss_mib()
    for _ in range(calls):
        stage(table)
    after = rss_mib()
    status = Path("/proc/self/status").read_text().splitlines()
    peak = next(int(s.split()[1]) for s in status if s.startswith("VmHWM:")) / 1024
    tf_loaded = "tensorflow" in sys.modules
    return {
        "start": before,
        "loaded": loaded,
        "after": after,
        "peak": peak,
        "load_s": load_s,
        "tf": float(tf_loaded),
    }


def rss_in_subprocess(name: str, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--rss-probe", name]
    cmd += ["--workdir", str(args.workdir), "--calls", str(args.calls)]
    if args.litert_path:
        cmd += ["--litert-path", str(args.litert_path)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def macro_f1(y: np.ndarray, pred: np.ndarray) -> float:
    from docintel.pipeline.offline.train import metrics

    return float(metrics(y, pred, LABEL_NAMES)["macro_f1"])


def tf_threads() -> None:
    """Fix TF's thread pools before anything initializes TF (they are set once per
    process; the Keras candidates' setup() then sets the same value again)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    tf.config.threading.set_inter_op_parallelism_threads(THREADS)


def run(args: argparse.Namespace) -> list[Result]:
    tf_threads()
    work: Path = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    build_all(work)
    x32, x8 = embeddings(work)
    _, y = read_valid()
    cands = [c for c in candidates(work) if c.name in args.candidates or c.name == "keras-fp32"]
    stages = {}
    for c in cands:
        stages[c.name] = c.make()
        stages[c.name].setup()
    results = {
        c.name: Result(c.name, c.note, c.artefact.stat().st_size / MIB if c.artefact else 0.0)
        for c in cands
    }
    ref = stages["keras-fp32"]
    p_ref = ref.predict(x32)
    y_ref = p_ref.argmax(1)
    y_ref_e2e = y_ref  # fp32 encoder + fp32 classifier is the end-to-end reference
    for c in cands:
        p = stages[c.name].predict(x32)
        r = results[c.name]
        r.agree = float((p.argmax(1) == y_ref).mean())
        r.max_prob_diff = float(np.abs(p - p_ref).max())
        r.macro_f1 = macro_f1(y, p.argmax(1))
        p8 = stages[c.name].predict(x8).argmax(1)
        r.e2e_f1 = macro_f1(y, p8)
        r.e2e_agree = float((p8 == y_ref_e2e).mean())
        print(f"{c.name}: agree {r.agree:.4f}, e2e F1 {r.e2e_f1:.4f}", flush=True)

    table = batch_table(x32[:BATCH_ROWS])
    for c in cands:  # warm-up (allocators, kernels, TF function tracing)
        for _ in range(3):
            stages[c.name](table)
    for rnd in range(args.rounds):
        order = cands[rnd % len(cands) :] + cands[: rnd % len(cands)]
        this: dict[str, float] = {}
        for c in order:
            t = time.perf_counter()
            for _ in range(args.calls):
                stages[c.name](table)
            this[c.name] = args.calls * BATCH_ROWS / (time.perf_counter() - t)
        for name, rps in this.items():
            results[name].rps.append(rps)
            results[name].ratios.append(rps / this["keras-fp32"])
        print(
            f"round {rnd + 1}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in this.items()),
            flush=True,
        )
    stages.clear()
    if not args.no_rss:
        for c in cands:
            results[c.name].rss = rss_in_subprocess(c.name, args)
    return list(results.values())


def verdict(r: Result, ref: Result) -> str:
    if r.name == ref.name:
        return "reference"
    if r.name.endswith("fp32"):
        return "(fp32, reference only)"
    fails = []
    if r.agree < AGREE_BAR:
        fails.append("agreement")
    if ref.e2e_f1 - r.e2e_f1 > F1_DROP_BAR:
        fails.append("F1")
    if float(np.median(r.ratios)) < 1.0:
        fails.append("slower than fp32")
    return "meets all bars" if not fails else "fails: " + ", ".join(fails)


def versions() -> str:
    import importlib.metadata as md

    names = ("tensorflow-cpu", "keras", "onnxruntime", "onnx", "ai-edge-litert")
    found = []
    for n in names:
        try:
            found.append(f"{n} {md.version(n)}")
        except md.PackageNotFoundError:
            continue
    return ", ".join(found)


def table_md(results: list[Result], args: argparse.Namespace) -> str:
    ref = results[0]
    _, y = read_valid()
    lines = [
        f"# int8 classifier head vs fp32 ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, {THREADS} thread each as the pipeline's classify replicas)",
        "",
        f"{versions()}. Quality on all {len(y):,} sentences of sent_valid.csv: 'agree' = "
        "labels equal to keras-fp32's on fp32 embeddings; 'F1' = macro-F1 with fp32 "
        "embeddings; 'e2e F1' = macro-F1 with the int8 encoder's embeddings (the shipped "
        f"`build_int8` recipe) and 'e2e drop' its drop from fp32 encoder + keras-fp32 "
        f"({ref.macro_f1:.4f}). Speed: the classify Stage's `__call__` on one "
        f"{BATCH_ROWS:,}-row Arrow batch of real embeddings, median of {args.rounds} "
        f"alternating rounds of {args.calls} calls. Load average (1/5/15 min) at the end: "
        f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores "
        "(other jobs shared the machine: absolute rows/s are low and noisy, the interleaved "
        "per-round ratios less so).",
        "",
        "| candidate | rows/s (median) | vs keras-fp32 | agree | max prob diff | F1 | "
        "e2e F1 | e2e drop | e2e agree | RSS loaded / peak MiB | TF in process | "
        "file MiB | verdict | how |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|",
    ]
    for r in results:
        rss = f"{r.rss['loaded']:.0f} / {r.rss['peak']:.0f}" if r.rss else "-"
        tf = ("yes" if r.rss["tf"] else "no") if r.rss else "-"
        lines.append(
            f"| {r.name} | {np.median(r.rps):,.0f} | {np.median(r.ratios):.2f}x "
            f"({min(r.ratios):.2f}-{max(r.ratios):.2f}) | {r.agree:.2%} | "
            f"{r.max_prob_diff:.4f} | {r.macro_f1:.4f} | {r.e2e_f1:.4f} | "
            f"{ref.macro_f1 - r.e2e_f1:+.4f} | {r.e2e_agree:.2%} | {rss} | {tf} | "
            f"{r.artefact_mib:.2f} | {verdict(r, ref)} | {r.note} |"
        )
    if any(r.rss for r in results):
        lines += [
            "",
            "RSS (MiB) of the whole process, each candidate in a fresh one: 'start' has "
            "numpy, pyarrow and the pipeline's modules (no framework); 'loaded' after "
            f"`setup()`; peak (VmHWM) after {args.calls} calls on the {BATCH_ROWS:,}-row batch.",
            "",
            "| candidate | start | loaded | after calls | peak | load s |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r.name} | {r.rss['start']:.0f} | {r.rss['loaded']:.0f} | "
            f"{r.rss['after']:.0f} | {r.rss['peak']:.0f} | {r.rss['load_s']:.2f} |"
            for r in results
            if r.rss
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--workdir", type=Path, default=Path("/tmp/qc8/work"))
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument("--calls", type=int, default=DEFAULT_CALLS)
    p.add_argument("--candidates", nargs="*", default=None)
    p.add_argument("--litert-path", type=Path, help="a folder holding ai_edge_litert")
    p.add_argument("--no-rss", action="store_true")
    p.add_argument("--output-md", type=Path)
    p.add_argument("--rss-probe", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.litert_path:
        sys.path.append(str(args.litert_path))
    if args.candidates is None:
        args.candidates = [c.name for c in candidates(args.workdir)]
    if args.rss_probe:
        print(json.dumps(rss_probe(args.rss_probe, args.workdir, args.calls)))
        return 0
    md = table_md(run(args), args)
    print(md)
    if args.output_md:
        args.output_md.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
