"""The embedded Ray of a local run listens on loopback only, with token auth on and a
private token file, even when the shell says RAY_AUTH_MODE=disabled. Its workers inherit
docintel's worker environment (no runtime_env), which the driver's caller gets back
afterwards; its autoscaler monitor can be ended first without harm, and the session leaves
no process behind. Its temp folder (sessions, logs, sockets) is private to its user."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

# Runs in its own process (its own embedded Ray): lists every listening socket of the
# driver, the Ray daemons it started and their workers, while the session is up.
PROBE = """
import json, os, psutil, ray
from docintel.actors.cluster import MONITOR_SCRIPT, _end_autoscaler_monitor, ray_session
from docintel.pipeline.config import load_config

def monitors():  # running ones (a killed one stays a zombie until Ray's shutdown reaps it)
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if any(a.endswith(MONITOR_SCRIPT) for a in p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return found

with ray_session(load_config(None, {"run.num_cpus": 1})):
    @ray.remote(num_cpus=0.1)
    def mode():
        return os.environ.get("RAY_AUTH_MODE")

    @ray.remote(num_cpus=0.1)
    def worker_env():
        return {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE")}

    worker_mode = ray.get(mode.remote())
    env_in_worker = ray.get(worker_env.remote())
    job_runtime_env = ray.get_runtime_context().runtime_env
    monitors_before = len(monitors())
    _end_autoscaler_monitor()
    monitors_after = len(monitors())
    works_after = ray.get(mode.remote())
    me = psutil.Process()
    pids = {me.pid} | {p.pid for p in me.children(recursive=True)}
    listening = sorted(
        {(c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name())
         for c in psutil.net_connections(kind="inet")
         if c.status == psutil.CONN_LISTEN and c.pid in pids}
    )
    inside = os.environ.get("RAY_AUTH_MODE")
    session = ray._private.worker.global_worker.node.get_session_dir_path()
    folders = {}
    for name, path in (("session", session), ("temp", os.path.dirname(session)),
                       ("root", os.path.dirname(os.path.dirname(session)))):
        st = os.lstat(path)
        folders[name] = [path, st.st_mode, st.st_uid]
    logs = os.path.join(session, "logs")
alive = [p.pid for p in psutil.Process().children(recursive=True) if p.is_running()
         and p.status() != psutil.STATUS_ZOMBIE]
print(json.dumps({"listening": listening, "worker_mode": worker_mode, "driver_mode": inside,
                  "after": os.environ.get("RAY_AUTH_MODE"), "env_in_worker": env_in_worker,
                  "env_after": os.environ.get("TOKENIZERS_PARALLELISM"),
                  "job_env_vars": dict(job_runtime_env).get("env_vars"),
                  "monitors": [monitors_before, monitors_after], "works_after": works_after,
                  "alive_after": alive, "folders": folders, "uid": os.getuid(),
                  "logs": sorted(os.listdir(logs))}))
"""
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


@dataclass
class Probed:
    got: dict[str, Any]  # what PROBE printed
    home: Path  # the HOME it ran with
    runtime: Path  # the XDG_RUNTIME_DIR it ran with


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probed]:
    """PROBE, run once for the module's tests (one embedded Ray start)."""
    home = tmp_path_factory.mktemp("home")
    # The user's runtime folder as systemd makes it (0700, ours), at a short path: Ray's
    # socket paths must fit (pytest's tmp_path would be too long, and be skipped).
    runtime = Path(tempfile.mkdtemp(prefix="dr", dir="/tmp"))
    env = {
        **os.environ,
        "HOME": str(home),  # a fresh ~/.ray: the token file is created by this run
        "RAY_AUTH_MODE": "disabled",  # inherited from a careless shell: must not win
        "XDG_RUNTIME_DIR": str(runtime),
    }
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_TMPDIR"):
        env.pop(name, None)
    for name in ("TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE"):
        env.pop(name, None)  # only docintel's worker environment sets them
    try:
        r = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, env=env,
            timeout=300, check=False,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        yield Probed(json.loads(r.stdout.strip().splitlines()[-1]), home, runtime)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_embedded_ray_listens_on_loopback_with_token_auth(probed: Probed) -> None:
    got = probed.got
    listening = [tuple(x) for x in got["listening"]]
    names = {name for _, _, name in listening}
    assert {"gcs_server", "raylet"} <= names, listening  # the probe saw Ray's own daemons
    exposed = [x for x in listening if x[0] not in LOOPBACK]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert got["driver_mode"] == "token" and got["worker_mode"] == "token"
    assert got["after"] == "disabled"  # the caller's environment is restored afterwards
    # the workers' environment arrives by inheritance, not through a runtime_env
    assert got["env_in_worker"] == {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    assert not got["job_env_vars"], got["job_env_vars"]
    assert got["env_after"] is None
    # the autoscaler monitor ran, was ended before shutdown, and Ray kept working
    assert got["monitors"] == [1, 0] and got["works_after"] == "token"
    assert got["alive_after"] == [], got["alive_after"]  # nothing left behind
    token = probed.home / ".ray" / "auth_token"
    assert token.is_file() and len(token.read_text().strip()) == 64
    assert stat.S_IMODE(token.stat().st_mode) == 0o600


def test_embedded_ray_session_folder_is_private(probed: Probed) -> None:
    """Ray's default temp folder (/tmp/ray) and its session folders are 0777 with 0644
    logs that can quote documents: the embedded Ray's live in the user's runtime folder,
    in a folder of ours that only we can enter, and the session folder is 0700 too."""
    folders, uid = probed.got["folders"], probed.got["uid"]
    root = probed.runtime / "docintel"
    assert folders["root"][0] == str(root), folders
    assert folders["temp"][0] == str(root / "ray")
    for name, (path, mode, owner) in folders.items():
        assert stat.S_ISDIR(mode) and not stat.S_ISLNK(mode), (name, path)
        assert owner == uid, (name, path, owner)
        assert stat.S_IMODE(mode) == 0o700, (name, path, oct(mode))
    assert probed.got["logs"], "the session's logs are there (and private)"
    assert not Path("/tmp/ray", Path(folders["session"][0]).name).exists()
