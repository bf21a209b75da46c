"""`docintel train --descriptions` (zero-shot heads) and `docintel train DOCS --documents`
as a user runs them: head folders the classify stage loads, document-level metrics, and
the refusals (exit 2, naming the file, label or column)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from docintel.pipeline.artefacts.paths import LABELS_FILE, METRICS_FILE, TRAINING_FILE
from docintel.pipeline.offline.train import embed_texts
from docintel.pipeline.stages.classify import Classifier, ClassifyConfig
from docintel.pipeline.stages.embed_settings import EmbedConfig
from tests.cli.test_cli import docintel

LABELS = """
[labels]
jobs = ["The company will cut jobs.", "Workers went on strike over pay."]
results = "The company reported its quarterly profit and revenue."
"""

JOBS = [
    "Acme will cut 400 jobs at its Leeds plant.\n\nThe union said it would fight the layoffs.",
    "Workers at Bolt Foods walked out on Monday. The strike is over pay. Talks resume soon.",
    "Crest Bank plans to shed 1,200 staff. Branches will close next year.",
    "Dunmore Steel froze hiring. It will not replace staff who leave.",
    "Union members at Elm Air voted for a pay deal. The agreement runs two years.",
]
RESULTS = [
    "Acme's quarterly profit rose 12%.\n\nRevenue climbed to $2.1 billion, beating estimates.",
    "Bolt Foods posted a net loss for the year. Sales fell 8%. Margins narrowed.",
    "Crest Bank raised its full-year outlook after earnings beat forecasts.",
    "Dunmore Steel's operating profit doubled in the third quarter.",
    "Elm Air reported record revenue. Earnings per share were 41 cents.",
]


def _classifier(model: Path) -> Classifier:
    clf = Classifier(ClassifyConfig(model_dir=str(model)))
    clf.setup()
    return clf


def test_train_descriptions_builds_a_head_the_classify_stage_runs(tmp_path: Path) -> None:
    labels = tmp_path / "labels.toml"
    labels.write_text(LABELS)
    docs = tmp_path / "check.csv"
    texts = JOBS + RESULTS
    pd.DataFrame({"text": texts, "label": ["jobs"] * 5 + ["results"] * 5}).to_csv(docs)
    model = tmp_path / "zs"
    r = docintel(
        "train", "--descriptions", labels, "--out", model, "--documents", "--score-on", docs
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = " ".join(r.stdout.split())
    assert "zero-shot head: 2 labels, 3 descriptions, 0 examples" in out
    assert "softmax(20 * cosine to each label's prototype); not calibrated" in out
    assert f"on {docs.name}, document level: accuracy" in out
    assert json.loads((model / LABELS_FILE).read_text()) == ["jobs", "results"]
    training = json.loads((model / TRAINING_FILE).read_text())
    assert "calibration" not in training and training["zero_shot"]["scale"] == 20.0
    scored = json.loads((model / METRICS_FILE).read_text())["evaluations"][docs.name]
    assert scored["level"] == "document" and scored["n"] == 10
    assert scored["accuracy"] >= 0.8, scored  # two easy topics, plain descriptions
    clf = _classifier(model)
    # a sentence equal to a description gets its label
    said = [
        "Workers went on strike over pay.",
        "The company reported its quarterly profit and revenue.",
    ]
    x, _ = embed_texts(said, EmbedConfig())
    probs = clf.predict(x)
    assert probs.shape == (2, 2) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert [clf.labels[i] for i in probs.argmax(axis=1)] == ["jobs", "results"]


def test_train_documents_end_to_end_with_document_metrics(tmp_path: Path) -> None:
    data = tmp_path / "docs.parquet"
    texts = JOBS + RESULTS
    frame = pd.DataFrame({"body": texts, "topic": ["jobs"] * 5 + ["results"] * 5})
    frame.to_parquet(data)
    model = tmp_path / "docs-head"
    r = docintel(
        "train", data, "--documents", "--out", model, "--text-column", "body",
        "--label-column", "topic", "--no-progress",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = " ".join(r.stdout.split())
    assert "held-out documents of docs.parquet" in out and "document level: accuracy" in out
    assert "sentence level (each sentence against its document's label)" in out
    m = json.loads((model / METRICS_FILE).read_text())
    assert m["level"] == "document" and m["n"] == 2  # one held-out document per label
    assert m["sentences"]["level"] == "sentence" and m["sentences"]["n"] >= 2
    training = json.loads((model / TRAINING_FILE).read_text())
    d = training["documents"]
    assert (d["documents"], d["train_documents"], d["holdout_documents"]) == (10, 8, 2)
    assert d["weighting"] == "document" and d["sentences"] == training["rows"] > 10
    assert training["calibration"]["method"] == "temperature"
    clf = _classifier(model)
    x, _ = embed_texts(["Quarterly profit rose 9%.", "The union called a strike."], EmbedConfig())
    assert clf.predict(x).shape == (2, 2) and clf.labels == ["jobs", "results"]


def test_train_topics_refusals_exit_2_naming_what_is_wrong(tmp_path: Path) -> None:
    one = tmp_path / "one.toml"
    one.write_text('[labels]\njobs = "The company will cut jobs."\n')
    empty = tmp_path / "empty.toml"
    empty.write_text('[labels]\njobs = "Jobs."\nresults = ""\n')
    nolabel = tmp_path / "nolabel.csv"
    pd.DataFrame({"text": JOBS + RESULTS}).to_csv(nolabel, index=False)
    cases = [
        (["--descriptions", one], ["one.toml", "at least two"]),
        (["--descriptions", empty], ["empty.toml", "results", "empty"]),
        (["--descriptions", tmp_path / "missing.toml"], ["missing.toml"]),
        ([nolabel, "--documents"], ["nolabel.csv", "no column 'label'"]),
        ([nolabel, "--descriptions", one], ["drop DATA"]),
        ([], ["give DATA"]),
        ([nolabel, "--documents", "--fine-tune"], ["does not take --fine-tune"]),
    ]
    for args, words in cases:
        r = docintel("train", *args, "--out", tmp_path / "never")
        err = " ".join(r.stderr.split())
        assert r.returncode == 2, (args, r.stdout[-2000:], r.stderr[-2000:])
        assert all(w in err for w in words), (args, err)
        assert "Traceback" not in err
    assert not (tmp_path / "never").exists()
