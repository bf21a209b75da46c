"""Classifier: labels from labels.json, probability rows, and clear errors for a bad folder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from docintel.pipeline.artefacts.paths import CLASSIFIER_MODEL_FILE, LABELS_FILE, TRAINING_FILE
from docintel.pipeline.config import ClassifyConfig
from docintel.pipeline.errors import ModelError
from docintel.pipeline.schema import EMBEDDING, LABEL, PROBS, SCORE, TEXT
from docintel.pipeline.stages.classify import (
    Classifier,
    Int8Classifier,
    read_classifier_meta,
)

FINSENT_DIR = Path(__file__).resolve().parents[2] / "models" / "finsent"


@pytest.fixture(scope="module")
def embedded(valid_embedded) -> pa.Table:
    return valid_embedded


def test_labels_scores_and_probs(classifier, embedded):
    labels = json.loads((FINSENT_DIR / LABELS_FILE).read_text())
    assert classifier.labels == labels
    out = classifier(embedded)
    assert out.num_rows == embedded.num_rows
    assert out.column_names[-3:] == [LABEL, SCORE, PROBS]
    assert out.schema.field(SCORE).type == pa.float32()
    assert out.schema.field(PROBS).type == pa.list_(pa.float32(), len(labels))
    assert set(out[LABEL].to_pylist()) <= set(labels)
    scores = out[SCORE].to_numpy()
    assert ((scores > 0) & (scores <= 1)).all()
    probs = out[PROBS].combine_chunks().flatten().to_numpy().reshape(-1, len(labels))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    assert (probs >= 0).all()
    # the label is the arg-max class and the score its probability
    assert out[LABEL].to_pylist() == [labels[i] for i in probs.argmax(axis=1)]
    np.testing.assert_allclose(scores, probs.max(axis=1), rtol=0, atol=1e-7)
    # every 3-class score is at least 1/3
    assert scores.min() >= 1 / len(labels) - 1e-6


def test_classifier_agrees_with_vendored_labels(classifier, embedded, valid_texts):
    """A sanity check that the model is the trained one, not a random head: most of the
    first 30 validation tweets (labelled 0 = Bearish in the CSV) come out Bearish."""
    out = classifier(embedded)
    assert out[LABEL].to_pylist().count("Bearish") >= 15


def test_empty_table(classifier, embedder):
    out = classifier(embedder(pa.table({TEXT: pa.array([], pa.string())})))
    assert out.num_rows == 0
    assert out.schema.field(PROBS).type == pa.list_(pa.float32(), 3)


def _copy_model_dir(tmp_path, skip: str | None = None):
    folder = tmp_path / "clf"
    folder.mkdir()
    for name in (CLASSIFIER_MODEL_FILE, LABELS_FILE, TRAINING_FILE):
        if name != skip:
            shutil.copy(FINSENT_DIR / name, folder / name)
    return folder


@pytest.mark.parametrize("missing", [CLASSIFIER_MODEL_FILE, LABELS_FILE])
def test_missing_file_raises_model_error_naming_it(tmp_path, missing):
    folder = _copy_model_dir(tmp_path, skip=missing)
    with pytest.raises(ModelError, match=re.escape(missing)) as exc:
        Classifier(ClassifyConfig(model_dir=str(folder))).setup()
    assert str(folder) in str(exc.value)
    # the int8 copy reads its labels from the same folder: the same message, first
    with pytest.raises(ModelError, match=re.escape(missing)):
        Int8Classifier(ClassifyConfig(model_dir=str(folder)), tmp_path / "int8").setup()
    with pytest.raises(ModelError, match=re.escape(missing)):
        read_classifier_meta(folder)


def test_wrong_number_of_labels_raises_model_error(tmp_path):
    folder = _copy_model_dir(tmp_path)
    (folder / LABELS_FILE).write_text(json.dumps(["Bearish", "Bullish"]))
    with pytest.raises(ModelError, match=r"3 classes.*names 2"):
        Classifier(ClassifyConfig(model_dir=str(folder))).setup()


@pytest.mark.parametrize("content", ["not json", "[]", '{"a": 1}', "[1, 2, 3]"])
def test_malformed_labels_json_raises_model_error(tmp_path, content):
    folder = _copy_model_dir(tmp_path)
    (folder / LABELS_FILE).write_text(content)
    with pytest.raises(ModelError, match=re.escape(str(folder))):
        read_classifier_meta(folder)


def test_wrong_embedding_dimension_raises_model_error(classifier):
    with pytest.raises(ModelError, match="384"):
        classifier.predict(np.zeros((2, 128), dtype=np.float32))


def test_table_with_wrong_embedding_dimension_raises_model_error(classifier):
    table = pa.table(
        {EMBEDDING: pa.FixedSizeListArray.from_arrays(pa.array([0.0] * 6, pa.float32()), 3)}
    )
    with pytest.raises(ModelError, match="384"):
        classifier(table)
