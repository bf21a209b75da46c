"""Zero-shot heads from label descriptions (`docintel train --descriptions`): the LABELS.toml
reader and its refusals, the head's arithmetic, and the head as every runtime runs it
(Keras, fp32 ONNX and int8 ONNX from the quantize path)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from docintel.pipeline.artefacts.paths import TRAINING_FILE
from docintel.pipeline.errors import InputError
from docintel.pipeline.offline.zeroshot import (
    DEFAULT_SCALE,
    ZERO_SHOT_KEY,
    build_zeroshot,
    leave_one_out,
    prototypes,
    read_labels,
    scaled_softmax,
)
from docintel.pipeline.stages.classify import (
    Classifier,
    ClassifyConfig,
    Int8Classifier,
    OnnxClassifier,
)
from docintel.pipeline.stages.embed_settings import EmbedConfig

LABELS = """
[labels]
hiring = ["The company is hiring new staff.", "Workers went on strike."]
results = "The company reported quarterly profit."
recall = ["The carmaker recalled cars over a faulty brake."]

[examples]
hiring = ["Acme will add 500 jobs at its new plant.", "The union called a strike."]
results = ["Net income rose 12 percent in the third quarter.", "Revenue missed estimates."]
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "labels.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_read_labels_keeps_order_lists_and_examples(tmp_path: Path) -> None:
    spec = read_labels(_write(tmp_path, LABELS))
    assert spec.names == ["hiring", "results", "recall"]
    assert spec.descriptions["results"] == ["The company reported quarterly profit."]
    assert len(spec.descriptions["hiring"]) == 2
    assert spec.examples["results"][1] == "Revenue missed estimates."
    assert "recall" not in spec.examples


def test_read_labels_applies_a_template(tmp_path: Path) -> None:
    text = 'template = "This news is about {}."\n[labels]\na = "jobs"\nb = ["profits", "sales"]\n'
    spec = read_labels(_write(tmp_path, text))
    assert spec.descriptions == {
        "a": ["This news is about jobs."],
        "b": ["This news is about profits.", "This news is about sales."],
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[labels]\nonly = "one label"\n', "names 1 label(s); a classifier needs at least two"),
        ("[labels]\n", "names 0 label(s)"),
        ('[labels]\na = "x"\nb = ""\n', "labels.toml: b: a description or example is empty"),
        ('[labels]\na = "x"\nb = []\n', "labels.toml: b: expected a string or a non-empty list"),
        ('[labels]\na = "x"\nb = ["y", "  "]\n', "b: a description or example is empty"),
        ('[labels]\na = "x"\nb = 3\n', "b: expected a string or a non-empty list"),
        (
            '[labels]\na = "x"\nb = "y"\n[examples]\nc = ["z"]\n',
            "[examples] has label(s) ['c'] that [labels] does not name",
        ),
        ('[labels]\na = "x"\nb = "y"\n[examples]\na = [""]\n', "[examples] a: a description"),
        ('[labels\na = "x"\n', "cannot read descriptions file"),
        ('template = "no slot"\n[labels]\na = "x"\nb = "y"\n', "template must be a string"),
        ('label = "x"\n[labels]\na = "x"\nb = "y"\n', "unknown section(s) ['label']"),
    ],
)
def test_read_labels_refuses_naming_the_file_and_label(
    tmp_path: Path, text: str, message: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as e:
        read_labels(path)
    assert message in str(e.value) and str(path) in str(e.value)


def test_read_labels_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"descriptions file .*nope\.toml does not exist"):
        read_labels(tmp_path / "nope.toml")


def test_prototypes_and_leave_one_out_arithmetic() -> None:
    rng = np.random.default_rng(0)
    v = rng.normal(size=(6, 8)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    owner = np.array([0, 0, 1, 1, 1, 0])
    protos = prototypes(v, owner, 2)
    want0 = v[[0, 1, 5]].mean(axis=0)
    np.testing.assert_allclose(protos[0], want0 / np.linalg.norm(want0), atol=1e-6)
    probs = scaled_softmax(v, protos, DEFAULT_SCALE)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)
    example = np.array([False, False, False, True, False, True])
    loo, y = leave_one_out(v, owner, example, 2, DEFAULT_SCALE)
    assert y.tolist() == [1, 0]
    held = v[[0, 1]].mean(axis=0)  # example 5's label without it
    held /= np.linalg.norm(held)
    want = scaled_softmax(v[5:6], np.stack([held, protos[1]]), DEFAULT_SCALE)[0]
    np.testing.assert_allclose(loo[1], want, atol=1e-5)


def test_zero_shot_head_labels_its_descriptions_on_every_runtime(tmp_path: Path) -> None:
    """A sentence equal to a description gets that label; the head folder loads in the
    classify stage (Keras) and converts through the quantize path (fp32 and int8 ONNX)
    with the same labels; examples give it a leave-one-out temperature."""
    from docintel.pipeline.offline.quantize import build_fp32_classifier, build_int8_classifier
    from docintel.pipeline.offline.train import embed_texts

    out = tmp_path / "zs"
    record = build_zeroshot(_write(tmp_path, LABELS), out, EmbedConfig(), ["en"])
    assert record[ZERO_SHOT_KEY]["scale"] == DEFAULT_SCALE
    assert record["calibration"]["fitted_on"] == "examples, leave-one-out"
    assert record["calibration"]["n"] == 4
    training = json.loads((out / TRAINING_FILE).read_text())
    assert training["embedder"] == record["embedder"]
    spec = read_labels(tmp_path / "labels.toml")
    texts = [d for n in spec.names for d in spec.descriptions[n]]
    want = [n for n in spec.names for _ in spec.descriptions[n]]
    x, _ = embed_texts(texts, EmbedConfig())
    cfg = ClassifyConfig(model_dir=str(out))
    keras = Classifier(cfg)
    keras.setup()
    probs = keras.predict(x)
    assert [keras.labels[i] for i in probs.argmax(axis=1)] == want
    int8_dir = tmp_path / "int8"
    build_fp32_classifier(out, int8_dir)
    build_int8_classifier(out, int8_dir)
    for onnx in (OnnxClassifier(cfg, int8_dir), Int8Classifier(cfg, int8_dir)):
        onnx.setup()
        got = onnx.predict(x)
        assert got.argmax(axis=1).tolist() == probs.argmax(axis=1).tolist()
        np.testing.assert_allclose(got, probs, atol=0.02 if onnx.precision == "int8" else 1e-5)
