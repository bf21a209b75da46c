"""The nightly audit on a local Ray: incremental nights, idempotence, reports, model
changes, a SIGKILLed audit resumed, and the command line. Real Parquet, real runs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from docintel.actors.runner import execute
from docintel.jobs.cli import app
from docintel.pipeline.audit import AuditSummary, run_audit
from docintel.pipeline.config import ClassifyConfig, Config
from docintel.pipeline.errors import ConfigError, InputError, RunFailed, UsageError
from tests.conftest import REPO, assert_exactly_once, run_config, sigkill_after_parts, write_docs
from tests.integration.test_s3 import (  # moto's S3 server on loopback and its helpers
    IN_BUCKET,
    OUT_BUCKET,
    _keys,
    _put_docs,
    s3,  # noqa: F401 (fixtures, requested by name)
    s3_endpoint,  # noqa: F401
    s3_ray,  # noqa: F401
)

pytestmark = pytest.mark.usefixtures("ray_cluster")

D1, D2, D3 = "2026-01-01", "2026-01-02", "2026-01-03"


def _cfg(**overrides: object) -> Config:
    return run_config(**{"run.embeddings": False, **overrides})


def _texts(headlines: list[str], start: int, n: int) -> list[str]:
    return [
        " ".join(h.rstrip(".") + "." for h in headlines[i * 2 : i * 2 + 2])
        for i in range(start, start + n)
    ]


def _write(path: Path, ids: list[str], texts: list[str], bump: int = 0) -> None:
    """Write a source file; ``bump`` seconds moves its mtime on, so a rewrite is seen even
    on filesystems with coarse timestamps."""
    write_docs(path, ids, texts)
    if bump:
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))


def _ids(root: Path, table: str = "documents") -> list[str]:
    return (
        sorted(pd.read_parquet(root / table)["doc_id"].tolist()) if (root / table).is_dir() else []
    )


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    return {
        str(p.relative_to(root)): (
            p.stat().st_size,
            p.stat().st_mtime_ns,
            hashlib.sha1(p.read_bytes()).hexdigest(),
        )
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _execute_interrupted(
    cfg: Config, input_uri: str, output_uri: str, on_start: Any = None, on_batch: Any = None
) -> Any:
    """The run function, failing as soon as its stage pools are up: the run's output is
    opened (``_run.json``) and nothing is committed. (A layout that cannot start, such as
    spill gpu-only without GPU replicas, now fails in the model checks, before the audit
    stages anything.)"""

    def interrupt(total: int, done: int) -> None:
        raise RunFailed("run interrupted (test)")

    return execute(cfg, input_uri, output_uri, interrupt, on_batch)


@dataclass
class Nights:
    source: Path
    out: Path
    a: list[str]
    b: list[str]
    c: list[str]
    s1: AuditSummary
    s2: AuditSummary
    s3: AuditSummary
    seconds: float


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory, headlines: list[str]) -> Nights:
    """Three nights: all new; a new file + one changed + one removed document; nothing."""
    tmp = tmp_path_factory.mktemp("audit")
    src, out = tmp / "source", tmp / "out"
    a = [f"a{i}" for i in range(10)]
    b = [f"b{i}" for i in range(10)]
    c = [f"c{i}" for i in range(5)]
    b_texts = _texts(headlines, 10, 10)
    _write(src / "a.parquet", a, _texts(headlines, 0, 10))
    _write(src / "b.parquet", b, b_texts)
    t0 = time.perf_counter()
    s1 = run_audit(_cfg(), str(src), str(out), D1, execute)

    _write(src / "c.parquet", c, _texts(headlines, 20, 5))
    b_texts[3] = b_texts[3] + " Shares fell sharply after the warning."
    _write(src / "b.parquet", b[:9], b_texts[:9], bump=5)  # b3 changed, b9 removed
    s2 = run_audit(_cfg(), str(src), str(out), D2, execute)
    night3 = run_audit(_cfg(), str(src), str(out), D3, execute)
    return Nights(src, out, a, b, c, s1, s2, night3, time.perf_counter() - t0)


def test_each_night_processes_only_new_and_changed_documents(nights: Nights) -> None:
    n = nights
    s1, s2, s3_ = n.s1, n.s2, n.s3
    assert (s1.new, s1.changed, s1.removed, s1.unchanged) == (20, 0, 0, 0)
    assert s1.ran and s1.documents == 20 and s1.run_id == f"audit-{D1}"
    assert_exactly_once(n.out / f"run_date={D1}", n.a + n.b)

    assert (s2.new, s2.changed, s2.removed, s2.unchanged) == (5, 1, 1, 18)
    assert s2.documents == 6 and not s2.models_changed
    assert _ids(n.out / f"run_date={D2}") == sorted([*n.c, "b3"])
    assert_exactly_once(n.out / f"run_date={D2}", [*n.c, "b3"])
    # the staging input holds exactly those documents, from the two files that had some
    staged = n.out / "_audit" / "inputs" / f"run_date={D2}"
    assert sorted(pd.read_parquet(staged)["doc_id"]) == sorted([*n.c, "b3"])
    assert len(list(staged.glob("*.parquet"))) == 2

    assert (s3_.new, s3_.changed, s3_.removed, s3_.unchanged) == (0, 0, 0, 24)
    assert not s3_.ran and s3_.documents == 0 and s3_.run_id is None
    p3 = n.out / f"run_date={D3}"
    assert sorted(x.name for x in p3.iterdir()) == [
        "changes.csv", "report.html", "report.json", "review.csv",
    ]  # fmt: skip

    state = json.loads((n.out / "_audit" / "state.json").read_text())
    assert [x["date"] for x in state["audits"]] == [D1, D2, D3]
    assert sorted(Path(p).name for p in state["files"]) == ["a.parquet", "b.parquet", "c.parquet"]
    assert set(state["models"]) == {"sentencize", "embed", "classify"}
    index = pq.read_table(n.out / "_audit" / state["index"]).to_pandas()  # the one it names
    assert sorted(index.doc_id) == sorted(n.a + n.b[:9] + n.c)
    dates = dict(zip(index.doc_id, index.processed_date.astype(str), strict=True))
    assert {d for i, d in dates.items() if i in ("b3", *n.c)} == {D2}
    assert {d for i, d in dates.items() if i not in ("b3", *n.c)} == {D1}
    # auditors read every night with one glob over the hive partition run_date
    files = sorted(str(p) for p in n.out.glob("run_date=*/documents/*.parquet"))
    every = pads.dataset(files, partitioning="hive", partition_base_dir=str(n.out)).to_table()
    assert every.num_rows == 26
    assert dict(pd.Series(every["run_date"].to_pylist()).astype(str).value_counts()) == {
        D1: 20,
        D2: 6,
    }
    print(f"three audit nights: {nights.seconds:.1f} s")


def test_report_counts_equal_the_tables(nights: Nights) -> None:
    for s in (nights.s1, nights.s2, nights.s3):
        part = nights.out / f"run_date={s.date}"
        report = json.loads((part / "report.json").read_text())
        assert report["date"] == s.date and report["ran"] == s.ran
        assert (report["new"], report["changed"], report["removed"], report["unchanged"]) == (
            s.new,
            s.changed,
            s.removed,
            s.unchanged,
        )
        docs = len(_ids(part))
        sents = len(_ids(part, "sentences"))
        errs = len(_ids(part, "errors"))
        assert report["counts"]["documents"] == docs == s.documents
        assert report["counts"]["sentences"] == sents == s.sentences
        assert report["counts"]["errors"] == errs == s.errors
        assert (part / "report.html").read_text().startswith("<!DOCTYPE html>")
        assert s.report == str(part / "report.html")  # what people open
    report3 = json.loads((nights.out / f"run_date={D3}" / "report.json").read_text())
    assert [p["date"] for p in report3["trend"]] == [D1, D2, D3]  # history from the partitions
    zeros = {"documents": 0, "sentences": 0, "errors": 0, "tokens": 0, "unlabelled": 0}
    assert report3["counts"] == zeros and report3["heads"] == []  # the keys of a night that ran


def test_rerunning_a_completed_date_changes_nothing(nights: Nights, headlines: list[str]) -> None:
    before = _snapshot(nights.out)
    # a change in the source after the night belongs to the next night, not to a rerun
    _write(nights.source / "late.parquet", ["z0"], _texts(headlines, 40, 1))
    try:
        again = run_audit(_cfg(), str(nights.source), str(nights.out), D2, execute)
        result = CliRunner().invoke(
            app,
            ["audit", "--source", str(nights.source), "--output", str(nights.out), "--date", D2],
        )
        where = ["--source", str(nights.source), "--output", str(nights.out), "--date", D2]
        job = subprocess.run(
            [sys.executable, "-m", "docintel.jobs.nightly_audit", *where],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        (nights.source / "late.parquet").unlink()
    assert job.returncode == 0, job.stderr
    assert (
        f"docintel: audit {D2}: already complete, nothing to do; report: {nights.s2.report}"
        in job.stdout
    )
    assert again.already_complete
    # ... but the rerun says what waits, and how to process it
    waiting = "1 source file(s) holding 1 document(s) are new or changed since the audit"
    assert any(waiting in note for note in again.notes), again.notes
    assert "docintel audit --date 2026-01-03" in again.notes[-1]
    assert f"docintel: note: {waiting}" in job.stdout
    assert (again.new, again.changed, again.documents) == (5, 1, 6)
    assert again.report == nights.s2.report
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # rich wraps at the terminal width
    assert "is already complete: nothing to do" in said and "report.html" in said
    assert _snapshot(nights.out) == before


def test_two_audits_at_once_one_runs_the_other_is_refused(nights: Nights) -> None:
    """The audit state is read, then rewritten whole: a second audit of the same root is
    refused (exit 2) while one holds the _audit/ lease, and nothing of it is written."""
    from docintel.pipeline.run.lease import Lease, LeaseHeld

    before = _snapshot(nights.out)
    fs = pads.dataset(str(nights.source)).filesystem
    holder = Lease(fs, str(nights.out / "_audit"), _cfg().storage, "docintel audit 2026-01-04", 60)
    with holder:
        with pytest.raises(LeaseHeld, match="docintel audit 2026-01-04"):
            run_audit(_cfg(), str(nights.source), str(nights.out), "2026-01-05", execute)
        result = CliRunner().invoke(
            app, ["audit", "--source", str(nights.source), "--output", str(nights.out),
                  "--date", "2026-01-05"],
        )  # fmt: skip
        assert result.exit_code == 2, result.output
    after = _snapshot(nights.out)
    assert after == before  # the refused audit wrote nothing (and the lease is gone)


def test_usage_errors_name_what_to_fix(
    nights: Nights, tmp_path: Path, headlines: list[str]
) -> None:
    with pytest.raises(ConfigError, match="no audit source"):
        run_audit(_cfg(), None, str(tmp_path / "o"), D1, execute)
    with pytest.raises(ConfigError, match="YYYY-MM-DD"):
        run_audit(_cfg(), str(nights.source), str(tmp_path / "o"), "2026-13-01", execute)
    with pytest.raises(UsageError, match=f"reached {D3}"):
        run_audit(_cfg(), str(nights.source), str(nights.out), "2025-12-31", execute)
    # duplicate ids across source files, both read: named with their files
    dup = tmp_path / "dup"
    _write(dup / "x.parquet", ["x0", "x1"], _texts(headlines, 0, 2))
    _write(dup / "y.parquet", ["x1", "y1"], _texts(headlines, 2, 2))
    with pytest.raises(InputError, match=r"'x1' x2 in .*x\.parquet, .*y\.parquet"):
        run_audit(_cfg(), str(dup), str(tmp_path / "o"), D1, execute)
    assert not (tmp_path / "o" / "_audit" / "state.json").exists()
    # an id in a new file that an unchanged (unread) file still holds
    out = tmp_path / "copy"
    shutil.copytree(nights.out, out)
    _write(nights.source / "d.parquet", ["a0"], _texts(headlines, 40, 1))
    try:
        with pytest.raises(InputError, match=r"'a0' in .*d\.parquet and .*a\.parquet"):
            run_audit(_cfg(), str(nights.source), str(out), "2026-01-04", execute)
    finally:
        (nights.source / "d.parquet").unlink()
    result = CliRunner().invoke(app, ["audit", "--output", str(out), "--date", "2026-01-04"])
    assert result.exit_code == 2 and "--source" in " ".join(result.output.split())


def test_unreadable_source_file_is_skipped_and_retried(nights: Nights, tmp_path: Path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(nights.out, out)
    bad = nights.source / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    try:
        result = CliRunner().invoke(
            app,
            ["audit", "--source", str(nights.source), "--output", str(out), "--date", "2026-01-04"],
        )
    finally:
        bad.unlink()
    assert result.exit_code == 3, result.output
    said = " ".join(result.output.split())
    assert "bad.parquet" in said and "partial audit" in said
    state = json.loads((out / "_audit" / "state.json").read_text())
    assert not any(p.endswith("bad.parquet") for p in state["files"])  # read again next time
    assert state["audits"][-1]["skipped_files"][0]["uri"].endswith("bad.parquet")


def test_model_change_reprocesses_every_document(nights: Nights, tmp_path: Path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(nights.out, out)
    clf = tmp_path / "finsent-v2"  # same weights, another folder: another fingerprint
    shutil.copytree(ClassifyConfig().resolved_model_dir(), clf)  # the default head
    cfg = _cfg(**{"classify.model_dir": str(clf)})
    s = run_audit(cfg, str(nights.source), str(out), "2026-01-04", execute)
    current = sorted(nights.a + nights.b[:9] + nights.c)
    assert s.models_changed and s.ran
    assert (s.new, s.changed, s.removed, s.unchanged, s.reprocessed) == (0, 0, 0, 0, 24)
    tables = assert_exactly_once(out / "run_date=2026-01-04", current)
    # every row was classified by the new head (its fp32 ONNX copy on the CPU replicas:
    # the source version the audit tracks, "+onnx")
    assert set(tables["sentences"]["classify_model"]) == {s.models["classify"] + "+onnx"}
    assert s.models["classify"].startswith("finsent-v2@")
    state = json.loads((out / "_audit" / "state.json").read_text())
    assert state["models"]["classify"] == s.models["classify"]
    report = json.loads((out / "run_date=2026-01-04" / "report.json").read_text())
    assert report["models_changed"] is True and report["counts"]["documents"] == 24
    assert report["changes"]["reprocessed"] == 24
    # latest/ now holds only the new versions: the older nights' parts are gone
    latest = pd.read_parquet(out / "latest" / "documents")
    assert sorted(latest.doc_id) == current
    assert set(latest.run_date.astype(str)) == {"2026-01-04"}


def test_a_night_that_failed_is_finished_by_the_next_one(
    nights: Nights, tmp_path: Path, headlines: list[str]
) -> None:
    """The nightly job recovers by itself: tonight first finishes last night's audit."""
    out = tmp_path / "copy"
    shutil.copytree(nights.out, out)
    d4, d5 = "2026-01-04", "2026-01-05"
    _write(nights.source / "e.parquet", ["e0", "e1"], _texts(headlines, 40, 2))
    try:
        # the run fails after its input was staged and its output opened
        with pytest.raises(RunFailed, match="interrupted"):
            run_audit(_cfg(), str(nights.source), str(out), d4, _execute_interrupted)
        assert (out / "_audit" / "inputs" / f"run_date={d4}" / "_selection.json").is_file()
        assert (out / f"run_date={d4}" / "_run.json").is_file()
        assert json.loads((out / "_audit" / "state.json").read_text())["audits"][-1]["date"] == D3
        s5 = run_audit(_cfg(), str(nights.source), str(out), d5, execute)
    finally:
        (nights.source / "e.parquet").unlink()
    assert s5.notes and s5.notes[0].startswith(f"finished the interrupted audit of {d4} first")
    assert not s5.ran and (s5.new, s5.unchanged) == (0, 26)
    assert_exactly_once(out / f"run_date={d4}", ["e0", "e1"])
    state = json.loads((out / "_audit" / "state.json").read_text())
    assert [a["date"] for a in state["audits"]] == [D1, D2, D3, d4, d5]
    assert [a["new"] for a in state["audits"]] == [20, 5, 0, 2, 0]


def test_sigkilled_audit_resumes_its_run_and_ends_consistent(
    tmp_path: Path, headlines: list[str]
) -> None:
    src, out = tmp_path / "source", tmp_path / "out"
    ids = [f"k{i:02d}" for i in range(40)]
    _write(src / "k.parquet", ids, _texts(headlines, 0, 40))
    config = tmp_path / "job.toml"
    config.write_text(
        "[run]\nbatch_size = 2\nembeddings = false\nnum_cpus = 2\n"
        f'[audit]\nsource = "{src}"\noutput = "{out}"\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cmd = [
        sys.executable,
        "-m",
        "docintel.jobs.nightly_audit",
        "--config",
        str(config),
        "--date",
        D1,
    ]
    parts = out / f"run_date={D1}" / "documents"
    done_before = sigkill_after_parts(cmd, parts, 3, env=env)
    assert 3 <= done_before < 20
    assert not (out / f"run_date={D1}" / "_manifest.json").exists()
    assert not (out / "_audit" / "state.json").exists()
    staged = out / "_audit" / "inputs" / f"run_date={D1}"
    staging_before = _snapshot(staged)

    s = run_audit(_cfg(**{"run.batch_size": 2}), str(src), str(out), D1, execute)
    assert s.resumed and s.run.skipped_batches == done_before
    assert s.run.batches == 20 - done_before  # only the uncommitted batches were redone
    assert (s.new, s.documents) == (40, 40)
    assert_exactly_once(out / f"run_date={D1}", ids)
    # the staging input was reused as it was, not recomputed; only the pending index moved
    after = _snapshot(staged)
    assert {k: v for k, v in staging_before.items() if k != "_doc_index.parquet"} == after
    state = json.loads((out / "_audit" / "state.json").read_text())
    assert [a["date"] for a in state["audits"]] == [D1]
    assert pq.read_metadata(out / "_audit" / state["index"]).num_rows == 40
    report = json.loads((out / f"run_date={D1}" / "report.json").read_text())
    assert report["counts"]["documents"] == 40 and report["resumed_batches"] == done_before
    nxt = run_audit(_cfg(), str(src), str(out), D2, execute)
    assert not nxt.ran and nxt.unchanged == 40


@pytest.mark.usefixtures("s3_ray")
def test_audit_on_s3_works_as_locally(request: pytest.FixtureRequest, headlines: list[str]) -> None:
    """Source and output on S3: staging, index, state and report are objects there."""
    endpoint: str = request.getfixturevalue("s3_endpoint")
    client: Any = request.getfixturevalue("s3")
    ids = [f"s{i}" for i in range(8)]
    _put_docs(client, IN_BUCKET, "audit/a.parquet", ids[:5], _texts(headlines, 0, 5))
    _put_docs(client, IN_BUCKET, "audit/b.parquet", ids[5:], _texts(headlines, 5, 3))
    cfg = _cfg(**{"storage.s3_endpoint": endpoint})
    src, out = f"s3://{IN_BUCKET}/audit/", f"s3://{OUT_BUCKET}/audit"
    s1 = run_audit(cfg, src, out, D1, execute)
    assert (s1.new, s1.documents) == (8, 8) and s1.report == f"{out}/run_date={D1}/report.html"
    keys = set(_keys(client, OUT_BUCKET, "audit/"))
    index = json.loads(
        client.get_object(Bucket=OUT_BUCKET, Key="audit/_audit/state.json")["Body"].read()
    )["index"]
    assert index.startswith(f"doc_index-{D1}-")  # the night's own index, named by the state
    assert {
        "audit/_audit/state.json",
        f"audit/_audit/{index}",
        f"audit/_audit/inputs/run_date={D1}/_selection.json",
        f"audit/run_date={D1}/_manifest.json",
        f"audit/run_date={D1}/report.json",
        f"audit/run_date={D1}/report.html",
    } <= keys
    assert f"audit/_audit/inputs/run_date={D1}/_doc_index.parquet" not in keys  # promoted
    docs = client.get_object(Bucket=OUT_BUCKET, Key=f"audit/run_date={D1}/_manifest.json")
    assert json.loads(docs["Body"].read())["counts"]["documents"] == 8

    def state() -> dict:
        body = client.get_object(Bucket=OUT_BUCKET, Key="audit/_audit/state.json")["Body"].read()
        return json.loads(body)

    stamp = state()["files"][f"{IN_BUCKET}/audit/a.parquet"]
    assert stamp["mtime_ns"] is not None and stamp["size"] > 0
    time.sleep(1.1)  # S3 LastModified has whole seconds: the same bytes, put again later
    _put_docs(client, IN_BUCKET, "audit/a.parquet", ids[:5], _texts(headlines, 0, 5))
    s2 = run_audit(cfg, src, out, D2, execute)
    assert not s2.ran and (s2.new, s2.changed, s2.unchanged) == (0, 0, 8)
    assert state()["files"][f"{IN_BUCKET}/audit/a.parquet"] != stamp  # read, found unchanged
    again = run_audit(cfg, src, out, D1, execute)
    assert again.already_complete and again.documents == 8


def test_a_state_changed_behind_the_lease_is_not_overwritten(
    nights: Nights, tmp_path: Path, headlines: list[str]
) -> None:
    """The state is committed by compare-and-swap against the version the audit read: a
    writer that ignores the _audit/ lease and rewrites state.json during the night makes
    the commit fail (exit 2 class), and its version stays."""
    from docintel.pipeline.errors import OutputError

    out = tmp_path / "out"
    shutil.copytree(nights.out, out)
    src = tmp_path / "source"
    shutil.copytree(nights.source, src)
    _write(src / "d.parquet", ["d0", "d1"], _texts(headlines, 30, 2))
    state_file = out / "_audit" / "state.json"
    theirs = json.loads(state_file.read_text())
    theirs["note"] = "written by someone else"

    def execute_then_meddle(*args: Any, **kwargs: Any) -> Any:
        summary = execute(*args, **kwargs)
        state_file.write_text(json.dumps(theirs))  # behind the lease's back
        return summary

    with pytest.raises(OutputError, match=r"state\.json changed while this audit ran"):
        run_audit(_cfg(), str(src), str(out), "2026-01-04", execute_then_meddle)
    assert json.loads(state_file.read_text()) == theirs
    assert not (out / "_audit" / "_lease.json").exists()  # released all the same
