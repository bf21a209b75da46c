"""Training helpers: metrics by hand, stratified split, labelled data loading, text
normalisation."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from docintel.pipeline.errors import InputError
from docintel.pipeline.offline.train import (
    _classes,
    apply_label_names,
    load_labelled,
    metrics,
    normalise_text,
    row_weights,
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


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("$AAPL up 5% https://t.co/xyz via @jim", "$TICKER up 5% via @USER"),
        ("Buy $BRK.B and $tsla now!", "Buy $TICKER and $TICKER now!"),
        ("www.example.com/a $SPY, @a_b: ok", "$TICKER, @USER: ok"),
        ("$NVDA.", "$TICKER."),
        # dollar amounts, e-mail addresses and plain text are kept
        ("costs $5.20, mail a@b.com", "costs $5.20, mail a@b.com"),
        ("Stocks fell on weak guidance", "Stocks fell on weak guidance"),
    ],
)
def test_normalise_text(text, want):
    assert normalise_text(text) == want
    assert normalise_text(want) == want  # idempotent


def test_normalise_text_leaves_no_tweet_artefact_in_the_vendored_data():
    texts, _ = load_labelled(SENT_VALID)
    out = [normalise_text(t) for t in texts]
    left = [t for t in out if re.search(r"https?://|www\.|@(?!USER\b)\w|\$(?!TICKER\b)[A-Za-z]", t)]
    assert not left, left[:5]
    assert sum(t != n for t, n in zip(texts, out, strict=True)) > len(texts) // 3


def test_classes_normalise_rewrites_training_and_holdout_texts(tmp_path):
    data = tmp_path / "d.csv"
    rows = [f"$AAPL row {i} @u{i} http://x.io/{i},{i % 2}" for i in range(20)]
    data.write_text("text,label\n" + "\n".join(rows) + "\n")
    plain = _classes(data, ["neg", "pos"], seed=0)
    norm = _classes(data, ["neg", "pos"], seed=0, normalise=True)
    assert plain.texts[3] == "$AAPL row 3 @u3 http://x.io/3"
    assert norm.texts[3] == "$TICKER row 3 @USER"
    assert (norm.train == plain.train).all() and (norm.hold == plain.hold).all()


def test_train_normalise_text_is_recorded_and_reused_by_recalibrate(tmp_path):
    """`docintel train --normalise-text` (no fine-tuning, a small head on the stock MiniLM):
    training.json records it, and recalibrate redraws the same rewritten hold-out, so the
    temperature it fits is the one train fitted."""
    from docintel.pipeline.config import EmbedConfig
    from docintel.pipeline.offline.train import HeadParams, recalibrate, train
    from tests.finetuned import LABEL_NAMES, tiny_labelled

    data = tiny_labelled(tmp_path / "tiny.csv", per_class=10)
    assert any("$" in t for t in load_labelled(data)[0])  # cashtags to rewrite
    out = tmp_path / "head"
    cfg = EmbedConfig(model_path="stock")
    params = HeadParams(members=1, hidden=(), max_epochs=3)
    train(data, out, cfg, LABEL_NAMES, params=params, seed=0, normalise=True)
    training = json.loads((out / "training.json").read_text())
    assert training["normalise_text"] is True
    assert recalibrate(out, data, cfg, LABEL_NAMES) == training["calibration"]


def test_save_pinned_writes_the_same_bytes_for_the_same_head(tmp_path):
    """Keras stamps the save time into model.keras (metadata.json, the zip dates), so the
    same trained head saved twice had two versions; pinned, the bytes are equal and the
    file loads back with the same weights."""
    import os
    import time

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    from docintel.pipeline.offline.train import save_pinned

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    save_pinned(model, tmp_path / "a.keras")
    time.sleep(1.1)  # Keras's save date has whole seconds
    model.save(tmp_path / "plain.keras")
    save_pinned(model, tmp_path / "b.keras")
    assert (tmp_path / "a.keras").read_bytes() == (tmp_path / "b.keras").read_bytes()
    assert (tmp_path / "a.keras").read_bytes() != (tmp_path / "plain.keras").read_bytes()
    back = keras.saving.load_model(tmp_path / "b.keras", compile=False)
    for want, got in zip(model.get_weights(), back.get_weights(), strict=True):
        np.testing.assert_array_equal(want, got)


def test_row_weights_weigh_added_rows_within_the_balanced_class_weights(tmp_path):
    data, more = tmp_path / "data.csv", tmp_path / "more.csv"
    # DATA: 6 x "0", 3 x "1"; added: 3 x "1" (label ids as the vendored files)
    data.write_text("text,label\n" + "".join(f"d{i},{0 if i < 6 else 1}\n" for i in range(9)))
    more.write_text("text,label\n" + "".join(f"m{i},1\n" for i in range(3)))
    c = _classes(data, ["neg", "pos"], seed=0, more=[more])
    assert c.added is not None and c.added.tolist() == [False] * 9 + [True] * 3
    assert row_weights(c, 1.0) is None  # the plain balanced weights
    no_added = _classes(data, ["neg", "pos"], seed=0)
    assert no_added.added is None and row_weights(no_added, 3.0) is None
    w = row_weights(c, 3.0)
    tr = c.train
    y, added = c.y[tr], c.added[tr]
    assert w is not None and len(w) == len(tr) and math.isclose(float(w.mean()), 1.0, rel_tol=1e-6)
    # by hand: balanced class weight n / (2 * count), times 3 for an added row
    counts = np.bincount(y, minlength=2)
    want = len(y) / (2 * counts[y]) * np.where(added, 3.0, 1.0)
    assert np.allclose(w, want / want.mean(), rtol=1e-6)
    # an added "pos" row weighs three times a DATA "pos" row
    pos = y == 1
    assert np.allclose(w[pos & added] / w[pos & ~added][0], 3.0, rtol=1e-6)
