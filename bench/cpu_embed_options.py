"""Benchmark: the CPU embed levers of issue 13, each on the same sentences and batches.

What it measures: sentences/s of embedding (tokenize + forward + mean pooling) on this
machine's cores for each way docintel could run its default encoder on a CPU replica:

torch eager attention
    transformers' plain attention (``attn_implementation="eager"``), PyTorch fp32.
torch SDPA
    ``attn_implementation="sdpa"`` (PyTorch's fused scaled-dot-product attention).
torch.compile
    the SDPA model through ``torch.compile`` (default mode, dynamic shapes); the first
    call's compile time is reported separately (a run pays it once per process; the
    on-disk cache shortens later compiles but a fresh process still traces the graph).
ONNX Runtime fp32
    docintel's default CPU path (``OnnxEmbedder``: the fused fp32 graph, same weights).

Every candidate embeds the same seeded sample of the long corpus's sentences
(``--sample``), packed exactly as docintel packs them (``pack_by_length`` with the default
CPU token budget), after one warm-up pass, ``--rounds`` times in alternating order; the
table shows the best and median rate of each and its ratio to ONNX Runtime. Embeddings are
compared with ONNX Runtime's (cosine), so a lever that changes results shows it.

    .venv/bin/python bench/cpu_embed_options.py [--sample 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "twitter_fin_sentiment" / "sent_train.csv"


def sentences(n: int, seed: int = 13) -> list[str]:
    import csv

    with CORPUS.open(newline="", encoding="utf-8") as f:
        texts = [r["text"] for r in csv.DictReader(f)]
    return random.Random(seed).sample(texts, n)


class TorchCandidate:
    def __init__(self, attn: str, compiled: bool, threads: int) -> None:
        import torch

        from docintel.pipeline.config import EmbedConfig
        from docintel.pipeline.stages.embed import Embedder, load_encoder

        torch.set_num_threads(threads)
        self.cfg = EmbedConfig()
        self.stage = Embedder(self.cfg)
        self.stage.setup()  # tokenizer, special-token layout, version
        path = self.cfg.resolved_model_path()
        self.stage.model = load_encoder(path, attn_implementation=attn).eval()
        self.compile_s = 0.0
        if compiled:
            self.stage.model = torch.compile(self.stage.model, dynamic=True)

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.stage.encode(texts)[0]


class OrtCandidate:
    def __init__(self, threads: int) -> None:
        from docintel.pipeline.config import Config
        from docintel.pipeline.run.plan import ensure_derived
        from docintel.pipeline.stages.embed_int8 import OnnxEmbedder

        cfg = Config()
        ensure_derived(cfg)
        self.stage = OnnxEmbedder(cfg.embed, cfg.embed.resolved_int8_dir(), threads=threads)
        self.stage.setup()

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.stage.encode(texts)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sample", type=int, default=1024, help="sentences embedded per round")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per candidate")
    p.add_argument("--threads", type=int, default=0, help="threads (0 = usable cores)")
    args = p.parse_args()
    from docintel.pipeline.stages.base import usable_cores

    threads = args.threads or usable_cores()
    texts = sentences(args.sample)
    makers: dict[str, Any] = {
        "ONNX Runtime fp32 (default)": lambda: OrtCandidate(threads),
        "torch eager attention": lambda: TorchCandidate("eager", False, threads),
        "torch SDPA": lambda: TorchCandidate("sdpa", False, threads),
        "torch.compile (SDPA)": lambda: TorchCandidate("sdpa", True, threads),
    }
    cands: dict[str, Any] = {}
    first: dict[str, float] = {}
    ref: np.ndarray | None = None
    cos: dict[str, float] = {}
    for name, make in makers.items():
        t = time.perf_counter()
        c = make()
        load = time.perf_counter() - t
        t = time.perf_counter()
        out = c.encode(texts)  # warm-up: includes torch.compile's tracing and compiling
        first[name] = load + time.perf_counter() - t
        ref = out if ref is None else ref
        cos[name] = float((out * ref).sum(axis=1).min())
        cands[name] = c
        print(f"{name}: load + first pass {first[name]:.1f} s", file=sys.stderr, flush=True)
    rates: dict[str, list[float]] = {n: [] for n in cands}
    order = list(cands)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else reversed(order):
            t = time.perf_counter()
            cands[name].encode(texts)
            rates[name].append(len(texts) / (time.perf_counter() - t))
    base = max(rates[order[0]])
    print(f"\n{len(texts):,} sentences of sent_train.csv (seeded), {threads} threads, ", end="")
    print(f"token budget {cands[order[0]].stage.cfg.token_budget}, {args.rounds} rounds\n")
    print("| candidate | best sent/s | median sent/s | vs ONNX Runtime ", end="")
    print("| load + first pass s | min cosine to ONNX |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in order:
        best, med = max(rates[name]), statistics.median(rates[name])
        print(
            f"| {name} | {best:.0f} | {med:.0f} | {best / base:.2f}x | {first[name]:.1f} | "
            f"{cos[name]:.6f} |"
        )


if __name__ == "__main__":
    main()
