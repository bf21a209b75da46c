"""Shared fixtures for the unit tier: real models, loaded once per test session.

No Ray here (docs/design.md, "Tests in three tiers"): stages are plain classes, so the tests
call ``setup()`` and ``__call__`` directly on tiny pyarrow tables.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

# Quiet TensorFlow's C++ start-up chatter; must be set before TF is first imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from docintel.pipeline.batch import Batch
from docintel.pipeline.config import (
    ClassifyConfig,
    EmbedConfig,
    SentencizeConfig,
)
from docintel.pipeline.schema import DOC_ID, TEXT

REPO_ROOT = Path(__file__).resolve().parents[2]
SENT_VALID = REPO_ROOT / "data" / "twitter_fin_sentiment" / "sent_valid.csv"
FINSENT_DIR = REPO_ROOT / "models" / "finsent"


@pytest.fixture(scope="session")
def sentencizer() -> Iterator:
    from docintel.pipeline.stages.sentencize import Sentencizer

    stage = Sentencizer(SentencizeConfig())
    stage.setup()
    yield stage
    stage.teardown()


@pytest.fixture(scope="session")
def embedder() -> Iterator:
    from docintel.pipeline.stages.embed import Embedder

    stage = Embedder(EmbedConfig())
    stage.setup()
    yield stage
    stage.teardown()


@pytest.fixture(scope="session")
def classifier() -> Iterator:
    from docintel.pipeline.stages.classify import Classifier

    stage = Classifier(ClassifyConfig())
    stage.setup()
    yield stage
    stage.teardown()


@pytest.fixture(scope="session")
def valid_texts() -> list[str]:
    """The first 30 texts of the vendored validation split (real financial tweets)."""
    with SENT_VALID.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r["text"] for r in rows[:30]]


@pytest.fixture(scope="session")
def valid_embedded(embedder, valid_texts) -> pa.Table:
    """``valid_texts`` through the real Embedder, computed once for the session."""
    return embedder(pa.table({TEXT: valid_texts}))


def docs_table(ids: list[str], texts: list[str | None]) -> pa.Table:
    """A documents table as read_unit produces it: doc_id and text, both strings."""
    return pa.table({DOC_ID: pa.array(ids, pa.string()), TEXT: pa.array(texts, pa.string())})


def docs_batch(
    ids: list[str], texts: list[str | None], batch_id: str = "test-00000-00000"
) -> Batch:
    table = docs_table(ids, texts)
    return Batch(batch_id=batch_id, doc_ids=table[DOC_ID].combine_chunks(), table=table)


@pytest.fixture(name="docs_table")
def docs_table_fixture():
    return docs_table


@pytest.fixture(name="docs_batch")
def docs_batch_fixture():
    return docs_batch
