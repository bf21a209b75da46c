"""Training helpers: metrics by hand, stratified split, labelled data loading."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from docintel.pipeline.errors import InputError
from docintel.pipeline.offline.train import (
    apply_label_names,
    load_labelled,
    metrics,
    stratified_split,
)

SENT_VALID = (
    Path(__file__).resolve().parents[2] / "data" / "twitter_fin_sentiment" / "sent_valid.csv"
)


def test_metrics_on_a_hand_made_example():
    names = ["neg", "pos", "neu"]
    y_true = np.array([0, 0, 0, 1, 1, 2])
    y_pred = np.array([0, 0, 1, 1, 2, 2])
    m = metrics(y_true, y_pred, names)
    # confusion (rows true, cols pred): [[2,1,0],[0,1,1],[0,0,1]]
    assert m["confusion_matrix"]["rows_true_cols_pred"] == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert m["confusion_matrix"]["labels"] == names
    # neg: P = 2/2, R = 2/3, F1 = 2*(1*2/3)/(1+2/3) = 0.8
    # pos: P = 1/2, R = 1/2, F1 = 0.5
    # neu: P = 1/2, R = 1/1, F1 = 2*(0.5*1)/(1.5) = 2/3
    f1 = {"neg": 0.8, "pos": 0.5, "neu": 2 / 3}
    for name, want in f1.items():
        assert math.isclose(m["per_class"][name]["f1"], want, rel_tol=1e-12)
    assert math.isclose(m["per_class"]["neg"]["precision"], 1.0)
    assert math.isclose(m["per_class"]["neg"]["recall"], 2 / 3)
    assert [m["per_class"][n]["support"] for n in names] == [3, 2, 1]
    assert math.isclose(m["macro_f1"], (0.8 + 0.5 + 2 / 3) / 3, rel_tol=1e-12)
    assert math.isclose(m["accuracy"], 4 / 6)
    assert m["n"] == 6


def test_metrics_class_never_predicted_or_absent():
    names = ["a", "b", "c"]
    # "c" never occurs and is never predicted; "b" occurs but is never predicted
    m = metrics(np.array([0, 0, 1, 1]), np.array([0, 0, 0, 0]), names)
    assert m["per_class"]["b"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}
    assert m["per_class"]["c"]["f1"] == 0.0
    # a: P = 2/4, R = 1, F1 = 2/3
    assert math.isclose(m["macro_f1"], (2 / 3) / 3)
    assert math.isclose(m["accuracy"], 0.5)


def test_metrics_perfect():
    y = np.array([0, 1, 2, 1, 0])
    m = metrics(y, y, ["x", "y", "z"])
    assert m["accuracy"] == 1.0
    assert m["macro_f1"] == 1.0


def test_stratified_split_keeps_proportions_and_partitions():
    y = np.array([0] * 100 + [1] * 50 + [2] * 20 + [3] * 3)
    np.random.default_rng(1).shuffle(y)
    train, hold = stratified_split(y, 0.1, seed=0)
    assert len(np.intersect1d(train, hold)) == 0
    assert sorted(np.concatenate([train, hold]).tolist()) == list(range(len(y)))
    counts = {c: int((y[hold] == c).sum()) for c in range(4)}
    assert counts == {0: 10, 1: 5, 2: 2, 3: 1}  # at least one of every class
    for c in range(4):
        assert (y[train] == c).sum() == (y == c).sum() - counts[c]
    # deterministic for a seed, different for another
    t2, h2 = stratified_split(y, 0.1, seed=0)
    assert np.array_equal(hold, h2)
    assert np.array_equal(train, t2)
    _, h3 = stratified_split(y, 0.1, seed=1)
    assert not np.array_equal(hold, h3)


def test_load_labelled_vendored_csv():
    texts, labels = load_labelled(SENT_VALID)
    assert len(texts) == len(labels) == 2388
    assert set(labels) == {"0", "1", "2"}
    assert all(isinstance(t, str) and t for t in texts)
    named = apply_label_names(labels, ["Bearish", "Bullish", "Neutral"])
    assert set(named) == {"Bearish", "Bullish", "Neutral"}


def test_load_labelled_missing_label_column(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("text,sentiment\nRevenue rose,1\n")
    with pytest.raises(InputError, match=re.escape("'label'")) as exc:
        load_labelled(path)
    assert "sentiment" in str(exc.value)
    assert str(path) in str(exc.value)


def test_load_labelled_drops_rows_without_text_or_label(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('text,label\nfirst,0\n,1\nthird,\n"quoted, with comma",2\n')
    texts, labels = load_labelled(path)
    assert texts == ["first", "quoted, with comma"]
    assert labels == ["0", "2"]


def test_apply_label_names_out_of_range():
    with pytest.raises(InputError, match="2 names"):
        apply_label_names(["0", "1", "2"], ["a", "b"])
