"""Extra classifier heads ([classify.heads], --classifier NAME=DIR): the refusals before any
work, one classify call writing every head's columns, and a document's label per head."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from docintel.pipeline import registry
from docintel.pipeline.batch import Batch
from docintel.pipeline.config import ClassifyConfig, load_config
from docintel.pipeline.errors import ConfigError, ModelError, UsageError
from docintel.pipeline.labels import LabelRef, resolve_label
from docintel.pipeline.output.sink import documents_table, sentences_table
from docintel.pipeline.schema import (
    DOC_ID,
    EMBEDDING,
    END_CHAR,
    LANGUAGE,
    N_TOKENS,
    PROBS,
    SENT_INDEX,
    START_CHAR,
    TEXT,
    TRUNCATED,
    documents_schema,
    empty_errors,
)
from docintel.pipeline.stages.classify import OnnxClassifier, parse_head_options

DEFAULT_HEAD = ClassifyConfig().resolved_model_dir()


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two copies of the bundled head (the run's encoder), one of them as an older docintel
    wrote it (no languages, no calibration), one on another encoder, one without files."""
    root = tmp_path_factory.mktemp("heads")
    out = {name: root / name for name in ("topic", "old", "foreign", "empty")}
    for name in ("topic", "old", "foreign"):
        shutil.copytree(DEFAULT_HEAD, out[name], ignore=shutil.ignore_patterns("encoder"))
    rec = json.loads((out["old"] / "training.json").read_text())
    for key in ("languages", "calibration"):
        rec.pop(key, None)
    (out["old"] / "training.json").write_text(json.dumps(rec))
    rec["embedder"] = "other-encoder@0123456789ab"
    (out["foreign"] / "training.json").write_text(json.dumps(rec))
    out["empty"].mkdir()
    return out


def _cfg(**heads: Path | str) -> object:
    return load_config(None, {"classify.heads": {k: str(v) for k, v in heads.items()}})


def test_head_names_and_folders_are_refused_before_any_work(heads: dict[str, Path]) -> None:
    """Each refusal is a usage error (exit 2) naming the head; an older head folder runs."""
    bad_names = {
        "Topic": "lower-case identifier",
        "2nd": "lower-case identifier",
        "top": "top_label",  # documents' top_label
        "language": "'language'",  # a contract column itself
        "n_bearish": "reserved",
    }
    for name, said in bad_names.items():
        with pytest.raises(ConfigError, match=said):
            _cfg(**{name: heads["topic"]})
    # the CLI after the config: one name twice, whatever its case, is refused
    with pytest.raises(ConfigError, match="already declared"):
        parse_head_options(["TOPIC=x"], {"topic": str(heads["topic"])})
    with pytest.raises(ConfigError, match="NAME=DIR"):
        parse_head_options(["topic"], {})
    assert parse_head_options(["risk = r/"], {"topic": "t/"}) == {"topic": "t/", "risk": "r/"}
    # folders: missing, without the head's files, trained on another encoder (both named)
    with pytest.raises(ModelError, match=r"\[classify.heads\] gone: .* does not exist"):
        registry.CLASSIFY.check(_cfg(gone=heads["topic"].parent / "gone"))
    with pytest.raises(ModelError, match=r"has no model\.keras"):
        registry.CLASSIFY.check(_cfg(empty=heads["empty"]))
    with pytest.raises(ModelError, match=r"other-encoder@0123456789ab.*encoder@") as e:
        registry.CLASSIFY.check(_cfg(foreign=heads["foreign"]))
    assert str(heads["foreign"]) in str(e.value)
    facts = registry.CLASSIFY.check(_cfg(topic=heads["topic"], old=heads["old"]))
    assert [h["name"] for h in facts.heads] == ["topic", "old"]
    assert facts.heads[0]["labels"] == facts.labels
    assert facts.heads[0]["version"].startswith("topic@")


def test_one_call_labels_every_head_and_documents_take_the_mean(
    heads: dict[str, Path], tmp_path: Path
) -> None:
    """The ONNX stage (fp32; the int8 and Keras paths share __call__) writes each head's
    label, score and internal probabilities in the same call; a copy of the default head
    agrees with it row for row, except where its languages leave a row unlabelled. The
    documents table averages each head's probabilities over labelled sentences only."""
    cfg = _cfg(topic=heads["topic"], old=heads["old"])
    for a in registry.CLASSIFY.backends["onnx-fp32"].artefacts(cfg):
        a.path.is_file() or a.build()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    table = pa.table(
        {
            DOC_ID: ["a", "a", "a", "b", "b", "c"],
            SENT_INDEX: pa.array([0, 1, 2, 0, 1, 0], pa.int32()),
            START_CHAR: pa.array([0] * 6, pa.int64()),
            END_CHAR: pa.array([1] * 6, pa.int64()),
            TEXT: ["s"] * 6,
            LANGUAGE: ["en", "en", "de", "en", "en", "de"],
            N_TOKENS: pa.array([3] * 6, pa.int32()),
            TRUNCATED: [False] * 6,
            EMBEDDING: pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 384),
        }
    )
    stage = OnnxClassifier(cfg.classify, cfg.embed.resolved_int8_dir())
    stage.setup()
    out = stage(table)
    assert out["topic_label"].to_pylist() == out["label"].to_pylist()
    assert out["topic_label"].null_count == 2  # the two German rows
    assert out["old_label"].null_count == 2  # no languages recorded: English only
    batch = Batch(
        batch_id="b0",
        doc_ids=pa.array(["a", "b", "c", "d"]),  # d: no sentences
        table=out,
        errors=empty_errors(),
        backends={"classify": stage.backend},
        versions={"classify": stage.version},
    )
    docs = documents_table(batch, stage.labels)
    assert docs.schema == documents_schema(stage.labels, heads=["topic", "old"])
    probs = np.asarray(out[PROBS].to_pylist())
    for i, (doc, rows) in enumerate({"a": [0, 1], "b": [3, 4]}.items()):
        mean = probs[rows].mean(axis=0)
        assert docs["topic_label"][i].as_py() == stage.labels[int(mean.argmax())], doc
        assert docs["topic_score"][i].as_py() == pytest.approx(mean.max(), rel=1e-6)
    # c has only an unlabelled sentence, d none: null label and score for every head
    assert docs["topic_label"].to_pylist()[2:] == [None, None]
    assert docs["old_score"].to_pylist()[2:] == [None, None]
    assert docs["top_label"].to_pylist() == docs["topic_label"].to_pylist()
    sents = sentences_table(batch, embeddings=False)
    assert not [c for c in sents.column_names if c.startswith(PROBS)]
    assert sents.schema.field("topic_score").type == pa.float32()
    heads_cols = ["topic_label", "topic_score", "old_label", "old_score"]
    assert sents.column_names[-6:] == [*heads_cols, "classify_backend", "classify_model"]


def test_labels_of_any_head_resolve_in_any_case() -> None:
    """``label`` is the default head's, ``NAME.label`` the extra head NAME's; a default
    label with a dot stays the default's unless a head has the name before it."""
    heads = {"": ["Bearish", "U.S. news"], "topic": ["layoffs", "Mergers"]}
    assert resolve_label("bearish", heads, "--label") == LabelRef("", "Bearish")
    assert resolve_label("u.s. NEWS", heads, "--label") == LabelRef("", "U.S. news")
    ref = resolve_label("TOPIC.mergers", heads, "--label")
    assert (ref, ref.label_column, ref.score_column) == (
        LabelRef("topic", "Mergers"),
        "topic_label",
        "topic_score",
    )
    assert str(ref) == "topic.Mergers"
    with pytest.raises(UsageError, match=r"--label 'topic.bearish' .*topic\.layoffs"):
        resolve_label("topic.bearish", heads, "--label")
