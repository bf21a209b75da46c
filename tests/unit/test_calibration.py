"""Calibrated scores: the head's temperature (fitted by `docintel train` on the hold-out,
stored in its training.json) is applied the same way by every classify runtime (Keras,
fp32 ONNX, int8 ONNX), keeps every label, and the ECE is the textbook one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from docintel.pipeline.config import ClassifyConfig
from docintel.pipeline.errors import ModelError
from docintel.pipeline.offline.calibration import calibration_record, ece, fit_temperature
from docintel.pipeline.offline.quantize import build_fp32_classifier, build_int8_classifier
from docintel.pipeline.stages.classify import (
    CALIBRATION_KEY,
    Classifier,
    Int8Classifier,
    OnnxClassifier,
    apply_temperature,
)
from tests.conftest import REPO

STOCK_HEAD = REPO / "models" / "finsent"
DEMO = REPO / "data" / "demo" / "documents.parquet"


def test_ece_of_a_hand_computed_case() -> None:
    # bin [0.9, 1.0]: top probabilities 0.95 and 0.95, one right -> |0.5 - 0.95| = 0.45
    # bin [0.6, 0.7): 0.6 (right) -> |1 - 0.6| = 0.4;  bin [0.5, 0.6): 0.5 (wrong) -> 0.5
    # a top probability of exactly 1.0 (right) joins the last bin: |2/3 - 0.9667|
    probs = np.array(
        [[0.95, 0.05], [0.95, 0.05], [0.4, 0.6], [0.5, 0.5], [1.0, 0.0]], dtype=np.float32
    )
    y = np.array([0, 1, 1, 1, 0])
    last = abs(2 / 3 - (0.95 + 0.95 + 1.0) / 3)
    expected = 3 / 5 * last + 1 / 5 * 0.4 + 1 / 5 * 0.5
    assert ece(probs, y) == pytest.approx(expected, abs=1e-6)
    # perfectly calibrated: every row right at confidence 1
    assert ece(np.eye(3, dtype=np.float32), np.arange(3)) == 0.0


def test_temperature_keeps_labels_and_recovers_an_overconfident_head() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, size=(4000, 3))
    truth = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = np.array([rng.choice(3, p=p) for p in truth])
    over = apply_temperature(truth.astype(np.float32), 0.5)  # twice as sharp as the truth
    t = fit_temperature(over, y)
    assert t == pytest.approx(2.0, rel=0.1)
    fixed = apply_temperature(over, t)
    assert (fixed.argmax(1) == over.argmax(1)).all()
    np.testing.assert_allclose(fixed.sum(1), 1.0, atol=1e-5)
    record = calibration_record(over, y, "holdout")
    assert record["ece_after"] < record["ece_before"] and record["nll_after"] < record["nll_before"]
    assert apply_temperature(over, 1.0) is over


@pytest.fixture(scope="module")
def hot_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the stock head with a temperature of 3 in its training.json."""
    head = tmp_path_factory.mktemp("calibrated") / "finsent"
    shutil.copytree(STOCK_HEAD, head)
    training = json.loads((head / "training.json").read_text())
    training[CALIBRATION_KEY] = {"method": "temperature", "temperature": 3.0}
    (head / "training.json").write_text(json.dumps(training))
    return head


def test_every_runtime_applies_the_same_temperature(hot_head: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cfg = ClassifyConfig(model_dir=str(hot_head))
    build_fp32_classifier(hot_head, tmp_path)
    build_int8_classifier(hot_head, tmp_path)
    keras, onnx32, int8 = (
        Classifier(cfg),
        OnnxClassifier(cfg, tmp_path),
        Int8Classifier(cfg, tmp_path),
    )
    for stage in (keras, onnx32, int8):
        stage.setup()
        assert stage.temperature == 3.0
    pk, po, p8 = keras.predict(x), onnx32.predict(x), int8.predict(x)
    np.testing.assert_allclose(po, pk, rtol=0, atol=1e-5)
    keras.temperature = int8.temperature = 1.0  # the graphs' own probabilities
    raw_k, raw_8 = keras.predict(x), int8.predict(x)
    # labels unchanged by the temperature, in every runtime; scores softened
    assert (pk.argmax(1) == raw_k.argmax(1)).all() and (p8.argmax(1) == raw_8.argmax(1)).all()
    assert pk.max(1).mean() < raw_k.max(1).mean()


def test_a_bad_temperature_is_refused_naming_the_file(hot_head: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(hot_head, bad)
    training = json.loads((bad / "training.json").read_text())
    training[CALIBRATION_KEY]["temperature"] = -1
    (bad / "training.json").write_text(json.dumps(training))
    with pytest.raises(ModelError, match=r"training\.json.*temperature -1"):
        Classifier(ClassifyConfig(model_dir=str(bad))).setup()


def test_default_model_scores_on_the_demo_corpus_are_not_all_certain(embedder) -> None:
    """The bundled default is calibrated: on the demo corpus its top scores spread out
    instead of reading 1.000 / 0.999 everywhere."""
    clf = Classifier(ClassifyConfig())
    clf.setup()
    assert clf.temperature > 1.0  # the shipped head was overconfident on its hold-out
    texts = pq.read_table(DEMO, columns=["text"])["text"].to_pylist()[:80]
    sentences = [s.strip() for t in texts for s in t.split(". ") if s.strip()][:300]
    p = clf.predict(embedder.encode(sentences)[0])
    top = p.max(1)
    assert (top >= 0.999).mean() < 0.5, f"{(top >= 0.999).mean():.0%} of scores >= 0.999"
    clf.temperature = 1.0
    assert (top >= 0.999).sum() < (clf.predict(embedder.encode(sentences)[0]).max(1) >= 0.999).sum()


def test_train_fits_and_stores_the_temperature_and_reports_ece(tmp_path: Path) -> None:
    """`docintel train` fits the temperature on its hold-out, keeps it in training.json
    (so it is part of the head's version) and writes the ECE into metrics.json."""
    from docintel.pipeline.config import EmbedConfig
    from docintel.pipeline.offline.train import HeadParams, evaluate, train
    from tests.finetuned import LABEL_NAMES, tiny_labelled

    data = tiny_labelled(tmp_path / "tiny.csv", per_class=20)
    out = tmp_path / "head"
    held = train(
        data,
        out,
        EmbedConfig(model_path="stock"),
        LABEL_NAMES,
        params=HeadParams(members=1, hidden=(), max_epochs=5, patience=5),
        score_on=[data],
    )
    cal = json.loads((out / "training.json").read_text())[CALIBRATION_KEY]
    assert cal["method"] == "temperature" and cal["temperature"] > 0 and cal["n"] == 6
    assert cal["nll_after"] <= cal["nll_before"] + 1e-9
    m = json.loads((out / "metrics.json").read_text())
    assert m["ece_split"] == "tiny.csv" and 0 <= m["ece"] <= 1
    assert m["ece_holdout"] == held["ece"] == cal["ece_after"]
    again = evaluate(out, data, EmbedConfig(model_path="stock"))
    assert again["ece"] == pytest.approx(m["ece"], abs=1e-6)
    assert again["macro_f1"] == pytest.approx(m["evaluations"]["tiny.csv"]["macro_f1"])
