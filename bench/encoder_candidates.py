"""Train encoder candidates for "one encoder for every use" (issue 33): the shipped
sentiment recipe (LoRA on the stock MiniLM, tweets + written news sentences, seed 0) with
the geometry term of ``docintel train --preserve W`` at several weights W.

Each candidate is exactly what

    docintel train data/twitter_fin_sentiment/sent_train.csv --out DIR \\
        --add-data data/news_style_train/news_train.csv \\
        --label-names Bearish,Bullish,Neutral --fine-tune --encoder stock --preserve W

fine-tunes into DIR/encoder (the same data, split, seed and recipe: this calls the same
functions), without the Keras head, so it runs where only PyTorch is installed (a GPU
machine: ``--device cuda``). Per candidate it prints how far the encoder moved from the
stock MiniLM on text it was not trained on (sent_valid.csv, the written news check, the
analyst-query corpus when present): the mean cosine between the candidate's and the stock
unit vectors of each sentence, and the Spearman correlation of the pairwise similarities
of 400 of them (1.0 = the stock geometry). The sentiment, search and topic checks then run
on the written encoders (bench/topic_check.py, bench/search_quality.py, `docintel train
--encoder DIR/encoder` for the head).

    .venv/bin/python bench/encoder_candidates.py --preserve 0,4,16 --out /tmp/cands
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "data" / "twitter_fin_sentiment" / "sent_train.csv"
NEWS_TRAIN = REPO / "data" / "news_style_train" / "news_train.csv"
PROBES = {
    "sent_valid": REPO / "data" / "twitter_fin_sentiment" / "sent_valid.csv",
    "news_check": REPO / "data" / "news_style_check" / "news_sentences.csv",
    "analyst_corpus": REPO / "data" / "analyst_queries" / "corpus.csv",
}
LABELS = ["Bearish", "Bullish", "Neutral"]
PAIRS = 400  # sentences whose pairwise similarities are compared (400^2/2 pairs)


def probe_texts(limit: int) -> dict[str, list[str]]:
    out = {}
    for name, path in PROBES.items():
        if path.is_file():
            with path.open(newline="", encoding="utf-8") as f:
                out[name] = [r["text"] for r in csv.DictReader(f)][:limit]
    return out


def unit_vectors(encoder_dir: Path, texts: list[str], device: str) -> np.ndarray:
    """The embed stage's vectors (mean pooled, L2-normalised) of ``texts``."""
    import torch
    from transformers import AutoTokenizer

    from docintel.pipeline.stages.embed import load_encoder

    tok = AutoTokenizer.from_pretrained(str(encoder_dir))
    model = load_encoder(encoder_dir).to(device).eval()
    out = []
    with torch.inference_mode():
        for a in range(0, len(texts), 256):
            enc = tok(texts[a : a + 256], padding=True, truncation=True, max_length=128)
            enc = {k: torch.as_tensor(v, device=device) for k, v in enc.items()}
            hidden = model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled.float(), dim=1).cpu().numpy())
    return np.concatenate(out)


def geometry(stock: np.ndarray, cand: np.ndarray) -> dict[str, float]:
    """Mean cosine per sentence, and the Spearman correlation of pairwise similarities."""
    from scipy.stats import spearmanr

    n = min(PAIRS, len(stock))
    iu = np.triu_indices(n, 1)
    s, c = (stock[:n] @ stock[:n].T)[iu], (cand[:n] @ cand[:n].T)[iu]
    return {
        "cos_mean": float((stock * cand).sum(1).mean()),
        "cos_min": float((stock * cand).sum(1).min()),
        "pairs_spearman": float(spearmanr(s, c).statistic),
    }


def train_one(
    weight: float, epochs: int, out: Path, device: str, limit: int, free: bool = False
) -> dict[str, Any]:
    from docintel.pipeline.artefacts.paths import stock_encoder_dir
    from docintel.pipeline.offline.finetune import FineTuneParams, fine_tune
    from docintel.pipeline.offline.train import _classes

    c = _classes(TRAIN, LABELS, 0, more=[NEWS_TRAIN])
    tr, ho = (c.train[:limit], c.hold[: max(limit // 10, 30)]) if limit else (c.train, c.hold)
    params = FineTuneParams(preserve=weight, epochs=epochs, device=device, preserve_free=free)
    t0 = time.perf_counter()
    rec = fine_tune(c.texts, c.y, tr, ho, c.names, stock_encoder_dir(), out / "encoder", params)
    (out / "fine_tune.json").write_text(json.dumps(rec, indent=2) + "\n")
    best = rec["epochs"][rec["best_epoch"] - 1]
    return {"seconds": round(time.perf_counter() - t0, 1), "holdout_f1": best["holdout_macro_f1"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preserve", default="0,4,16", help="geometry weights, comma separated")
    ap.add_argument("--epochs", default="2", help="epochs per candidate (one or one per weight)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--limit", type=int, default=0, help="training rows (0 = all; smoke runs)")
    ap.add_argument("--free", action="store_true", help="preserve_free: the class directions")
    args = ap.parse_args()
    from docintel.pipeline.artefacts.paths import stock_encoder_dir

    weights = [float(w) for w in args.preserve.split(",")]
    epochs = [int(e) for e in args.epochs.split(",")]
    epochs = epochs * len(weights) if len(epochs) == 1 else epochs
    probes = probe_texts(2000 if not args.limit else 64)
    stock = {k: unit_vectors(stock_encoder_dir(), t, args.device) for k, t in probes.items()}
    print(
        "| preserve | epochs | train s | hold-out macro-F1 (layer) | "
        + " | ".join(f"{k}: cos mean / min / pairs rho" for k in probes)
        + " |"
    )
    print("|---" * (4 + len(probes)) + "|")
    for w, e in zip(weights, epochs, strict=True):
        out = args.out / f"preserve{w:g}_e{e}{'_free' if args.free else ''}"
        r = train_one(w, e, out, args.device, args.limit, args.free)
        cells = []
        for k, t in probes.items():
            g = geometry(stock[k], unit_vectors(out / "encoder", t, args.device))
            cells.append(f"{g['cos_mean']:.3f} / {g['cos_min']:.3f} / {g['pairs_spearman']:.3f}")
            r[k] = g
        (out / "geometry.json").write_text(json.dumps(r, indent=2) + "\n")
        head = f"| {w:g} | {e} | {r['seconds']} | {r['holdout_f1']:.4f} | "
        print(head + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
