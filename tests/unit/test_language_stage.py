"""The language stage (issue 32): each sentence's language with the document fallback,
the classify stage's null labels for languages the head was not trained on (every
backend: Keras, fp32 ONNX, int8 ONNX, the modelled placeholder), the documents table's
language and unlabelled counts, and the head's ``languages`` record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError

from docintel.pipeline import registry
from docintel.pipeline.batch import Batch
from docintel.pipeline.config import ClassifyConfig, load_config
from docintel.pipeline.errors import ModelError
from docintel.pipeline.output.sink import documents_table, sentences_table
from docintel.pipeline.schema import (
    DOC_ID,
    EMBEDDING,
    LABEL,
    LANGUAGE,
    N_UNLABELLED,
    SCORE,
    SENT_INDEX,
    TEXT,
    label_count_column,
)
from docintel.pipeline.stages import run_stage
from docintel.pipeline.stages.classify import (
    Classifier,
    Int8Classifier,
    OnnxClassifier,
    head_languages,
)
from docintel.pipeline.stages.language import LanguageConfig, LanguageDetector

# Written for these tests: wire-style sentences, and the short lines that have too few
# words to be judged alone (they take their document's language).
ENGLISH = [
    "Shares fell.",
    "Q3 beat.",
    "$AAPL $MSFT $GOOG",
    "Kattegat Cement's sales volumes rose 9 percent in the first half.",
    "The cooperation agreement was signed in Shanghai on Tuesday.",
    "Profit warning at Nordic Steel https://t.co/abc123",
    "Rating cut to Hold.",
]
LONG_ENGLISH = "The board proposed a dividend of 1.20 euros per share for the full year."
GERMAN = [
    "Kurssturz.",
    "Der Umsatz des Konzerns stieg im dritten Quartal um zwölf Prozent.",
    "Die Aktie verlor nach der Gewinnwarnung mehr als neun Prozent an Wert.",
    "Der Vorstand hält an seiner Prognose für das Gesamtjahr fest.",
]
FRENCH = [
    "Le chiffre d'affaires du groupe a progressé de 8 % au premier semestre.",
    "L'action a chuté de plus de 6 % après l'annonce des résultats trimestriels.",
    "Hausse.",
]
SPANISH = [
    "Las ventas de la compañía crecieron un 11 % en el tercer trimestre.",
    "Las acciones cayeron un 7 % tras la publicación de los resultados.",
    "Caída.",
]


@pytest.fixture(scope="module")
def detector() -> LanguageDetector:
    stage = LanguageDetector(LanguageConfig())
    stage.setup()
    return stage


def sentences(docs: dict[str, list[str]]) -> pa.Table:
    ids = [d for d, texts in docs.items() for _ in texts]
    index = [i for texts in docs.values() for i in range(len(texts))]
    texts = [t for texts in docs.values() for t in texts]
    return pa.table(
        {
            DOC_ID: pa.array(ids, pa.string()),
            SENT_INDEX: pa.array(index, pa.int32()),
            TEXT: pa.array(texts, pa.string()),
        }
    )


def test_english_keeps_en_and_other_languages_are_detected(detector) -> None:
    docs = {"en": ENGLISH, "de": GERMAN, "fr": FRENCH, "es": SPANISH}
    out = detector(sentences(docs))
    got = dict.fromkeys(docs, None)
    for doc in docs:
        got[doc] = [
            lang
            for d, lang in zip(out[DOC_ID].to_pylist(), out[LANGUAGE].to_pylist(), strict=True)
            if d == doc
        ]
    # short lines ("Shares fell.", "$AAPL $MSFT $GOOG", "Kurssturz.") take their document's
    assert got == {doc: [doc] * len(texts) for doc, texts in docs.items()}
    assert out.column_names == [DOC_ID, SENT_INDEX, TEXT, LANGUAGE]
    assert detector.version.startswith("lingua-2.") and detector.backend == "cpu-fp32"


def test_a_sentence_in_another_language_inside_a_document_keeps_its_own(detector) -> None:
    mixed = [*ENGLISH[3:], GERMAN[1], "Shares rose."]
    assert detector.document(mixed) == ["en"] * 4 + ["de", "en"]
    # a lone short line: the full detector reads it as a whole; nothing at all: the default
    assert detector.document(["Kurssturz an der Börse."]) == ["de"]
    assert detector.document(["$SPY $QQQ 4.5%", "https://t.co/x"]) == ["en", "en"]
    assert detector.document([]) == []


def test_empty_and_null_texts(detector) -> None:
    table = pa.table({DOC_ID: ["a", "a"], TEXT: pa.array([None, ""], pa.string())})
    assert detector(table)[LANGUAGE].to_pylist() == ["en", "en"]
    empty = detector(table.slice(0, 0))
    assert empty.num_rows == 0 and empty.schema.field(LANGUAGE).type == pa.string()


def test_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match=r"\['xx'\] are not ISO 639-1"):
        LanguageConfig(languages=["en", "xx"])
    with pytest.raises(ValidationError, match="not among"):
        LanguageConfig(languages=["de", "fr"])  # fast_languages ["en"] outside them
    with pytest.raises(ValidationError, match="default"):
        LanguageConfig(default="english")
    assert LanguageConfig(languages=["all"]).languages == ["all"]
    assert LanguageConfig(languages=["DE", "en"]).languages == ["de", "en"]
    cfg = load_config(None, {"language.languages": ["en", "de"], "language.min_words": 2})
    assert cfg.language.min_words == 2


def test_the_chain_has_it_before_embed() -> None:
    names = registry.chain(load_config()).names
    assert names.index("language") == names.index("embed") - 1
    listed = load_config(None, {"pipeline.stages": ["sentencize", "embed", "classify"]})
    assert registry.chain(listed).names == ["sentencize", "language", "embed", "classify"]


def test_head_languages() -> None:
    assert head_languages({}) == ["en"]  # a head without the key: English
    assert head_languages({"languages": ["EN", "de"]}) == ["en", "de"]
    for bad in ([], "en", ["eng"], [1]):
        with pytest.raises(ModelError, match="ISO 639-1"):
            head_languages({"languages": bad})
    for d in ("finsent_ft", "finsent"):
        training = json.loads(
            (Path(__file__).parents[2] / "models" / d / "training.json").read_text()
        )
        assert training["languages"] == ["en"]


@pytest.fixture(scope="module")
def embedded(embedder) -> pa.Table:
    """Six sentences, embedded, with the languages the stage would write."""
    texts = [ENGLISH[3], GERMAN[1], ENGLISH[4], FRENCH[0], SPANISH[0], ENGLISH[5]]
    table = embedder(pa.table({TEXT: texts}))
    return table.append_column(LANGUAGE, pa.array(["en", "de", "en", "fr", "es", "en"]))


@pytest.fixture(scope="module")
def onnx_heads(tmp_path_factory, classifier) -> list[Classifier]:
    from docintel.pipeline.offline.quantize import build_fp32_classifier, build_int8_classifier

    folder = tmp_path_factory.mktemp("heads")
    model_dir = ClassifyConfig().resolved_model_dir()
    build_fp32_classifier(model_dir, folder)
    build_int8_classifier(model_dir, folder)
    heads = [
        OnnxClassifier(ClassifyConfig(), folder, 1),
        Int8Classifier(ClassifyConfig(), folder, 1),
    ]
    for h in heads:
        h.setup()
    return heads


def test_every_backend_nulls_other_languages(classifier, onnx_heads, embedded) -> None:
    english = np.array([True, False, True, False, False, True])
    plain = classifier(embedded.drop_columns([LANGUAGE]))  # no language column: all labelled
    assert plain[LABEL].null_count == 0
    for head in [classifier, *onnx_heads]:
        out = head(embedded)
        assert out[LABEL].is_null().to_pylist() == (~english).tolist(), head.backend
        assert out[SCORE].is_null().to_pylist() == (~english).tolist(), head.backend
        kept = np.flatnonzero(english).tolist()
        assert out[LABEL].take(kept) == plain[LABEL].take(kept) or head.backend == "cpu-int8"
        assert out.num_rows == embedded.num_rows and out["probs"].null_count == 0
    # the modelled replica's placeholder does the same
    columns = registry.CLASSIFY.placeholder(load_config())(embedded)
    assert columns[LABEL].is_null().to_pylist() == (~english).tolist()
    assert columns[SCORE].is_null().to_pylist() == (~english).tolist()


def test_a_head_trained_on_more_languages_labels_them(tmp_path, embedded) -> None:
    head_dir = tmp_path / "head"
    shutil.copytree(
        ClassifyConfig().resolved_model_dir(), head_dir, ignore=shutil.ignore_patterns("encoder")
    )
    training = json.loads((head_dir / "training.json").read_text())
    (head_dir / "training.json").write_text(json.dumps({**training, "languages": ["en", "de"]}))
    head = Classifier(ClassifyConfig(model_dir=str(head_dir)))
    head.setup()
    out = head(embedded)
    assert out[LABEL].is_null().to_pylist() == [False, False, False, True, True, False]


def test_documents_count_unlabelled_and_take_the_majority_language(
    sentencizer, detector, embedder, classifier, docs_batch
) -> None:
    texts = {
        "en": " ".join(ENGLISH[3:6]),
        "de": " ".join(GERMAN[1:]),
        "mixed": f"{ENGLISH[3]} {GERMAN[1]} {GERMAN[2]} {ENGLISH[4]} {LONG_ENGLISH}",
        "blank": "",
    }
    batch: Batch = docs_batch(list(texts), list(texts.values()))
    for stage in (sentencizer, detector, embedder, classifier):
        batch = run_stage(stage, batch)
    labels = classifier.labels
    rows = {r[DOC_ID]: r for r in documents_table(batch, labels).to_pylist()}
    counts = {d: [rows[d][label_count_column(lb)] for lb in labels] for d in texts}
    assert {d: rows[d][LANGUAGE] for d in texts} == {
        "en": "en",
        "de": "de",
        "mixed": "en",
        "blank": None,
    }
    assert {d: rows[d][N_UNLABELLED] for d in texts} == {"en": 0, "de": 3, "mixed": 2, "blank": 0}
    assert sum(counts["en"]) == 3 and sum(counts["de"]) == 0 and sum(counts["mixed"]) == 3
    assert rows["de"]["n_sentences"] == 3
    assert rows["de"]["top_label"] is None and rows["de"]["top_score"] is None
    assert rows["mixed"]["top_label"] in labels and rows["en"]["top_label"] in labels
    sents = sentences_table(batch, embeddings=False)
    assert sents.schema.field(LABEL).nullable and sents.schema.field(LANGUAGE).type == pa.string()
    by_doc = [
        (d, lang, lab)
        for d, lang, lab in zip(
            *(sents[c].to_pylist() for c in (DOC_ID, LANGUAGE, LABEL)), strict=True
        )
    ]
    assert all((lab is None) == (lang != "en") for _, lang, lab in by_doc)
    assert "language_backend" in sents.column_names and "language_model" in sents.column_names
    assert EMBEDDING not in sents.column_names
