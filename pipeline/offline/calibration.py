"""Post-hoc calibration of a classifier head's probabilities: one temperature.

The head's probabilities ``p`` become ``softmax(log(p) / T)``. ``T`` is fitted by
`docintel train` on the held-out split (minimum negative log-likelihood, the usual
temperature scaling) and stored in the head's ``training.json`` under ``calibration``, so
it is part of the head's version. Every runtime of the classify stage (Keras, fp32 ONNX,
int8 ONNX) applies it to what its graph outputs; a positive temperature keeps every
row's arg-max, so labels (and int8 label parity) are unchanged. Also here: the expected
calibration error that `evaluate` reports.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from docintel.pipeline.stages.classify import apply_temperature

ECE_BINS = 10
# Under this many held-out rows the fitted temperature and the ECE are rough (10 bins of a
# few rows each): `docintel train` says so (:func:`small_holdout_warning`).
MIN_CALIBRATION_ROWS = 200
_EPS = 1e-12  # log(0) guard
_T_BOUNDS = (0.05, 20.0)


def nll(probs: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log-likelihood of the true classes."""
    return float(-np.mean(np.log(np.clip(probs[np.arange(len(y)), y], _EPS, None))))


def ece(probs: np.ndarray, y: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error: rows binned by their top probability into ``bins``
    equal-width bins over [0, 1] (a top probability of exactly 1 falls in the last); the
    rows' share of each bin times |accuracy - mean top probability| in it, summed."""
    if len(y) == 0:
        return 0.0
    conf = probs.max(axis=1).astype(np.float64)
    correct = (probs.argmax(axis=1) == y).astype(np.float64)
    which = np.minimum((conf * bins).astype(np.int64), bins - 1)
    total = 0.0
    for b in range(bins):
        rows = which == b
        if rows.any():
            total += rows.mean() * abs(correct[rows].mean() - conf[rows].mean())
    return float(total)


def fit_temperature(probs: np.ndarray, y: np.ndarray) -> float:
    """The temperature that minimises the held-out negative log-likelihood (bounded
    scalar search over log T; the NLL is convex in 1/T)."""
    from scipy.optimize import minimize_scalar

    lo, hi = np.log(_T_BOUNDS[0]), np.log(_T_BOUNDS[1])
    res = minimize_scalar(
        lambda log_t: nll(apply_temperature(probs, float(np.exp(log_t))), y),
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-4},
    )
    return round(float(np.exp(res.x)), 4)


def calibration_record(probs: np.ndarray, y: np.ndarray, split: str) -> dict[str, Any]:
    """Fit the temperature on ``probs`` (the head's raw output on ``split``) and what
    ``training.json`` keeps about it: the temperature and the NLL and ECE before/after."""
    t = fit_temperature(probs, y)
    after = apply_temperature(probs, t)
    return {
        "method": "temperature",
        "temperature": t,
        "fitted_on": split,
        "n": len(y),
        "nll_before": round(nll(probs, y), 5),
        "nll_after": round(nll(after, y), 5),
        "ece_before": round(ece(probs, y), 5),
        "ece_after": round(ece(after, y), 5),
    }


def summary_line(record: dict[str, Any]) -> str:
    """What the calibration reached, in words: the temperature, the rows it was fitted on
    and the ECE before and after it."""
    return (
        f"calibration: temperature {record['temperature']:g} fitted on {record['n']:,} "
        f"{record['fitted_on']} rows; ECE {record['ece_before']:.4f} before, "
        f"{record['ece_after']:.4f} after ({ECE_BINS} bins)"
    )


def small_holdout_warning(record: dict[str, Any]) -> str | None:
    """A warning when the calibration was fitted on fewer than MIN_CALIBRATION_ROWS rows."""
    n = int(record["n"])
    if n >= MIN_CALIBRATION_ROWS:
        return None
    return (
        f"the calibration hold-out has only {n:,} rows (under {MIN_CALIBRATION_ROWS}): the "
        "temperature and the ECE are rough estimates. Train on more labelled rows (the "
        "hold-out is a stratified 10% of the data)"
    )
