"""The embedded local Ray failing under `docintel run`: a start that times out and a
cluster lost mid-run (its GCS process killed, as `ray stop` from another shell would) each
end with exit code 1, a plain message and the command that resumes the run; no
traceback, nothing left running, and the resumed run writes every document once."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

import psutil

from docintel.actors.local_ray import GCS_PROCESS
from tests.cli.test_cli import DOCINTEL, docintel
from tests.conftest import REPO, assert_exactly_once, write_docs


def _left_running(children: list[psutil.Process]) -> list[str]:
    time.sleep(2)
    return [
        " ".join(p.cmdline()[:2])
        for p in children
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


def test_a_lost_local_ray_says_so_and_how_to_resume(tmp_path: Path) -> None:
    ids = [f"l{i:04d}" for i in range(1_000)]  # 250 batches: still running at the kill
    texts = [f"Revenue rose {i}% in the quarter. Costs fell sharply at unit {i}." for i in ids]
    inp = write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=1_000)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*DOCINTEL, "run", str(inp), str(out), "--batch-size", "4", "--no-progress"],
        cwd=REPO, env={**os.environ, "COLUMNS": "200"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list((out / "documents").glob("*.parquet"))) >= 2:
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    children = psutil.Process(proc.pid).children(recursive=True)
    gcs = [p for p in children if p.name() == GCS_PROCESS]
    assert len(gcs) == 1, [p.name() for p in children]
    t0 = time.monotonic()
    gcs[0].kill()
    stdout, stderr = proc.communicate(timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stdout + stderr
    err = " ".join(stderr.split())
    assert "run failed: the local Ray cluster of this run stopped under it" in err, err
    assert "`ray stop` from another shell" in err and "resume it with:" in err
    run_id = next(ln.split()[2] for ln in stderr.splitlines() if ln.startswith("docintel: run "))
    args = shlex.split(stdout.strip().splitlines()[-1])  # the command alone on stdout
    assert args[0] == "docintel" and args[-2:] == ["--run-id", run_id]
    assert took < 60, f"{took:.0f} s: Ray's own driver ends the process silently at 60 s"
    assert not _left_running(children)
    again = docintel(*args[1:])
    assert again.returncode == 0, again.stderr[-3000:]
    assert_exactly_once(out, ids)


def test_a_local_ray_start_that_times_out_is_a_message(tmp_path: Path) -> None:
    """Ray's own knob for how long it waits for its GCS to come up, at 0: the start
    times out as it does on a machine too loaded to start the GCS in time."""
    inp = write_docs(tmp_path / "in.parquet", ["a"], ["Profit rose."])
    out = tmp_path / "out"
    r = docintel("run", inp, out, "--no-progress", RAY_gcs_server_port_wait_time_s="0")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert "run failed: the local Ray cluster did not start in time" in err, err
    assert "retry the command" in err and "resume it with:" in err
    args = shlex.split(r.stdout.strip().splitlines()[-1])  # the command alone on stdout
    assert args[:2] == ["docintel", "run"] and args[-2] == "--run-id"
    again = docintel(*args[1:])  # nothing of the failed start is in the way
    assert again.returncode == 0, again.stderr[-3000:]
    assert_exactly_once(out, ["a"])
