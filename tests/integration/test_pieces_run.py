"""The hard bound on a batch's sentences with the real stages (spaCy, the encoder, the
head, on CPU replicas): batches over the bound split into pieces after the sentencizer,
and the output is the unsplit run's, row for row."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from docintel.actors.runner import execute
from tests.conftest import assert_exactly_once, run_config, write_docs

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_pieces_give_the_unsplit_runs_rows(tmp_path: Path, headlines: list[str]) -> None:
    docs = [" ".join(h.rstrip(".") + "." for h in headlines[i : i + 4]) for i in range(0, 120, 4)]
    ids = [f"d{i:02d}" for i in range(len(docs))]
    write_docs(tmp_path / "in.parquet", ids, docs)
    common = {"run.batch_size": 10, "run.part_target_mb": 0}
    whole = execute(run_config(**common), str(tmp_path / "in.parquet"), str(tmp_path / "whole"))
    bounded = {**common, "run.max_batch_sentences": 9, "sentencize.max_sentences": 9}
    cut = execute(run_config(**bounded), str(tmp_path / "in.parquet"), str(tmp_path / "cut"))
    sentences = len(pd.read_parquet(tmp_path / "whole" / "sentences"))
    assert cut.batches >= sentences / 9 > 2 * whole.batches  # each batch split in pieces
    a = assert_exactly_once(tmp_path / "whole", ids)
    b = assert_exactly_once(tmp_path / "cut", ids)
    key = ["doc_id", "sent_index"]
    cols = [*key, "text", "label"]
    pd.testing.assert_frame_equal(
        a["sentences"][cols].sort_values(key).reset_index(drop=True),
        b["sentences"][cols].sort_values(key).reset_index(drop=True),
    )
    sizes = [len(pd.read_parquet(p)) for p in (tmp_path / "cut" / "sentences").glob("*.parquet")]
    assert max(sizes) <= 9 and len(sizes) == cut.batches
