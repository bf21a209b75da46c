"""Language end to end (issue 32, item 6), on a local Ray: a Parquet input of English,
German, French, Spanish and mixed documents runs through the always-on language stage;
sentences carry ``language`` and other languages a null label and score; documents their
majority language, ``n_unlabelled`` and label counts over labelled sentences only; the
audit report and search read the run without crashing and count the unlabelled ones."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.fs as pafs
import pytest

from docintel.actors.runner import execute
from docintel.pipeline.report.aggregate import write_report
from docintel.pipeline.schema import UNLABELLED, label_count_column
from docintel.pipeline.search.query import search
from docintel.pipeline.search.source import Filters
from tests.conftest import assert_exactly_once, run_config, write_docs

DOCS = {
    "en": "Profit warning at Nordic Steel.\n\nShares fell. The group cut its outlook for the "
    "full year after orders dropped sharply in the third quarter.",
    "de": "Gewinnwarnung bei Müller Maschinenbau.\n\nDie Aktie verlor nach der Warnung mehr "
    "als neun Prozent an Wert. Der Vorstand senkt die Prognose für das Gesamtjahr.",
    "fr": "Le chiffre d'affaires du groupe a progressé de 8 % au premier semestre. L'action a "
    "chuté de plus de 6 % après l'annonce des résultats trimestriels.",
    "es": "Las ventas de la compañía crecieron un 11 % en el tercer trimestre. Las acciones "
    "cayeron un 7 % tras la publicación de los resultados.",
    "mixed": "The board proposed a dividend of 1.20 euros per share for the full year. Der "
    "Umsatz des Konzerns stieg im dritten Quartal um zwölf Prozent. Revenue rose 5% in the "
    "second quarter, ahead of what analysts had expected.",
}
EXPECTED = {  # document: (language, sentences, unlabelled)
    "en": ("en", 3, 0),
    "de": ("de", 3, 3),
    "fr": ("fr", 2, 2),
    "es": ("es", 2, 2),
    "mixed": ("en", 3, 1),
}


@pytest.mark.usefixtures("ray_cluster")
def test_mixed_languages_null_labels_counts_report_and_search(tmp_path: Path) -> None:
    inp = write_docs(tmp_path / "in.parquet", list(DOCS), list(DOCS.values()))
    out = tmp_path / "out"
    cfg = run_config(**{"run.run_id": "lang", "run.part_target_mb": 0})
    execute(cfg, str(inp), str(out))
    tables = assert_exactly_once(out, list(DOCS))
    sents, docs = tables["sentences"], tables["documents"].set_index("doc_id")

    assert set(sents.language) == {"en", "de", "fr", "es"}
    other = sents.language != "en"
    assert sents.label[other].isna().all() and sents.score[other].isna().all()
    assert sents.label[~other].notna().all() and sents.score[~other].between(0, 1).all()
    mixed = sents[sents.doc_id == "mixed"].sort_values("sent_index")
    assert list(mixed.language) == ["en", "de", "en"]
    assert (sents.language_backend == "cpu-fp32").all()
    assert sents.language_model.str.startswith("lingua-").all()

    manifest = json.loads((out / "_manifest.json").read_text())
    labels = manifest["labels"]
    for doc, (lang, n, unlabelled) in EXPECTED.items():
        row = docs.loc[doc]
        assert (row.language, row.n_sentences, row.n_unlabelled) == (lang, n, unlabelled), doc
        assert sum(row[label_count_column(lb)] for lb in labels) == n - unlabelled, doc
        assert pd.isna(row.top_label) == (unlabelled == n), doc
    assert manifest["stages"] == ["sentencize", "language", "embed", "classify"]

    # the audit report: unlabelled counted beside the labels, never one of them
    night = {"date": "2026-12-04", "ran": True, "run_id": "lang"}
    risk = labels[0]
    report = write_report(pafs.LocalFileSystem(), str(out), night, [], risk, 5)
    assert report["counts"]["unlabelled"] == 8
    assert report["label_distribution"][UNLABELLED] == 8
    assert sum(report["label_distribution"].values()) == report["counts"]["sentences"] == 13
    assert UNLABELLED not in report["labels"]
    assert "(unlabelled)" in (out / "report.html").read_text()

    # search: German hits come back with a null label; a label filter leaves them out
    result = search(str(out), ["Gewinnwarnung Aktie Prognose"], 13, Filters(), cfg)
    hits = result.hits[0]
    assert len(hits) == 13
    assert sum(h["label"] is None for h in hits) == 8
    assert all(h["score"] is None for h in hits if h["label"] is None)
    by_label = search(str(out), ["Gewinnwarnung"], 13, Filters(label=risk), cfg).hits[0]
    assert all(h["label"] == risk for h in by_label)
