"""Benchmark: in-domain vs style-transfer scores of classifier candidates, with ECE.

Each candidate is a classifier folder (a head, and for a fine-tuned model its encoder/).
Scored on ``sent_valid.csv`` (never trained on), split by style with the rule of
data/make_transfer.py: the news-style rows (``sent_valid_newsstyle.csv``: no cashtag,
link, mention, hashtag or emoji; the transfer check) and the rest (tweet-style). The
embeddings come from the embed stage, the probabilities from the classify stage (Keras,
the head's temperature applied). Reported per candidate: macro-F1 on all of
sent_valid.csv (in-domain), on the news-style rows (transfer), on the tweet-style rows and
on the written news sentences of data/news_style_check (a second transfer check);
ECE (10 bins) before and after the head's temperature; MB shipped; whether it was
trained with ``--normalise-text`` (the scored texts are never rewritten).

    .venv/bin/python bench/transfer.py stock=models/finsent:stock lora=models/finsent_ft \\
        --json /tmp/transfer.json

A candidate is NAME=FOLDER[:ENCODER] (ENCODER: "stock" or a folder; default FOLDER/encoder
when it exists). ``--recalibrate`` first fits the temperature of each head on its own
hold-out of sent_train.csv and writes it into its training.json; ``--write-metrics``
rewrites its metrics.json as `docintel train --score-on sent_valid.csv --score-on
sent_valid_newsstyle.csv --score-on news_sentences.csv` would (top-level ``ece``:
sent_valid.csv's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from finetune import shipped_mb  # noqa: E402

TRAIN = REPO / "data" / "twitter_fin_sentiment" / "sent_train.csv"
VALID = REPO / "data" / "twitter_fin_sentiment" / "sent_valid.csv"
NEWS = REPO / "data" / "twitter_fin_sentiment" / "sent_valid_newsstyle.csv"
# written news sentences: how and by whom in data/news_style_check/SOURCE.md
WRITTEN = REPO / "data" / "news_style_check" / "news_sentences.csv"
LABELS = ["Bearish", "Bullish", "Neutral"]


def _written_news(clf: Any, cfg: Any, temperature: float) -> tuple[dict, np.ndarray, np.ndarray]:
    """data/news_style_check's written news sentences: metrics, probabilities, labels."""
    from docintel.pipeline.offline.metrics import metrics
    from docintel.pipeline.offline.train import embed_texts, load_labelled
    from docintel.pipeline.stages.classify import apply_temperature

    w_texts, w_raw = load_labelled(WRITTEN)
    w_p = apply_temperature(clf.predict(embed_texts(w_texts, cfg)[0]), temperature)
    w_y = np.array([int(v) for v in w_raw])
    return metrics(w_y, w_p.argmax(1), LABELS), w_p, w_y


def _rewrite_metrics(folder: Path, scored: dict[str, dict]) -> None:
    """``folder``'s metrics.json as `docintel train --score-on` VALID, NEWS, WRITTEN would
    write it, with ``scored`` (per file) as its evaluations."""
    from docintel.pipeline.offline.train import write_metrics as write_holdout_metrics

    holdout = json.loads((folder / "metrics.json").read_text())
    for key in ("split", "ece", "ece_split", "ece_holdout", "evaluations"):
        holdout.pop(key, None)
    training = json.loads((folder / "training.json").read_text())
    holdout["ece"] = training["calibration"]["ece_after"]
    write_holdout_metrics(folder, holdout, scored)


def score(folder: Path, encoder: str, write_metrics: bool = False) -> dict[str, Any]:
    from docintel.pipeline.config import ClassifyConfig, EmbedConfig
    from docintel.pipeline.offline.calibration import ece
    from docintel.pipeline.offline.metrics import metrics
    from docintel.pipeline.offline.train import embed_texts, encoder_for_head, load_labelled
    from docintel.pipeline.stages.classify import (
        Classifier,
        apply_temperature,
        read_classifier_meta,
    )

    texts, raw = load_labelled(VALID)
    news = set(load_labelled(NEWS)[0])
    y = np.array([int(v) for v in raw])
    is_news = np.array([t in news for t in texts])
    cfg = encoder_for_head(folder, EmbedConfig(model_path=encoder))
    clf = Classifier(ClassifyConfig(model_dir=str(folder)))
    clf.setup()
    t0 = time.perf_counter()
    x, _ = embed_texts(texts, cfg)
    temperature, clf.temperature = clf.temperature, 1.0
    p_raw = clf.predict(x)
    p = apply_temperature(p_raw, temperature)
    pred = p.argmax(1)

    def f1(rows: np.ndarray) -> float:
        return round(metrics(y[rows], pred[rows], LABELS)["macro_f1"], 4)

    written, w_p, w_y = _written_news(clf, cfg, temperature)
    if write_metrics:
        scored = {
            f.name: {**metrics(y[rows], pred[rows], LABELS), "ece": ece(p[rows], y[rows])}
            for f, rows in ((VALID, np.ones(len(y), bool)), (NEWS, is_news))
        }
        scored[WRITTEN.name] = {**written, "ece": ece(w_p, w_y)}
        _rewrite_metrics(folder, scored)
    return {
        "folder": str(folder),
        "in_domain_macro_f1": f1(np.ones(len(y), bool)),
        "transfer_macro_f1": f1(is_news),
        "written_news_macro_f1": round(written["macro_f1"], 4),
        "written_news_accuracy": round(written["accuracy"], 4),
        "tweet_style_macro_f1": f1(~is_news),
        "n": {"all": len(y), "news_style": int(is_news.sum())},
        "temperature": temperature,
        "ece_raw": round(ece(p_raw, y), 4),
        "ece": round(ece(p, y), 4),
        "max_prob_ge_0999": round(float((p.max(1) >= 0.999).mean()), 4),
        "mb": round(shipped_mb(folder), 2),
        # trained with `--normalise-text`; scored, as at inference, on the raw texts
        "normalise_text": bool(read_classifier_meta(folder)[1].get("normalise_text", False)),
        "score_seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("candidates", nargs="+", help="NAME=FOLDER[:ENCODER]")
    ap.add_argument("--recalibrate", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--write-metrics",
        action="store_true",
        help="rewrite each folder's metrics.json with its scores on the three files",
    )
    args = ap.parse_args()
    from docintel.pipeline.config import EmbedConfig
    from docintel.pipeline.offline.train import recalibrate

    rows = {}
    for spec in args.candidates:
        name, _, where = spec.partition("=")
        folder, _, encoder = where.partition(":")
        if args.recalibrate:
            cfg = EmbedConfig(model_path=encoder)
            print(name, recalibrate(REPO / folder, TRAIN, cfg, LABELS), flush=True)
        rows[name] = score(REPO / folder, encoder, args.write_metrics)
        print(name, json.dumps(rows[name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
