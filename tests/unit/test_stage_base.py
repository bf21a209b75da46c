"""check_chain and run_stage's per-document failure isolation."""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from docintel.pipeline.batch import Batch
from docintel.pipeline.config import ClassifyConfig, EmbedConfig, SentencizeConfig
from docintel.pipeline.errors import ChainError
from docintel.pipeline.schema import (
    DOC_ID,
    EMBEDDING,
    END_CHAR,
    ERRORS_SCHEMA,
    LABEL,
    N_TOKENS,
    PROBS,
    SCORE,
    SENT_INDEX,
    START_CHAR,
    TEXT,
    TRUNCATED,
)
from docintel.pipeline.stages import Stage, check_chain, run_stage
from docintel.pipeline.stages.classify import Classifier
from docintel.pipeline.stages.embed import Embedder
from docintel.pipeline.stages.sentencize import Sentencizer


def _real_stages() -> list[Stage]:
    # __init__ stores config only: no model is loaded to check a chain
    return [
        Sentencizer(SentencizeConfig()),
        Embedder(EmbedConfig()),
        Classifier(ClassifyConfig()),
    ]


class PoisonStage(Stage):
    """Test-only stage: passes rows through, but raises on any table holding a poison doc."""

    name: ClassVar[str] = "poison_test"
    input_columns: ClassVar[tuple[str, ...]] = (DOC_ID, TEXT)
    output_columns: ClassVar[tuple[str, ...]] = (DOC_ID, TEXT)

    def __init__(self) -> None:
        self.calls = 0

    def setup(self) -> None:
        self.backend = "cpu-test"
        self.version = "poison@1"

    def __call__(self, table: pa.Table) -> pa.Table:
        self.calls += 1
        for doc in table[DOC_ID].to_pylist():
            if doc.startswith("poison"):
                raise ValueError(f"cannot digest document {doc}")
        return table


def test_check_chain_returns_final_columns():
    cols = check_chain([DOC_ID, TEXT], _real_stages())
    assert cols == [
        DOC_ID,
        SENT_INDEX,
        START_CHAR,
        END_CHAR,
        TEXT,
        EMBEDDING,
        N_TOKENS,
        TRUNCATED,
        LABEL,
        SCORE,
        PROBS,
    ]


def test_check_chain_keeps_extra_source_columns_until_a_replacing_stage():
    cols = check_chain([DOC_ID, TEXT, "source_url"], [Embedder(EmbedConfig())])
    assert cols == [DOC_ID, TEXT, "source_url", EMBEDDING, N_TOKENS, TRUNCATED]
    cols = check_chain([DOC_ID, TEXT, "source_url"], [Sentencizer(SentencizeConfig())])
    assert "source_url" not in cols  # sentencize replaces document rows with sentence rows


def test_check_chain_missing_source_column_raises():
    with pytest.raises(ChainError, match="sentencize") as exc:
        check_chain([DOC_ID, "body"], _real_stages())
    assert repr(TEXT) in str(exc.value)


def test_check_chain_out_of_order_stages_raise():
    with pytest.raises(ChainError, match="classify") as exc:
        check_chain([DOC_ID, TEXT], [Sentencizer(SentencizeConfig()), Classifier(ClassifyConfig())])
    assert repr(EMBEDDING) in str(exc.value)


def _batch(ids: list[str], rows_per_doc: int = 1) -> Batch:
    doc_col = [d for d in ids for _ in range(rows_per_doc)]
    text_col = [f"{d} row {k}" for d in ids for k in range(rows_per_doc)]
    table = pa.table(
        {DOC_ID: pa.array(doc_col, pa.string()), TEXT: pa.array(text_col, pa.string())}
    )
    return Batch(batch_id="f00-00000-00003", doc_ids=pa.array(ids, pa.string()), table=table)


@pytest.mark.parametrize("poison_at", [0, 4, 8])
@pytest.mark.parametrize("rows_per_doc", [1, 3])
def test_run_stage_isolates_one_poison_document(poison_at, rows_per_doc):
    ids = [f"doc{i}" for i in range(8)]
    ids.insert(poison_at, "poison")
    assert len(ids) == 9
    stage = PoisonStage()
    stage.setup()
    batch = _batch(ids, rows_per_doc)
    out = run_stage(stage, batch)

    assert out.errors.schema == ERRORS_SCHEMA
    errors = out.errors.to_pylist()
    assert len(errors) == 1
    err = errors[0]
    assert err[DOC_ID] == "poison"
    assert err["stage"] == "poison_test"
    assert err["error_type"] == "ValueError"
    assert "cannot digest document poison" in err["message"]
    assert err["batch_id"] == batch.batch_id

    good = [d for d in ids if d != "poison"]
    got = sorted(zip(out.table[DOC_ID].to_pylist(), out.table[TEXT].to_pylist(), strict=True))
    want = sorted(
        (d, t)
        for d, t in zip(batch.table[DOC_ID].to_pylist(), batch.table[TEXT].to_pylist(), strict=True)
        if d != "poison"
    )
    assert got == want
    assert set(out.table[DOC_ID].to_pylist()) == set(good)
    # the envelope: every doc id still listed; time, backend and version recorded
    assert out.doc_ids.to_pylist() == ids
    assert out.batch_id == batch.batch_id
    assert out.backends == {"poison_test": "cpu-test"}
    assert out.versions == {"poison_test": "poison@1"}
    assert out.seconds["poison_test"] >= 0
    # bisection, not one call per document: 1 + about 2*log2(9) calls
    assert stage.calls <= 1 + 2 * 4 + 1


def test_run_stage_all_poison_gives_errors_for_all_and_an_empty_table():
    ids = [f"poison{i}" for i in range(5)]
    stage = PoisonStage()
    stage.setup()
    batch = _batch(ids, rows_per_doc=2)
    out = run_stage(stage, batch)
    assert sorted(out.errors[DOC_ID].to_pylist()) == ids
    assert set(out.errors["stage"].to_pylist()) == {"poison_test"}
    assert set(out.errors["error_type"].to_pylist()) == {"ValueError"}
    assert out.table.num_rows == 0
    assert out.table.schema == batch.table.schema
    assert out.doc_ids.to_pylist() == ids


def test_run_stage_appends_to_earlier_errors():
    stage = PoisonStage()
    stage.setup()
    batch = _batch(["a", "poison", "b"])
    earlier = pa.Table.from_pylist(
        [
            {
                DOC_ID: "c",
                "stage": "read",
                "error_type": "UnicodeDecodeError",
                "message": "not UTF-8",
                "batch_id": batch.batch_id,
            }
        ],
        schema=ERRORS_SCHEMA,
    )
    batch = Batch(batch.batch_id, pa.array(["a", "poison", "b", "c"]), batch.table, earlier)
    out = run_stage(stage, batch)
    assert out.errors[DOC_ID].to_pylist() == ["c", "poison"]
    assert out.errors["stage"].to_pylist() == ["read", "poison_test"]


def test_run_stage_truncates_huge_messages():
    class Loud(PoisonStage):
        def __call__(self, table: pa.Table) -> pa.Table:
            if pc.any(pc.starts_with(table[DOC_ID], "poison")).as_py():
                raise RuntimeError("x" * 50_000)
            return table

    stage = Loud()
    stage.setup()
    out = run_stage(stage, _batch(["ok", "poison"]))
    (msg,) = out.errors["message"].to_pylist()
    assert len(msg) <= 2_000
    assert out.table[DOC_ID].to_pylist() == ["ok"]


def test_run_real_stages_on_a_batch_without_sentences(
    sentencizer, embedder, classifier, docs_batch
):
    """Every document blank: the sentence table is empty, and later stages must cope."""
    batch = docs_batch(["a", "b", "c"], ["", "   ", None])
    for stage in (sentencizer, embedder, classifier):
        batch = run_stage(stage, batch)
    assert batch.errors.num_rows == 0, batch.errors.to_pylist()
    assert batch.table.num_rows == 0
    assert {EMBEDDING, N_TOKENS, TRUNCATED, LABEL, SCORE, PROBS} <= set(batch.table.column_names)


@pytest.mark.parametrize(
    ("cpu_max", "limit"),
    [("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000\n", 1), ("max 100000\n", None)],
)
def test_usable_cores_honours_a_cgroup_cpu_quota(tmp_path, cpu_max: str, limit: int | None) -> None:
    """Thread pools are sized by the container's CPU limit, not the host's core count."""
    import os

    from docintel.pipeline.stages.base import usable_cores

    cores = len(os.sched_getaffinity(0))
    f = tmp_path / "cpu.max"
    f.write_text(cpu_max)
    assert usable_cores(f) == (cores if limit is None else min(cores, limit))
    assert usable_cores(tmp_path / "absent") == cores  # cgroup v1 or no cgroup: affinity
