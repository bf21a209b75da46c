"""Heads trained and scored on labelled whole documents (`docintel train DOCS --documents`).

A document is sentencized by the pipeline's own sentencize stage (same spaCy pipeline,
paragraph and headline handling, quote mending), its sentences embedded by the embed
stage, and each sentence learns its document's label. Sentences are weighted so that
each document counts once and each class as much as any other (``"document"``
weighting: ``1 / n_sentences`` of its document times the class's balanced weight over
documents): a long document no longer outvotes ten short ones, and its many background
sentences (quotes, boilerplate) weigh what one document's worth of evidence should
(BENCHMARKS.md, "Topics: zero-shot and document-trained heads (issue 33)").
``"sentence"`` weighting is the plain scheme (each sentence one row, classes balanced over
sentences).

The hold-out is split BY DOCUMENT (stratified over the documents' labels), so no
document has sentences on both sides. A document is labelled as a run labels it: the
arg-max of the mean of its sentences' (calibrated) probabilities. metrics.json holds the
document-level accuracy and macro-F1 at its top level (``"level": "document"``) and the
sentence-level figures under ``"sentences"``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from docintel.pipeline.artefacts.paths import METRICS_FILE, TRAINING_FILE
from docintel.pipeline.errors import DocumentsRejected, InputError
from docintel.pipeline.offline.metrics import metrics
from docintel.pipeline.offline.train import (
    HOLDOUT_FRACTION,
    SEED,
    HeadParams,
    load_labelled,
    stratified_split,
)
from docintel.pipeline.schema import DOC_ID, TEXT
from docintel.pipeline.stages.classify import DEFAULT_HEAD_LANGUAGES
from docintel.pipeline.stages.embed_settings import EmbedConfig
from docintel.pipeline.stages.sentencize import SentencizeConfig

Weighting = Literal["document", "sentence"]
DEFAULT_WEIGHTING: Weighting = "document"
DOCUMENTS_KEY = "documents"  # training.json: the documents, their sentences, the weighting


@dataclass(frozen=True)
class Documents:
    """Labelled documents: texts, class ids, class names (id order)."""

    texts: list[str]
    y: np.ndarray
    names: list[str]


@dataclass(frozen=True)
class Sentences:
    """The sentences of a list of documents: their texts and their document's position."""

    texts: list[str]
    doc: np.ndarray


def read_documents(
    path: Path,
    text_column: str = "text",
    label_column: str = "label",
    names: list[str] | None = None,
) -> Documents:
    """Labelled documents from a CSV or Parquet file (rows without text or label left
    out). A missing column is refused naming the file and the column; with ``names``
    (a head's labels) a label the head does not know is refused, else every class needs
    two documents (one may be held out)."""
    texts, labels = load_labelled(path, text_column, label_column)
    if not texts:
        raise InputError(f"documents file {path} has no rows with both text and label")
    if names is not None:
        unknown = sorted(set(labels) - set(names))
        if unknown:
            raise InputError(f"{path} has labels {unknown} that the head does not know ({names})")
    else:
        names = sorted(set(labels))
        counts = {n: labels.count(n) for n in names}
        few = sorted(n for n, c in counts.items() if c < 2)
        if len(names) < 2 or few:
            raise InputError(
                f"documents file {path}: every label needs at least two documents and there "
                f"must be two labels or more; label counts {counts}"
            )
    index = {n: i for i, n in enumerate(names)}
    return Documents(texts, np.array([index[lb] for lb in labels], np.int64), names)


def sentencize(texts: list[str], cfg: SentencizeConfig, where: Path) -> Sentences:
    """Sentences of ``texts`` by the sentencize stage itself; a document over its
    ``max_sentences`` is refused naming its row (1-based, as in the file)."""
    from docintel.pipeline.stages.sentencize import Sentencizer

    stage = Sentencizer(cfg)
    stage.setup()
    table = pa.table({DOC_ID: [str(i) for i in range(len(texts))], TEXT: texts})
    try:
        out = stage(table)
    except DocumentsRejected as e:
        rows = sorted(int(d) + 1 for d in e.reasons)
        raise InputError(
            f"{where}: document row(s) {rows[:10]} split into more sentences than "
            f"[sentencize] max_sentences ({cfg.max_sentences:,})"
        ) from None
    finally:
        stage.teardown()
    doc = np.array([int(d) for d in out[DOC_ID].to_pylist()], np.int64)
    return Sentences(out[TEXT].to_pylist(), doc)


def sentence_weights(
    doc: np.ndarray, y_doc: np.ndarray, n_classes: int, weighting: Weighting
) -> np.ndarray:
    """Training weights of sentences (``doc``: each one's document; ``y_doc``: every
    document's class): ``"document"`` = balanced over documents, shared by each
    document's sentences; ``"sentence"`` = balanced over sentences. Mean 1."""
    y = y_doc[doc]
    if weighting == "sentence":
        counts = np.bincount(y, minlength=n_classes)
        w = 1.0 / np.maximum(counts, 1)[y]
    else:
        docs = np.unique(doc)
        per_class = np.bincount(y_doc[docs], minlength=n_classes)
        n_sent = np.bincount(doc, minlength=len(y_doc))
        w = 1.0 / (np.maximum(per_class, 1)[y] * n_sent[doc])
    return (w / w.mean()).astype(np.float32)


def document_probs(probs: np.ndarray, doc: np.ndarray, n_docs: int) -> np.ndarray:
    """Each document's mean sentence probabilities [n_docs, classes]; a document without
    sentences has a row of NaN (a run gives it a null label)."""
    sums = np.zeros((n_docs, probs.shape[1]), np.float64)
    np.add.at(sums, doc, probs)
    counts = np.bincount(doc, minlength=n_docs).astype(np.float64)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / counts


def document_metrics(
    probs: np.ndarray, doc: np.ndarray, y_doc: np.ndarray, names: list[str], docs: np.ndarray
) -> dict[str, Any]:
    """Document-level metrics of ``docs`` (positions) from their sentences' probabilities
    (``probs`` and ``doc`` of those sentences): each labelled with the arg-max of its mean,
    as a run labels it; a document without sentences counts as wrong (``unlabelled``)."""
    mean = document_probs(probs, doc, len(y_doc))[docs]
    labelled = ~np.isnan(mean).any(axis=1)
    y = y_doc[docs]
    pred = np.where(labelled, np.nan_to_num(mean).argmax(axis=1), (y + 1) % len(names))
    return {"level": "document", **metrics(y, pred, names), "unlabelled": int((~labelled).sum())}


def _sentence_metrics(
    probs: np.ndarray, y: np.ndarray, names: list[str], calibration: dict[str, Any] | None
) -> dict[str, Any]:
    result = {"level": "sentence", **metrics(y, probs.argmax(axis=1), names)}
    if calibration:
        result["ece"] = calibration["ece_after"]
    return result


def evaluate_documents(
    model_dir: Path,
    data: Path,
    embed_cfg: EmbedConfig,
    sent_cfg: SentencizeConfig,
    text_column: str = "text",
    label_column: str = "label",
) -> dict[str, Any]:
    """Document-level metrics (and, under ``sentences``, sentence-level ones: each
    sentence against its document's label) of the head in ``model_dir`` on a labelled
    documents file, run as the pipeline runs it: sentencize, embed, classify (the head's
    temperature applied), mean per document, arg-max."""
    from docintel.pipeline.offline.train import embed_texts, encoder_for_head
    from docintel.pipeline.stages.classify import Classifier, ClassifyConfig, check_head_encoder

    embed_cfg = encoder_for_head(model_dir, embed_cfg)
    check_head_encoder(model_dir, embed_cfg.resolved_model_path())
    clf = Classifier(ClassifyConfig(model_dir=str(model_dir)))
    clf.setup()
    docs = read_documents(data, text_column, label_column, names=clf.labels)
    sents = sentencize(docs.texts, sent_cfg, data)
    x, _ = embed_texts(sents.texts, embed_cfg)
    probs = clf.predict(x)
    result = document_metrics(probs, sents.doc, docs.y, clf.labels, np.arange(len(docs.y)))
    sentence = {"level": "sentence", **metrics(docs.y[sents.doc], probs.argmax(axis=1), clf.labels)}
    return {**result, "sentences": sentence}


def scored_files(
    out: Path,
    files: Sequence[Path],
    embed_cfg: EmbedConfig,
    sent_cfg: SentencizeConfig,
    documents: bool,
    columns: tuple[str, str] = ("text", "label"),
) -> dict[str, Any]:
    """The head in ``out`` scored on each labelled file (whole documents with
    ``documents``: :func:`evaluate_documents`; else sentences, as `docintel evaluate`
    scores them), added to its metrics.json under ``evaluations`` by file name."""
    from docintel.pipeline.offline.train import evaluate

    if documents:
        scored = {f.name: evaluate_documents(out, f, embed_cfg, sent_cfg, *columns) for f in files}
    else:
        scored = {f.name: evaluate(out, f, embed_cfg) for f in files}
    if scored:
        record = json.loads((out / METRICS_FILE).read_text())
        record["evaluations"] = scored
        (out / METRICS_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return scored


@dataclass(frozen=True)
class _Split:
    """Sentences of the training documents and of the hold-out documents (positions)."""

    train_docs: np.ndarray
    hold_docs: np.ndarray
    train: np.ndarray
    hold: np.ndarray


def _split(docs: Documents, sents: Sentences, seed: int) -> _Split:
    tr_docs, ho_docs = stratified_split(docs.y, HOLDOUT_FRACTION, seed)
    held = np.isin(sents.doc, ho_docs)
    return _Split(tr_docs, ho_docs, np.flatnonzero(~held), np.flatnonzero(held))


def _fit(
    x: np.ndarray,
    docs: Documents,
    sents: Sentences,
    s: _Split,
    params: HeadParams,
    seed: int,
    weighting: Weighting,
) -> tuple[Any, list[float]]:
    """Fit the head on the training documents' sentences (weighted), early-stopped on the
    hold-out documents' sentences; the model and its hold-out curve."""
    from docintel.pipeline.offline.train import fit_head

    y = docs.y[sents.doc]
    w = sentence_weights(sents.doc[s.train], docs.y, len(docs.names), weighting)
    curve: list[float] = []
    tr, ho = s.train, s.hold
    model = fit_head(
        x[tr], y[tr], x[ho], y[ho], len(docs.names), params, seed, curve, sample_weight=w
    )
    return model, curve


def _record(
    data: Path,
    docs: Documents,
    sents: Sentences,
    s: _Split,
    weighting: Weighting,
    base: dict[str, Any],
) -> dict[str, Any]:
    """training.json: the sentence-level record ``base`` plus the documents' side."""
    n_sent = np.bincount(sents.doc, minlength=len(docs.y))
    base[DOCUMENTS_KEY] = {
        "data": data.name,
        "documents": len(docs.y),
        "train_documents": len(s.train_docs),
        "holdout_documents": len(s.hold_docs),
        "documents_without_sentences": int((n_sent == 0).sum()),
        "sentences": len(sents.texts),
        "sentences_per_document_median": float(np.median(n_sent)),
        "split": "by document, stratified over the documents' labels",
        "weighting": weighting,
        "document_label": "arg-max of the mean of its sentences' probabilities",
    }
    return base


def train_documents(
    data: Path,
    out: Path,
    embed_cfg: EmbedConfig,
    sent_cfg: SentencizeConfig,
    params: HeadParams | None = None,
    seed: int = SEED,
    weighting: Weighting = DEFAULT_WEIGHTING,
    languages: Sequence[str] = DEFAULT_HEAD_LANGUAGES,
    columns: tuple[str, str] = ("text", "label"),
) -> dict[str, Any]:
    """Train a head on the labelled documents of ``data`` into ``out`` (module docstring);
    return metrics.json's record (document-level, sentence-level under ``sentences``)."""
    from docintel.pipeline.offline.train import _Classes, _save_head, embed_texts
    from docintel.pipeline.stages.classify import (
        CALIBRATION_KEY,
        LANGUAGES_KEY,
        apply_temperature,
    )

    params = params or HeadParams()
    t0 = time.perf_counter()
    docs = read_documents(data, *columns)
    sents = sentencize(docs.texts, sent_cfg, data)
    s = _split(docs, sents, seed)
    x, embedder = embed_texts(sents.texts, embed_cfg)
    model, curve = _fit(x, docs, sents, s, params, seed, weighting)
    y = docs.y[sents.doc]
    c = _Classes(sents.texts, y, docs.names, s.train, s.hold)
    _, calibration = _save_head(model, x[s.hold], c, out)
    raw = np.asarray(model(x[s.hold], training=False))
    probs = apply_temperature(raw, calibration["temperature"])
    result = document_metrics(probs, sents.doc[s.hold], docs.y, docs.names, s.hold_docs)
    result = {"split": "holdout", **result}
    result["sentences"] = _sentence_metrics(probs, y[s.hold], docs.names, calibration)
    record: dict[str, Any] = {
        "embedder": embedder,
        "embedding_dim": int(x.shape[1]),
        "rows": len(sents.texts),
        "train_rows": len(s.train),
        "holdout_rows": len(s.hold),
        "seed": seed,
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in params.__dict__.items()},
        "head_curve": {"holdout_sentence_macro_f1_per_epoch": curve},
        CALIBRATION_KEY: calibration,
        LANGUAGES_KEY: list(languages),
        "seconds": {"total": round(time.perf_counter() - t0, 1)},
    }
    record = _record(data, docs, sents, s, weighting, record)
    (out / TRAINING_FILE).write_text(json.dumps(record, indent=2) + "\n")
    (out / METRICS_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result
