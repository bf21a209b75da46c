"""Where the embedded Ray's temp folder goes (issue 20, item 10), without starting Ray:
a folder of ours that only we can enter, at a path short enough for Ray's sockets, never
through a symlink or a folder someone else made. The session folders of a real embedded
Ray are checked in tests/integration/test_local_ray_security.py."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from docintel.actors import cluster
from docintel.pipeline.errors import UsageError


@pytest.fixture
def short(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short private folder (pytest's tmp_path is too long for socket paths), and an
    environment without RAY_TMPDIR, XDG_RUNTIME_DIR or TMPDIR."""
    for name in ("RAY_TMPDIR", "XDG_RUNTIME_DIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    path = Path(tempfile.mkdtemp(prefix="dt", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_runtime_folder_is_preferred_and_the_folder_is_made_0700(
    short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short))
    temp = cluster._private_ray_temp()
    assert temp == short / "docintel" / "ray"
    assert _mode(short / "docintel") == 0o700
    assert len(os.fsencode(temp)) <= cluster.MAX_RAY_TEMP_BYTES
    # RAY_TMPDIR (Ray's own setting) wins: the user chose where Ray's files go
    monkeypatch.setenv("RAY_TMPDIR", str(short / "r"))
    (short / "r").mkdir()
    assert cluster._private_ray_temp() == short / "r" / f"docintel-{os.getuid()}" / "ray"


def test_an_open_folder_of_ours_is_closed(short: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(short))
    root = short / f"docintel-{os.getuid()}"
    root.mkdir()
    root.chmod(0o777)
    assert cluster._private_ray_temp() == root / "ray"
    assert _mode(root) == 0o700


def test_symlinks_open_runtime_folders_and_long_paths_are_never_used(
    short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = short / "planted"
    elsewhere.mkdir()
    elsewhere.chmod(0o777)
    (short / f"docintel-{os.getuid()}").symlink_to(elsewhere)  # pre-planted by someone
    open_runtime = short / "run"
    open_runtime.mkdir()
    open_runtime.chmod(0o755)  # not a private runtime folder
    long = short / ("x" * 40)
    long.mkdir(mode=0o700)
    candidates = [
        (short / f"docintel-{os.getuid()}", None),
        (open_runtime / "docintel", open_runtime),
        (long / "docintel", None),
    ]
    monkeypatch.setattr(cluster, "_root_candidates", lambda: candidates)
    with pytest.raises(UsageError, match="no private folder for the embedded Ray") as exc:
        cluster._private_ray_temp()
    message = str(exc.value)
    assert "not a private folder of ours" in message and "too long" in message
    assert "RAY_TMPDIR" in message
    assert not (open_runtime / "docintel").exists() and not list(elsewhere.iterdir())
    assert _mode(elsewhere) == 0o777  # never touched through the link
    # the next candidate, when there is one, is used instead
    monkeypatch.setattr(cluster, "_root_candidates", lambda: [*candidates, (short / "ok", None)])
    assert cluster._private_ray_temp() == short / "ok" / "ray"
