"""Shared test helpers: corpus builders and output readers (used by every tier)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import Config, load_config

REPO = Path(__file__).resolve().parent.parent
VALID_CSV = REPO / "data" / "twitter_fin_sentiment" / "sent_valid.csv"


def write_docs(
    path: Path,
    ids: list,
    texts: list,
    row_group_size: int = 4,
    text_type: pa.DataType | None = None,
) -> Path:
    """A documents Parquet file with columns doc_id, text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = pa.array(texts, text_type) if text_type is not None else pa.array(texts)
    pq.write_table(
        pa.table({"doc_id": pa.array(ids), "text": text}), path, row_group_size=row_group_size
    )
    return path


def run_config(**overrides: object) -> Config:
    """Defaults for tests: small batches (several per file), no progress bar."""
    base: dict[str, object] = {"run.batch_size": 4, "run.show_progress": False}
    base.update(overrides)
    return load_config(None, base)


def read_output(out: Path) -> dict[str, pd.DataFrame]:
    return {t: pd.read_parquet(out / t) for t in ("documents", "sentences", "errors")}


def assert_exactly_once(out: Path, expected_ids: list[str]) -> dict[str, pd.DataFrame]:
    """Every input document appears exactly once in documents/; errors name real docs."""
    tables = read_output(out)
    docs = tables["documents"]
    assert sorted(docs["doc_id"].tolist()) == sorted(str(i) for i in expected_ids)
    assert docs["doc_id"].is_unique
    errored = set(tables["errors"]["doc_id"])
    assert errored <= set(docs["doc_id"])
    assert set(docs.loc[docs.status == "error", "doc_id"]) == errored
    assert (out / "_manifest.json").is_file()
    return tables


@pytest.fixture(scope="session")
def headlines() -> list[str]:
    return pd.read_csv(VALID_CSV)["text"].tolist()


@pytest.fixture(scope="session")
def int8_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The int8 folder, built once per session exactly as `docintel quantize` builds it:
    the encoder's files at its root and the bundled classifier's int8 copy in
    ``classify/`` (so ``[embed] int8_dir`` = this folder serves both CPU int8 stages)."""
    from pipeline.config import ClassifyConfig, EmbedConfig
    from pipeline.quantize import build_int8, build_int8_classifier

    folder = build_int8(EmbedConfig().resolved_model_path(), tmp_path_factory.mktemp("int8"))
    build_int8_classifier(ClassifyConfig().resolved_model_dir(), folder)
    return folder
