"""The nightly audit with Iceberg output (``[output] format = "iceberg"``, issue 21 item 4):
the nights are appended to one warehouse at the audit root, one snapshot group per night
named by its run id; the reports (counts, changes with the previous version's sentences,
review) and latest/ equal those of the same nights with Parquet output; a rerun is a
no-op; a SIGKILLed night resumes without a duplicate. Real runs, real pyiceberg."""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from docintel.actors.runner import execute
from docintel.pipeline.audit import AuditSummary, run_audit
from docintel.pipeline.errors import UsageError
from docintel.pipeline.exitcodes import ExitCode, exit_code
from docintel.pipeline.formats.warehouse import BATCHES_KEY, RUN_ID_KEY
from tests.conftest import sigkill_after_parts
from tests.integration.test_audit import _cfg, _texts, _write
from tests.integration.test_iceberg import _catalog

pytestmark = pytest.mark.usefixtures("ray_cluster")

D1, D2 = "2026-02-01", "2026-02-02"
ICE = {"output.format": "iceberg"}
ADDED = "Shares fell sharply after the warning."
# what differs between two runs of the same night: clocks, paths, timings
VOLATILE = {"generated", "started", "finished", "output", "partition", "throughput"}


@dataclass
class Pair:
    """The same two nights audited into a Parquet root and into an Iceberg root."""

    source: Path
    parquet: Path
    iceberg: Path
    pq: list[AuditSummary]
    ice: list[AuditSummary]
    a: list[str]
    b: list[str]
    c: list[str]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, headlines: list[str]) -> Pair:
    """Night 1: all new. Night 2: a new file, one changed and one removed document."""
    tmp = tmp_path_factory.mktemp("audit_iceberg")
    src, pq_out, ice_out = tmp / "source", tmp / "pq", tmp / "ice"
    a, b, c = [f"a{i}" for i in range(6)], [f"b{i}" for i in range(6)], ["c0", "c1", "c2"]
    b_texts = _texts(headlines, 6, 6)
    _write(src / "a.parquet", a, _texts(headlines, 0, 6))
    _write(src / "b.parquet", b, b_texts)
    pqs, ices = [], []
    pqs.append(run_audit(_cfg(), str(src), str(pq_out), D1, execute))
    ices.append(run_audit(_cfg(**ICE), str(src), str(ice_out), D1, execute))
    _write(src / "c.parquet", c, _texts(headlines, 20, 3))
    b_texts[2] = f"{b_texts[2]} {ADDED}"
    _write(src / "b.parquet", b[:5], b_texts[:5], bump=5)  # b2 changed, b5 removed
    pqs.append(run_audit(_cfg(), str(src), str(pq_out), D2, execute))
    ices.append(run_audit(_cfg(**ICE), str(src), str(ice_out), D2, execute))
    return Pair(src, pq_out, ice_out, pqs, ices, a, b, c)


def _report(root: Path, day: str) -> dict[str, Any]:
    return json.loads((root / f"run_date={day}" / "report.json").read_text())


def _snapshots(out: Path, table: str) -> list[dict[str, str]]:
    t = _catalog(out).load_table(f"docintel.{table}")
    return [s.summary.additional_properties for s in t.metadata.snapshots]


def test_reports_equal_those_of_parquet_output(pair: Pair) -> None:
    for day, p, i in zip((D1, D2), pair.pq, pair.ice, strict=True):
        assert (i.new, i.changed, i.removed, i.documents, i.sentences, i.errors) == (
            p.new, p.changed, p.removed, p.documents, p.sentences, p.errors,
        )  # fmt: skip
        assert i.run_id == p.run_id == f"audit-{day}" and i.ran
        want, got = _report(pair.parquet, day), _report(pair.iceberg, day)
        assert {k: v for k, v in got.items() if k not in VOLATILE} == {
            k: v for k, v in want.items() if k not in VOLATILE
        }
        for csv in ("changes.csv", "review.csv"):
            part = f"run_date={day}/{csv}"
            assert (pair.iceberg / part).read_bytes() == (pair.parquet / part).read_bytes()
        # the night's partition holds its report only: the rows are in the Iceberg tables
        assert sorted(x.name for x in (pair.iceberg / f"run_date={day}").iterdir()) == [
            "changes.csv", "report.html", "report.json", "review.csv",
        ]  # fmt: skip
    ch = _report(pair.iceberg, D2)["changes"]  # read from night 1's snapshots: b2 before
    assert ch["new"] == pair.c and ch["removed"] == ["b5"]
    (b2,) = ch["changed"]
    assert (b2["doc_id"], b2["previous_date"], b2["added"], b2["removed"]) == (
        "b2", D1, [ADDED], [],
    )  # fmt: skip
    assert _report(pair.iceberg, D2)["counts"]["documents"] == 4  # c0..c2 and b2
    # latest/ (Parquet in both formats) holds the same current documents and sentences
    for table in ("documents", "sentences"):
        cols = ["doc_id", "sent_index"] if table == "sentences" else ["doc_id", "status"]
        got = pd.read_parquet(pair.iceberg / "latest" / table).sort_values(cols)
        want = pd.read_parquet(pair.parquet / "latest" / table).sort_values(cols)
        pd.testing.assert_frame_equal(
            got.reset_index(drop=True), want[got.columns].reset_index(drop=True)
        )
    assert sorted(got.doc_id.unique()) == sorted(pair.a + pair.b[:5] + pair.c)


def test_each_night_is_one_snapshot_group_with_its_run_id(pair: Pair) -> None:
    out = pair.iceberg
    for table in ("documents", "sentences"):
        runs = [p[RUN_ID_KEY] for p in _snapshots(out, table)]
        assert [k for k, _ in itertools.groupby(runs)] == [f"audit-{D1}", f"audit-{D2}"]
    docs = _catalog(out).load_table("docintel.documents").scan().to_pandas()
    # every version once: night 1's 12 documents, night 2's 4 (b2's second version)
    assert sorted(docs.doc_id) == sorted(pair.a + pair.b + pair.c + ["b2"])
    for day, s in zip((D1, D2), pair.ice, strict=True):
        snaps = [p for p in _snapshots(out, "documents") if p[RUN_ID_KEY] == f"audit-{day}"]
        batches = [b for p in snaps for b in json.loads(p[BATCHES_KEY])]
        night = docs[docs.batch_id.isin(batches)]
        assert len(night) == s.documents and night.doc_id.is_unique
        manifest = json.loads((out / "_runs" / f"audit-{day}" / "_manifest.json").read_text())
        assert manifest["format"] == "iceberg" and manifest["counts"]["documents"] == s.documents
    state = json.loads((out / "_audit" / "state.json").read_text())
    assert [a["date"] for a in state["audits"]] == [D1, D2]
    assert not (out / "documents").exists() and not (out / f"run_date={D1}" / "documents").exists()

    # a rerun of a completed night is a no-op: no snapshot, no file changes
    n = len(_snapshots(out, "documents"))
    again = run_audit(_cfg(**ICE), str(pair.source), str(out), D2, execute)
    assert again.already_complete and again.documents == pair.ice[1].documents
    assert len(_snapshots(out, "documents")) == n


def test_a_sigkilled_night_resumes_without_duplicates(
    tmp_path: Path, headlines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, out = tmp_path / "source", tmp_path / "out"
    ids = [f"k{i:02d}" for i in range(40)]
    _write(src / "k.parquet", ids, _texts(headlines, 0, 40))
    config = tmp_path / "job.toml"
    config.write_text(
        "[run]\nbatch_size = 2\nembeddings = false\nnum_cpus = 2\npart_target_mb = 0.0\n"
        f'[output]\nformat = "iceberg"\n[audit]\nsource = "{src}"\noutput = "{out}"\n'
    )
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # the job starts a Ray of its own
    cmd = [sys.executable, "-m", "docintel.jobs.nightly_audit", "--config", str(config),
           "--date", D1]  # fmt: skip
    sigkill_after_parts(cmd, out / "docintel" / "documents" / "data", 3, pattern="*.parquet")
    assert not (out / "_runs" / f"audit-{D1}" / "_manifest.json").exists()
    assert not (out / "_audit" / "state.json").exists()
    committed = len(_snapshots(out, "documents"))
    assert 2 <= committed < 20  # the 3rd data file is written before its commit

    cfg = _cfg(**ICE, **{"run.batch_size": 2, "run.part_target_mb": 0})
    s = run_audit(cfg, str(src), str(out), D1, execute)
    assert s.resumed and s.run is not None and s.run.skipped_batches >= committed
    assert s.run.batches + s.run.skipped_batches == 20
    assert (s.new, s.documents) == (40, 40)
    docs = _catalog(out).load_table("docintel.documents").scan().to_pandas()
    assert sorted(docs.doc_id) == ids  # every document exactly once
    batches = [b for p in _snapshots(out, "documents") for b in json.loads(p[BATCHES_KEY])]
    assert len(batches) == len(set(batches)) == 20
    sents = _catalog(out).load_table("docintel.sentences").scan().to_pandas()
    assert not sents.duplicated(["doc_id", "sent_index"]).any()
    report = _report(out, D1)
    assert report["counts"]["documents"] == 40 and report["counts"]["sentences"] == len(sents)
    assert len(pd.read_parquet(out / "latest" / "documents")) == 40


def test_a_warehouse_that_cannot_take_the_night_is_refused_before_staging(
    tmp_path: Path, headlines: list[str]
) -> None:
    src, out = tmp_path / "source", tmp_path / "out"
    _write(src / "a.parquet", ["a0", "a1"], _texts(headlines, 0, 2))
    out.mkdir()
    cat = _catalog(out)
    cat.create_namespace("docintel")
    cat.create_table("docintel.documents", schema=pa.schema([pa.field("doc_id", pa.int64())]))
    with pytest.raises(UsageError) as caught:
        run_audit(_cfg(**ICE), str(src), str(out), D1, execute)
    msg = str(caught.value)
    assert exit_code(caught.value) == ExitCode.USAGE
    assert "docintel.documents" in msg and "'doc_id'" in msg
    assert not (out / "_audit" / "inputs").exists() and not (out / "_runs").exists()
