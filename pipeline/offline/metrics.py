"""Classification metrics of the offline tools (train, fine-tune, evaluate, quantize's
parity report): one definition, imported by each."""

from __future__ import annotations

from typing import Any

import numpy as np


def metrics(y_true: np.ndarray, y_pred: np.ndarray, names: list[str]) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class precision/recall/F1/support and the confusion matrix."""
    k = len(names)
    cm = np.zeros((k, k), dtype=np.int64)
    np.add.at(cm, (y_true, y_pred), 1)
    per_class = {}
    f1s = []
    for i, name in enumerate(names):
        tp = cm[i, i]
        prec = tp / cm[:, i].sum() if cm[:, i].sum() else 0.0
        rec = tp / cm[i, :].sum() if cm[i, :].sum() else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        f1s.append(f1)
        per_class[name] = {
            "precision": float(prec),
            "recall": float(rec),
            "f1": float(f1),
            "support": int(cm[i, :].sum()),
        }
    return {
        "n": len(y_true),
        "accuracy": float(np.trace(cm) / max(1, cm.sum())),
        "macro_f1": float(np.mean(f1s)),
        "per_class": per_class,
        "confusion_matrix": {"labels": names, "rows_true_cols_pred": cm.tolist()},
    }
