"""One model stage, one precision, in this process: sentences/s and peak memory.

Run once per variant, each in its own process (as each stage runs in its own Ray actor,
so one framework's allocator never counts another's memory). bench/gpu_check.sh runs the
GPU variants (embed bf16 and fp16 on torch, classify on TensorFlow) beside the CPU-int8
spill replicas (ONNX Runtime) on a CUDA machine; the CPU variants also run anywhere.

Input: the vendored validation sentences (data/twitter_fin_sentiment/sent_valid.csv,
2,388 texts) repeated up to ``--sentences``, fed in batches of ``--batch-sentences`` rows
(the pipeline's batches of 128 documents carry about 600 sentences); one batch first as a
warm-up (not timed). Classify gets fixed random unit vectors of the encoder's dimension
(its speed does not depend on their values). Each run appends one JSON line to
``--json-out``: sentences/s, the backend the stage reported, and peak memory: torch's
``max_memory_allocated`` / ``max_memory_reserved``, TensorFlow's ``get_memory_info`` peak,
the process's peak RSS (VmHWM). ``--summarize FILE`` prints the lines as a table.

    .venv/bin/python bench/gpu_stages.py --stage embed --device gpu --precision bf16 \\
        --json-out /tmp/stages.jsonl
    .venv/bin/python bench/gpu_stages.py --summarize /tmp/stages.jsonl
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
VALID_CSV = REPO / "data" / "twitter_fin_sentiment" / "sent_valid.csv"
MIB = 2**20
# GPU fractions as the default layout gives each stage (pipeline/config.py)
FRACTION = {"embed": 0.5, "classify": 0.25}


def texts(n: int) -> list[str]:
    with VALID_CSV.open(newline="", encoding="utf-8") as f:
        base = [row["text"] for row in csv.DictReader(f)]
    return [base[i % len(base)] for i in range(n)]


def build(args: argparse.Namespace) -> Any:
    """The stage object the pipeline would give such a replica (pipeline/run/layout.py)."""
    from docintel.pipeline.config import ClassifyConfig, EmbedConfig
    from docintel.pipeline.run.layout import CLASSIFY_THREADS
    from docintel.pipeline.stages.base import Placement
    from docintel.pipeline.stages.classify import Classifier, Int8Classifier
    from docintel.pipeline.stages.embed import Embedder
    from docintel.pipeline.stages.embed_int8 import Int8Embedder, OnnxEmbedder

    embed, classify = EmbedConfig(), ClassifyConfig()
    gpu = Placement("gpu", FRACTION[args.stage])
    int8_dir = embed.resolved_int8_dir()
    if args.stage == "embed" and args.device == "gpu":
        return Embedder(embed, replicas=1, placement=gpu)
    if args.stage == "embed" and args.precision == "int8":
        return Int8Embedder(embed, int8_dir, replicas=1, threads=args.threads)
    if args.stage == "embed":
        return OnnxEmbedder(embed, int8_dir, replicas=1, threads=args.threads)
    if args.device == "gpu":
        return Classifier(classify, threads=CLASSIFY_THREADS, placement=gpu)
    if args.precision == "int8":
        return Int8Classifier(classify, int8_dir, args.threads or CLASSIFY_THREADS)
    return Classifier(classify, threads=args.threads or CLASSIFY_THREADS)


def as_fp16(stage: Any) -> None:
    """The encoder in float16 instead of the bfloat16 the stage picks on a bf16 card."""
    import torch

    stage.model = stage.model.to(torch.float16)
    stage.backend = "gpu-fp16"


def inputs(stage_name: str, sentences: list[str], dim: int) -> pa.Table:
    if stage_name == "embed":
        return pa.table({"text": sentences})
    rng = np.random.default_rng(0)
    x = rng.standard_normal((len(sentences), dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    flat = pa.array(x.reshape(-1), pa.float32())
    return pa.table({"embedding": pa.FixedSizeListArray.from_arrays(flat, dim)})


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def device_peaks() -> dict[str, float]:
    """Peak device memory by framework, in MiB, for the frameworks this process loaded."""
    out: dict[str, float] = {}
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["torch_max_allocated_mb"] = torch.cuda.max_memory_allocated() / MIB
            out["torch_max_reserved_mb"] = torch.cuda.max_memory_reserved() / MIB
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        if tf.config.list_logical_devices("GPU"):
            out["tf_peak_mb"] = tf.config.experimental.get_memory_info("GPU:0")["peak"] / MIB
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from docintel.pipeline.config import EmbedConfig
    from docintel.pipeline.stages.embed import embedding_dim

    stage = build(args)
    t0 = time.perf_counter()
    stage.setup()
    setup_s = time.perf_counter() - t0
    if args.device == "gpu" and stage.backend in {"gpu-sim", "cpu-fp32"}:
        raise SystemExit(f"asked for a GPU run but the stage runs as {stage.backend}: no CUDA")
    if args.device == "gpu" and args.stage == "embed" and args.precision == "fp16":
        as_fp16(stage)
    dim = embedding_dim(EmbedConfig().resolved_model_path())
    table = inputs(args.stage, texts(args.sentences), dim)
    step = args.batch_sentences
    stage(table.slice(0, step))  # warm-up: kernels, allocator, lazy initialisation
    t0 = time.perf_counter()
    rows = 0
    for a in range(0, table.num_rows, step):
        rows += stage(table.slice(a, step)).num_rows
    seconds = time.perf_counter() - t0
    return {
        "stage": args.stage,
        "device": args.device,
        "precision": args.precision,
        "backend": stage.backend,
        "threads": args.threads,
        "sentences": rows,
        "batch_sentences": step,
        "seconds": round(seconds, 3),
        "sentences_per_s": round(rows / seconds, 1),
        "setup_s": round(setup_s, 2),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        **{k: round(v, 1) for k, v in device_peaks().items()},
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


def summarize(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print(
        "| stage | backend | threads | sentences | s | sentences/s | torch max alloc / "
        "reserved MiB | TF peak MiB | peak RSS MiB | load avg |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |")
    for r in rows:
        torch_mb = (
            f"{r['torch_max_allocated_mb']:.0f} / {r['torch_max_reserved_mb']:.0f}"
            if "torch_max_allocated_mb" in r
            else "—"
        )
        tf_mb = f"{r['tf_peak_mb']:.0f}" if "tf_peak_mb" in r else "—"
        print(
            f"| {r['stage']} | {r['backend']} | {r['threads'] or 'auto'} | {r['sentences']} | "
            f"{r['seconds']:.2f} | {r['sentences_per_s']:.0f} | {torch_mb} | {tf_mb} | "
            f"{r['peak_rss_mb']:.0f} | {', '.join(str(x) for x in r['load_avg'])} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", choices=("embed", "classify"), default="embed")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="cpu")
    ap.add_argument("--precision", choices=("bf16", "fp16", "fp32", "int8"), default="int8")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0 = the stage's own)")
    ap.add_argument("--sentences", type=int, default=9552, help="sentences timed")
    ap.add_argument("--batch-sentences", type=int, default=1024, help="rows per stage call")
    ap.add_argument("--json-out", type=Path, help="append the result as one JSON line")
    ap.add_argument("--summarize", type=Path, help="print a JSON-lines file as a table")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    result = measure(args)
    line = json.dumps(result)
    print(line)
    if args.json_out:
        with args.json_out.open("a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
