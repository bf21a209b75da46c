"""Jobs tier: a real Ray head (`ray start --head`) on this machine, and the CLI against it.

The head is started from this venv as a subprocess in its own process group, with its own
--temp-dir and free ports (never Ray's defaults: other Ray instances may run on the same
machine), its dashboard on loopback, and Ray's token authentication on with a token made
for this test (so it never reads or writes ~/.ray/auth_token). It is stopped by
terminating that process group, never with `ray stop` (which kills every Ray on the
machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

BIN = Path(sys.executable).parent  # the venv running the tests: ray, docintel, python
HEAD_START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
# The ports a head binds besides its workers' (those are left to the OS: 0..0).
PORT_FLAGS = (
    "--port",
    "--dashboard-port",
    "--ray-client-server-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
    "--node-manager-port",
    "--object-manager-port",
)
OBJECT_STORE_BYTES = 256 * 1024 * 1024  # tiny corpora; keeps the node's footprint small


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports nothing listens on right now (held open together, then freed)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class RayHead:
    address: str  # the dashboard (Jobs API): what `docintel submit --address` takes
    gcs_port: int
    temp_dir: Path
    env: dict[str, str]  # environment for clients: the token, no RAY_ADDRESS
    proc: subprocess.Popen[bytes]


def plain_env() -> dict[str, str]:
    """This environment without any Ray address or token settings; wide output; this
    venv first on PATH (the job's `python -m docintel.jobs.batch` must be this venv's python, as
    on an image with docintel installed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(COLUMNS="200", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return env


def _client_env(token: str) -> dict[str, str]:
    return {**plain_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def _wait_ready(address: str, token: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + HEAD_START_TIMEOUT_S
    req = urllib.request.Request(
        f"{address}/api/version", headers={"Authorization": f"Bearer {token}"}
    )
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"ray start exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=5) as r:
            if json.load(r).get("ray_version"):
                return
        time.sleep(0.5)
    pytest.fail(f"the Ray head did not answer at {address}:\n{log.read_text()[-3000:]}")


def _group_members(pgid: int) -> list[int]:
    """Live processes of a process group (from /proc: no psutil assumptions)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(stat.parent.name))
    return pids


def _using(temp_dir: Path) -> list[int]:
    """Live processes whose command line names the head's temp dir (its Ray processes)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(temp_dir).encode() in cmdline.read_bytes():
                pid = int(cmdline.parent.name)
                if pid != os.getpid():
                    pids.append(pid)
    return pids


def _stop(head: RayHead) -> None:
    pgid = head.proc.pid  # started with start_new_session: the leader's pid is the pgid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.proc.wait(timeout=STOP_TIMEOUT_S)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _group_members(pgid):  # what ignored SIGTERM
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        time.sleep(1)
    head.proc.wait(timeout=10)
    assert not _group_members(pgid), f"Ray head processes survived: {_group_members(pgid)}"
    assert not _using(head.temp_dir), f"Ray processes still use {head.temp_dir}"


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    """A one-node Ray cluster (2 CPUs, no GPU) with its dashboard on 127.0.0.1."""
    temp_dir = tmp_path_factory.mktemp("ray")
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
    token = secrets.token_hex(32)
    env = _client_env(token)
    # SIGTERM stops the node at once instead of draining it for 30 s first.
    head_env = {**env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    cmd = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        "--num-cpus=2",
        "--num-gpus=0",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        "--min-worker-port=0",
        "--max-worker-port=0",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
        "--block",
        *(f"{flag}={port}" for flag, port in ports.items()),
    ]
    log = temp_dir / "ray-start.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            cwd=temp_dir,
            env=head_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, stopped as one
        )
    address = f"http://127.0.0.1:{ports['--dashboard-port']}"
    head = RayHead(address, ports["--port"], temp_dir, env, proc)
    try:
        _wait_ready(address, token, proc, log)
        yield head
    finally:
        _stop(head)


def docintel(
    *args: str | Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """The installed `docintel` console script, as a user runs it."""
    return subprocess.run(
        [str(BIN / "docintel"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
        check=False,
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/jobs" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
