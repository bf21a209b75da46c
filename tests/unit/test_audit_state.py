"""The audit state and its doc index (issue 20, item 6), without Ray: each night's index has
a name of its own, named by the state; a compare-and-swap that fails leaves the state on
storage with its own index, and the next night reads them."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from docintel.pipeline.audit import state as audit_state
from docintel.pipeline.audit.state import (
    DOC_INDEX_FILE,
    INDEX_SCHEMA,
    AuditLayout,
    commit_state,
    read_index,
    read_state,
)
from docintel.pipeline.config import StorageConfig
from docintel.pipeline.errors import OutputError
from docintel.pipeline.output.sink import atomic_write, resolve_output
from docintel.pipeline.run.lease import LocalStore

STORAGE = StorageConfig()
D1, D2 = "2026-01-01", "2026-01-02"


def _layout(tmp_path: Path) -> AuditLayout:
    return AuditLayout(*resolve_output(str(tmp_path / "audit"), STORAGE))


def _stage(lay: AuditLayout, day: str, ids: list[str]) -> None:
    """The night's pending index, as select_documents leaves it."""
    n = len(ids)
    index = pa.table(
        {
            "doc_id": ids,
            "content_hash": pa.array([i.encode().ljust(16, b"-") for i in ids], pa.binary(16)),
            "processed_date": pa.array([dt.date.fromisoformat(day)] * n, pa.date32()),
            "source_file": ["src/a.parquet"] * n,
        },
        schema=INDEX_SCHEMA,
    )
    atomic_write(lay.fs, lay.pending_index(day), index)


def _commit(lay: AuditLayout, day: str, state: dict[str, Any] | None) -> None:
    selection = {
        "source": "src/",
        "columns": {"id": "doc_id", "text": "text"},
        "models": {"embed": "e1"},
        "files": {"src/a.parquet": {"size": 1, "mtime_ns": 1}},
    }
    commit_state(lay, day, state, selection, {"date": day}, STORAGE)


def _indexes(lay: AuditLayout) -> list[str]:
    return sorted(p.name for p in Path(lay.audit_dir).glob("doc_index*.parquet"))


def test_each_night_has_its_index_named_by_the_state(tmp_path: Path) -> None:
    lay = _layout(tmp_path)
    _stage(lay, D1, ["a", "b"])
    _commit(lay, D1, None)
    s1 = read_state(lay)
    assert s1 is not None and s1["index"].startswith(f"doc_index-{D1}-")
    assert _indexes(lay) == [s1["index"]]
    _stage(lay, D2, ["a", "b", "c"])
    _commit(lay, D2, s1)
    s2 = read_state(lay)
    assert s2 is not None and s2["index"].startswith(f"doc_index-{D2}-")
    assert _indexes(lay) == [s2["index"]]  # the superseded index is gone
    assert read_index(lay).column("doc_id").to_pylist() == ["a", "b", "c"]
    assert not Path(lay.pending_index(D2)).exists()  # promoted


def test_a_failed_swap_leaves_the_state_and_its_index_for_the_next_night(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer rewrites state.json between tonight's index write and the swap: the
    commit fails, their state stays with the index it names (not tonight's), and the next
    night reads both and commits."""
    lay = _layout(tmp_path)
    _stage(lay, D1, ["a", "b"])
    _commit(lay, D1, None)
    s1 = read_state(lay)
    assert s1 is not None
    theirs = {**s1, "note": "written by someone else"}
    swap = audit_state._swap_state

    def meddled(*args: Any) -> None:
        Path(lay.state).write_text(json.dumps(theirs))  # behind the lease's back
        swap(*args)

    _stage(lay, D2, ["a", "b", "c"])
    with monkeypatch.context() as m:
        m.setattr(audit_state, "_swap_state", meddled)
        with pytest.raises(OutputError, match=r"state\.json changed while this audit ran"):
            _commit(lay, D2, s1)
    now = read_state(lay)
    assert now == theirs
    # the index that goes with the state on storage is night one's, whole
    assert read_index(lay).column("doc_id").to_pylist() == ["a", "b"]
    assert read_index(lay, now).column("doc_id").to_pylist() == ["a", "b"]
    assert _indexes(lay) == [s1["index"]]  # tonight's, named by no state, is gone
    assert Path(lay.pending_index(D2)).exists()  # kept: the night can be committed again

    _commit(lay, D2, now)  # the next try (or night) reads them and commits
    s2 = read_state(lay)
    assert s2 is not None and [a["date"] for a in s2["audits"]] == [D1, D2]
    assert read_index(lay).column("doc_id").to_pylist() == ["a", "b", "c"]
    assert _indexes(lay) == [s2["index"]]


def test_a_swap_whose_answer_was_lost_counts_as_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new state landed but the swap reported a conflict (a retried request refused by
    its own condition): the commit stands and its index is kept."""
    lay = _layout(tmp_path)
    _stage(lay, D1, ["a"])
    _commit(lay, D1, None)
    real = LocalStore.swap

    def lost(self: LocalStore, data: bytes, tag: str) -> str | None:
        real(self, data, tag)
        return None

    monkeypatch.setattr(LocalStore, "swap", lost)
    _stage(lay, D2, ["a", "b"])
    _commit(lay, D2, read_state(lay))
    s2 = read_state(lay)
    assert s2 is not None and _indexes(lay) == [s2["index"]]
    assert read_index(lay).num_rows == 2


def test_a_version_1_state_and_its_doc_index_are_read_then_replaced(tmp_path: Path) -> None:
    lay = _layout(tmp_path)
    _stage(lay, D1, ["a", "b"])
    _commit(lay, D1, None)
    s1 = read_state(lay)
    assert s1 is not None
    # as docintel wrote it before per-night indexes: version 1, doc_index.parquet
    Path(lay.index_of(s1)).rename(Path(lay.audit_dir) / DOC_INDEX_FILE)
    old = {k: v for k, v in s1.items() if k != "index"} | {"version": 1}
    Path(lay.state).write_text(json.dumps(old))
    assert read_state(lay) == old
    assert read_index(lay).num_rows == 2
    _stage(lay, D2, ["a", "b", "c"])
    _commit(lay, D2, old)
    s2 = read_state(lay)
    assert s2 is not None and s2["version"] == 2 and _indexes(lay) == [s2["index"]]
    assert pq.read_metadata(lay.index_of(s2)).num_rows == 3
