"""Issue 35, quality: the bench's seeded test set (bench/redact_quality.py) at a small size -
recall >= 0.97 a type, at most 1 false placeholder per 1,000 clean news sentences, and a
per-sentence cost far inside 15% of a CPU run's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from docintel.pipeline.privacy import BUILTIN_TYPES, Redactor

BENCH = Path(__file__).resolve().parents[2] / "bench" / "redact_quality.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("redact_quality", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["redact_quality"] = module
    spec.loader.exec_module(module)
    return module


def test_the_test_set_is_seeded(bench: ModuleType) -> None:
    assert bench.personal_set(20, seed=3) == bench.personal_set(20, seed=3)
    assert bench.personal_set(20, seed=3) != bench.personal_set(20, seed=4)
    assert bench.clean_set(50, seed=3) == bench.clean_set(50, seed=3)


def test_recall_per_type(bench: ModuleType) -> None:
    rows = bench.personal_set(200, seed=35)
    recall = bench.measure_recall(Redactor(), rows)
    for kind in BUILTIN_TYPES:
        counts = recall["counts"][kind]
        assert counts["found"] / sum(counts.values()) >= 0.97, (kind, recall["misses"][:5])


def test_false_placeholders_on_clean_news(bench: ModuleType) -> None:
    sets = bench.clean_set(1000, seed=35)
    clean = bench.measure_clean(Redactor(), sets)
    sentences = sum(n for n, _ in clean["table"].values())
    assert sentences > 10_000
    assert len(clean["flagged"]) * 1000 / sentences <= 1.0, clean["flagged"][:5]


def test_cost_per_sentence_is_small(bench: ModuleType) -> None:
    """Measured ~25-45 us a sentence on this machine; the bound (500 us, 15% of a CPU run's
    ~3.3 ms a sentence) leaves room for a loaded machine."""
    news = bench.clean_set(0, seed=35)["news_style_check/news_sentences.csv"]
    per_s = bench.measure_speed(Redactor(), news, rounds=3)
    assert 1e6 / per_s < 500
