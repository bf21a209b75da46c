"""Heads trained on labelled documents (`docintel train DOCS --documents`): the reader's
refusals, the sentences by the sentencize stage, the weights and the document-level
aggregation a run uses (arg-max of the mean of the sentences' probabilities)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from docintel.pipeline.errors import InputError
from docintel.pipeline.offline.documents import (
    document_metrics,
    document_probs,
    read_documents,
    sentence_weights,
    sentencize,
)
from docintel.pipeline.stages.sentencize import SentencizeConfig


def test_read_documents_refuses_a_missing_column_naming_file_and_column(tmp_path: Path) -> None:
    path = tmp_path / "docs.csv"
    body = ["a b", "c d", "e f", "g h"]
    pd.DataFrame({"body": body, "label": ["x", "y", "x", "y"]}).to_csv(path, index=False)
    with pytest.raises(InputError) as e:
        read_documents(path)
    assert str(path) in str(e.value) and "no column 'text'" in str(e.value)
    assert "body, label" in str(e.value)
    with pytest.raises(InputError, match="no column 'topic'"):
        read_documents(path, "body", "topic")
    got = read_documents(path, "body", "label")
    assert got.texts == body and got.names == ["x", "y"] and got.y.tolist() == [0, 1, 0, 1]


def test_read_documents_parquet_and_too_few_documents(tmp_path: Path) -> None:
    path = tmp_path / "docs.parquet"
    pd.DataFrame({"text": ["a", "b", "c"], "label": ["x", "x", "y"]}).to_parquet(path)
    with pytest.raises(InputError, match=r"at least two documents.*'y': 1"):
        read_documents(path)
    with pytest.raises(InputError, match=r"labels \['y'\] that the head does not know"):
        read_documents(path, names=["x", "z"])
    assert read_documents(path, names=["y", "x"]).y.tolist() == [1, 1, 0]


def test_sentencize_is_the_stage_and_refuses_a_huge_document(tmp_path: Path) -> None:
    texts = ["Acme hires.\n\nIt adds 500 jobs. Unions agree.", "One sentence only."]
    s = sentencize(texts, SentencizeConfig(), tmp_path / "d.csv")
    assert s.texts == ["Acme hires.", "It adds 500 jobs.", "Unions agree.", "One sentence only."]
    assert s.doc.tolist() == [0, 0, 0, 1]
    with pytest.raises(InputError, match=r"d\.csv: document row\(s\) \[1\]"):
        sentencize(texts, SentencizeConfig(max_sentences=2), tmp_path / "d.csv")


def test_sentence_weights_count_each_document_once_and_balance_classes() -> None:
    doc = np.array([0, 0, 0, 0, 1, 2, 2])  # doc 0: 4 sentences, 1: 1, 2: 2
    y_doc = np.array([0, 0, 1])
    w = sentence_weights(doc, y_doc, 2, "document")
    per_doc = np.bincount(doc, weights=w)
    # class 0 has two documents, class 1 one: each class's documents sum to the same
    assert per_doc[0] == pytest.approx(per_doc[1])
    assert per_doc[2] == pytest.approx(per_doc[0] + per_doc[1])
    assert w.mean() == pytest.approx(1.0)
    s = sentence_weights(doc, y_doc, 2, "sentence")  # 5 sentences of class 0, 2 of class 1
    assert s[0] * 5 == pytest.approx(s[5] * 2)


def test_document_label_is_the_argmax_of_the_mean_not_the_majority() -> None:
    # doc 0: two mild votes for class 0, one strong vote for class 1 -> mean picks class 1
    probs = np.array([[0.55, 0.45], [0.55, 0.45], [0.0, 1.0], [0.9, 0.1]], np.float32)
    doc = np.array([0, 0, 0, 1])
    mean = document_probs(probs, doc, 3)
    np.testing.assert_allclose(mean[0], [1.1 / 3, 1.9 / 3], atol=1e-6)
    assert np.isnan(mean[2]).all()  # doc 2 has no sentence
    m = document_metrics(probs, doc, np.array([1, 0, 0]), ["a", "b"], np.arange(3))
    assert m["level"] == "document" and m["n"] == 3 and m["unlabelled"] == 1
    assert m["accuracy"] == pytest.approx(2 / 3)  # the sentence-less document counts wrong
    m = document_metrics(probs, doc, np.array([1, 0, 0]), ["a", "b"], np.array([0, 1]))
    assert m["accuracy"] == 1.0 and m["unlabelled"] == 0
