"""The edges of opening an output (issue 20, items 1-3 and 5's order), without Ray: a
different input into a completed output, a resume with another plan, an output that
cannot be written, a full disk at the commit, and a refused run beside another writer's
lease. Runs are driven through RunOutput with hand-made batch stats (no model runs)."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from docintel.pipeline.errors import OutputError, RunFailed, UsageError
from docintel.pipeline.exitcodes import ExitCode, exit_code
from docintel.pipeline.formats.parquet import ParquetPartsSink
from docintel.pipeline.input.source import plan, resolve_input, split_readable
from docintel.pipeline.output.protocol import RunOutput, RunSummary, plan_key
from docintel.pipeline.output.sink import MANIFEST, RUN_STATE, BatchStats
from docintel.pipeline.run.lease import LEASE_FILE, Claim
from docintel.pipeline.run.plan import Plan
from tests.cli.test_cli import docintel
from tests.conftest import run_config, write_docs

LABELS = ["negative", "neutral", "positive"]
VERSIONS = {"sentencize": "blank:en", "embed": "enc-1", "classify": "clf-1"}
CHAIN = ["sentencize", "embed", "classify"]
IDS = [f"d{i:02d}" for i in range(10)]


def _plan(path: Path | str, versions: dict[str, str] | None = None, **overrides: object) -> Plan:
    """What prepare() would plan for ``path``, minus the model checks (no models here)."""
    cfg = run_config(**overrides)
    fs, files = resolve_input(str(path), cfg.storage)
    files, skipped = split_readable(fs, files)
    units = plan(fs, files, "doc_id", "text", cfg.run.batch_size)
    n = sum(u.n_rows for u in units)
    return Plan(
        cfg, str(path), fs, files, units, n, LABELS, dict(versions or VERSIONS), [], skipped,
        stages=list(CHAIN),
    )  # fmt: skip


def _docs(path: Path, texts: str = "Revenue rose.") -> Path:
    return write_docs(path, IDS, [f"{texts} {i}" for i in range(len(IDS))])


def _complete(p: Plan, out: Path | str, run_id: str = "r1") -> None:
    """A committed run over ``p`` (its documents counted in one batch)."""
    with RunOutput.open(p, str(out), run_id) as o:
        assert not o.complete
        o.record(BatchStats("b-00000-00000", p.n_documents, 0, 0))
        o.commit(RunSummary(o.run_id, str(out)), {})


def _crashed(p: Plan, out: Path, run_id: str = "r1") -> None:
    """A run over ``p`` that stopped before its commit (its run state is written)."""
    with pytest.raises(KeyboardInterrupt), RunOutput.open(p, str(out), run_id):
        raise KeyboardInterrupt
    assert (out / RUN_STATE).is_file() and not (out / MANIFEST).exists()


def _refused(p: Plan, out: Path | str, run_id: str = "r1") -> str:
    with pytest.raises(UsageError) as caught:
        RunOutput.open(p, str(out), run_id)
    assert exit_code(caught.value) == ExitCode.USAGE
    return str(caught.value)


# --- 1. a different input into a completed output --------------------------------------


def test_a_different_input_into_a_completed_output_is_refused(tmp_path: Path) -> None:
    first, other = _docs(tmp_path / "a.parquet"), _docs(tmp_path / "b.parquet", "Costs fell.")
    out = tmp_path / "out"
    _complete(_plan(first), out)
    message = _refused(_plan(other), out)
    # both inputs, the run id, and what to do
    assert str(first) in message and str(other) in message and "'r1'" in message
    assert "another output folder" in message and "pass the same input" in message
    # without a run id too (the no-op a script gets)
    assert str(other) in _refused(_plan(other), out, run_id="")


def test_the_same_input_is_a_no_op_however_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, out = _docs(tmp_path / "a.parquet"), tmp_path / "out"
    _complete(_plan(path), out)
    monkeypatch.chdir(tmp_path)
    for given in ("a.parquet", "./a.parquet", f"file://{path}"):
        with RunOutput.open(_plan(given), str(out), "") as again:
            assert again.complete and again.run_id == "r1"
            assert again.completed_summary().documents == len(IDS)


def test_an_input_changed_in_place_is_a_different_input(tmp_path: Path) -> None:
    """Same name, same bytes, another modification time: compared by identity (size,
    mtime, footer), not by the input string."""
    path, out = _docs(tmp_path / "a.parquet"), tmp_path / "out"
    _complete(_plan(path), out)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
    message = _refused(_plan(path), out)
    assert f"{path} changed: mtime_ns" in message
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["input"]["files"][0]["mtime_ns"] == st.st_mtime_ns
    assert manifest["plan"]["batch_size"] == 4


def test_a_completed_output_asked_with_another_plan_names_the_key(tmp_path: Path) -> None:
    path, out = _docs(tmp_path / "a.parquet"), tmp_path / "out"
    _complete(_plan(path), out)
    message = _refused(_plan(path, **{"run.batch_size": 8}), out)
    assert "batch_size 4" in message and "batch_size 8" in message and "'r1'" in message
    with RunOutput.open(_plan(path), str(out), "r1") as again:  # the same plan: the no-op
        assert again.complete


# --- 2. a resume with another plan -------------------------------------------------------


def test_a_resume_with_another_plan_is_refused_and_the_original_resumes(tmp_path: Path) -> None:
    path, out = _docs(tmp_path / "a.parquet"), tmp_path / "out"
    original = _plan(path)
    _crashed(original, out)
    state = json.loads((out / RUN_STATE).read_text())
    assert state["plan"] == json.loads(json.dumps(plan_key(original)))
    before = (out / RUN_STATE).read_bytes()

    message = _refused(_plan(path, **{"run.batch_size": 8}), out)
    assert "batch_size 4" in message and "batch_size 8" in message and "--batch-size" in message
    message = _refused(_plan(path, **{"run.embeddings": False}), out)
    assert "embeddings true" in message and "embeddings false" in message
    message = _refused(_plan(path, {**VERSIONS, "classify": "clf-2"}), out)
    assert "models" in message and "clf-1" in message and "clf-2" in message
    other = _docs(tmp_path / "b.parquet", "Costs fell.")
    message = _refused(_plan(other), out)
    assert str(path) in message and str(other) in message and "different input" in message
    assert (out / RUN_STATE).read_bytes() == before  # nothing was written by the refusals

    with RunOutput.open(original, str(out), "r1") as resumed:  # the original settings
        assert not resumed.complete and resumed.run_id == "r1"
        resumed.record(BatchStats("b-00000-00000", original.n_documents, 0, 0))
        resumed.commit(RunSummary("r1", str(out)), {})
    assert json.loads((out / MANIFEST).read_text())["counts"]["documents"] == len(IDS)


# --- 3. an output that cannot be written ------------------------------------------------


def _unwritable(tmp_path: Path, kind: str) -> Path:
    if kind == "system folder":
        return Path("/sys/docintel-test-output")  # sysfs refuses mkdir, even to root
    if kind == "under a file":
        (tmp_path / "file.txt").write_text("x")
        return tmp_path / "file.txt" / "sub"
    if kind == "a file":
        (tmp_path / "file.txt").write_text("x")
        return tmp_path / "file.txt"
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    probe = folder / ".probe"
    try:
        probe.write_text("")
    except PermissionError:
        return folder / "out"
    probe.unlink()
    pytest.skip("running as root: chmod 0555 does not stop writes (the other cases cover it)")


@pytest.mark.parametrize("kind", ["system folder", "under a file", "a file", "chmod 0555"])
def test_an_output_that_cannot_be_written_is_a_usage_error_naming_it(
    tmp_path: Path, kind: str
) -> None:
    p = _plan(_docs(tmp_path / "in" / "a.parquet"))
    out = _unwritable(tmp_path, kind)
    message = _refused(p, out)
    assert str(out) in message
    if kind != "a file":
        with pytest.raises(OutputError):
            RunOutput.open(p, str(out), "r1")


def test_a_full_disk_at_the_commit_fails_the_run_resumably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while the manifest is written: exit 1 (not 2, the run had worked), nothing
    committed, the run state kept; the same run then finishes."""
    p, out = _plan(_docs(tmp_path / "a.parquet")), tmp_path / "out"

    def full(self: ParquetPartsSink, manifest: dict) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(ParquetPartsSink, "commit", full)
        with pytest.raises(RunFailed) as caught:
            _complete(p, out)
    assert exit_code(caught.value) == ExitCode.FAILED
    assert "--run-id r1" in str(caught.value) and str(out) in str(caught.value)
    assert (out / RUN_STATE).is_file() and not (out / MANIFEST).exists()
    assert not (out / LEASE_FILE).exists()  # released
    with RunOutput.open(p, str(out), "r1") as resumed:
        assert not resumed.complete
        resumed.record(BatchStats("b-00000-00000", p.n_documents, 0, 0))
        resumed.commit(RunSummary("r1", str(out)), {})
    assert (out / MANIFEST).is_file()


def test_an_unwritable_output_via_the_cli_is_one_line_and_exit_2(tmp_path: Path) -> None:
    corpus = _docs(tmp_path / "docs.parquet")
    for out in (Path("/sys/docintel-test-output"), _unwritable(tmp_path, "under a file")):
        r = docintel("run", corpus, out, "--no-progress")
        assert r.returncode == 2, r.stderr[-3000:]
        assert "usage error" in r.stderr and str(out) in r.stderr
        assert "cannot be used" in r.stderr
        assert "Traceback" not in r.stdout + r.stderr


# --- 5. the lease is taken only after the usage checks --------------------------------------


def _foreign_lease(out: Path) -> bytes:
    """A claim by a writer on another host that looks gone (expired): a run that took the
    lease first would take it over, and its refusal would then delete it."""
    claim = Claim("elsewhere:4242:1700000000:feedbeef", "docintel run other", "2026-01-01", 0.0)
    (out / LEASE_FILE).write_bytes(claim.encode())
    return claim.encode()


def test_a_refused_run_leaves_another_writers_lease_untouched(tmp_path: Path) -> None:
    path, other = _docs(tmp_path / "a.parquet"), _docs(tmp_path / "b.parquet", "Costs fell.")
    done, unfinished = tmp_path / "done", tmp_path / "unfinished"
    _complete(_plan(path), done)
    _crashed(_plan(path), unfinished)
    for out, p in ((done, _plan(other)), (unfinished, _plan(path, **{"run.batch_size": 8}))):
        theirs = _foreign_lease(out)
        _refused(p, out)
        assert (out / LEASE_FILE).read_bytes() == theirs, out


def test_a_completed_output_is_a_no_op_without_taking_the_lease(tmp_path: Path) -> None:
    """Nothing is written for a completed run: not even a lease held by someone else stops
    the no-op, and it stays theirs."""
    path, out = _docs(tmp_path / "a.parquet"), tmp_path / "out"
    _complete(_plan(path), out)
    claim = Claim("elsewhere:1:1:cafe", "docintel run other", "2026-01-01", time.time() + 600)
    (out / LEASE_FILE).write_bytes(claim.encode())
    with RunOutput.open(_plan(path), str(out), "r1") as again:
        assert again.complete
    assert (out / LEASE_FILE).read_bytes() == claim.encode()
