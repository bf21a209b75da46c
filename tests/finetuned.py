"""A tiny fine-tuned model for tests: the real `docintel train --fine-tune` code path on a
few dozen vendored tweets, one short epoch, a one-member head. Seconds, not minutes; the
full-size training run is a benchmark (bench/finetune.py), not a test."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from tests.conftest import REPO

SENT_TRAIN = REPO / "data" / "twitter_fin_sentiment" / "sent_train.csv"
LABEL_NAMES = ["Bearish", "Bullish", "Neutral"]
PER_CLASS = 24  # 72 rows: 66 to train on (9 steps of 8), 6 held out (2 per class)


def tiny_labelled(path: Path, per_class: int = PER_CLASS) -> Path:
    """The first ``per_class`` rows of each label of sent_train.csv, interleaved."""
    with SENT_TRAIN.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    by_label = {c: [r for r in rows if r["label"] == c][:per_class] for c in ("0", "1", "2")}
    mixed = [r for triple in zip(*by_label.values(), strict=True) for r in triple]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(mixed)
    return path


def train_tiny(work: Path, method: str = "lora", seed: int = 0) -> tuple[Path, dict[str, Any]]:
    """Fine-tune the stock MiniLM on the tiny set (one epoch) and train a small head:
    returns the model folder (head + encoder/) and the hold-out metrics."""
    from docintel.pipeline.config import EmbedConfig
    from docintel.pipeline.offline.finetune import FineTuneParams
    from docintel.pipeline.offline.train import HeadParams, train

    data = tiny_labelled(work / "tiny.csv")
    out = work / f"model-{method}"
    result = train(
        data,
        out,
        EmbedConfig(model_path="stock"),
        LABEL_NAMES,
        params=HeadParams(members=1, hidden=(32,), max_epochs=10, patience=10),
        seed=seed,
        fine_tune=FineTuneParams(method=method, epochs=1, batch_size=8),
    )
    return out, result
