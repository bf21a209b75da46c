"""Benchmark: what a branch encoder would cost the embed stage (issue 33, item 4, third
round of "One encoder for every use" in BENCHMARKS.md).

A branch keeps the stock MiniLM for the vector search, zero-shot and other heads read, and
runs a tuned copy of its top K layers on the same trunk for the default head. Its cost is
the stock forward pass plus K layers run a second time from the trunk's output. The tuned
layers have the stock layers' shapes, so the stock weights stand in for them: this times
the arithmetic, not the labels.

Sentences: the first ``--sentences`` of sent_valid.csv, tokenized, packed and pooled by the
embed stage's own front end (EncoderFrontend, the configured token budget). Torch fp32 on
``--threads`` threads; ``--rounds`` alternating rounds (every K in each round); reported:
the median seconds per K and its ratio to K = 0. Before timing, the K = 0 path is checked
against the embed stage's own vectors (minimum cosine printed).

Run from the repository root:

    .venv/bin/python bench/branch_cost.py --rounds 5
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SENTENCES = REPO / "data" / "twitter_fin_sentiment" / "sent_valid.csv"


def forward(model: Any, top: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The front end's forward: the stock layers, then the top ``top`` run again from the
    trunk's output (the branch; its result is computed and dropped, as timing needs)."""
    import torch

    layers = model.encoder.layer

    def run(input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            ids, mask = torch.from_numpy(input_ids), torch.from_numpy(attention_mask)
            h = model.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))
            additive = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
            trunk = h
            for i, layer in enumerate(layers):
                if i == len(layers) - top:
                    trunk = h
                out = layer(h, attention_mask=additive)
                h = out[0] if isinstance(out, tuple) else out
            branch = trunk
            for layer in layers[len(layers) - top :] if top else []:
                out = layer(branch, attention_mask=additive)
                branch = out[0] if isinstance(out, tuple) else out
            return h.numpy()

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sentences", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-top", type=int, default=3)
    args = ap.parse_args()
    import torch

    from docintel.pipeline.artefacts.paths import stock_encoder_dir
    from docintel.pipeline.config import EmbedConfig
    from docintel.pipeline.stages.embed import Embedder
    from docintel.pipeline.stages.encoder_folder import load_encoder
    from docintel.pipeline.stages.encoder_frontend import EncoderFrontend

    torch.set_num_threads(args.threads)
    cfg = EmbedConfig(model_path="stock", torch_threads=args.threads)
    with SENTENCES.open(newline="", encoding="utf-8") as f:
        texts = [r["text"] for r in csv.DictReader(f)][: args.sentences]
    model = load_encoder(stock_encoder_dir()).eval()
    front = EncoderFrontend(stock_encoder_dir(), cfg)

    def encode(top: int) -> np.ndarray:
        dim = int(model.config.hidden_size)
        return front.encode(texts, forward(model, top), dim, cfg.token_budget, cfg.max_microbatch)[
            0
        ]

    stage = Embedder(cfg)
    stage.setup()
    cos = float((encode(0) * stage.encode(texts)[0]).sum(1).min())
    print(f"K = 0 against the embed stage's vectors: minimum cosine {cos:.6f}")
    seconds: dict[int, list[float]] = {k: [] for k in range(args.max_top + 1)}
    for _ in range(args.rounds):
        for k, times in seconds.items():
            t0 = time.perf_counter()
            encode(k)
            times.append(time.perf_counter() - t0)
    base = float(np.median(seconds[0]))
    print(f"\n| top layers run twice | s per {len(texts):,} sentences (median) | vs stock |")
    print("|---:|---:|---:|")
    for k, v in seconds.items():
        print(f"| {k} | {np.median(v):.3f} | x{np.median(v) / base:.2f} |")


if __name__ == "__main__":
    main()
