"""Issue 31 item 5: `docintel index` never writes or deletes outside OUTPUT. ``_index`` must
be a real folder (a symlink is refused, nothing through it is touched); the pointer may name
only a build inside ``_index``; unknown parameters mean "damaged, rebuild" (exit 2), not a
TypeError; a rebuild deletes only the builds the index wrote. Real runs, real Lance."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from docintel.pipeline.errors import InputError
from docintel.pipeline.exitcodes import ExitCode, exit_code
from docintel.pipeline.search import index as ann_index
from docintel.pipeline.search.query import search
from tests.conftest import REPO
from tests.integration.test_search import run_out  # noqa: F401 (fixture)

QUERY = "shares fall after the company cuts its profit forecast"


@pytest.fixture
def out(run_out: Path, tmp_path: Path) -> Path:  # noqa: F811
    return Path(shutil.copytree(run_out, tmp_path / "out"))


def _victim(tmp_path: Path) -> Path:
    """A folder outside OUTPUT holding what must survive."""
    victim = tmp_path / "victim"
    (victim / "0123456789abcdef.lance").mkdir(parents=True)
    (victim / "precious.txt").write_text("keep me")
    return victim


def _untouched(victim: Path) -> None:
    assert (victim / "precious.txt").read_text() == "keep me"
    assert (victim / "0123456789abcdef.lance").is_dir()
    assert sorted(p.name for p in victim.iterdir()) == ["0123456789abcdef.lance", "precious.txt"]


def test_a_symlinked_index_folder_is_refused_and_nothing_behind_it_is_touched(
    out: Path, tmp_path: Path
) -> None:
    victim = _victim(tmp_path)
    (out / "_index").symlink_to(victim, target_is_directory=True)
    with pytest.raises(InputError, match="symlink") as caught:
        ann_index.build_index(str(out))
    assert exit_code(caught.value) == ExitCode.USAGE
    with pytest.raises(InputError, match="symlink"):
        search(str(out), [QUERY], top=3)
    done = subprocess.run(
        [sys.executable, "-m", "docintel.jobs.cli", "index", str(out)],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == ExitCode.USAGE and "symlink" in done.stderr
    assert "Traceback" not in done.stderr
    _untouched(victim)


def test_the_pointer_names_only_a_build_inside_the_index(out: Path, tmp_path: Path) -> None:
    record = ann_index.build_index(str(out))
    pointer = out / "_index" / "current.json"
    victim = _victim(tmp_path)
    for bad in ("../../victim/0123456789abcdef.lance", "/etc", "x.lance", ""):
        pointer.write_text(json.dumps({**record, "path": bad}))
        with pytest.raises(InputError, match="damaged") as caught:
            search(str(out), [QUERY], top=3)
        assert exit_code(caught.value) == ExitCode.USAGE and "docintel index" in str(caught.value)
    # unknown parameters: damaged, rebuild (not a TypeError)
    pointer.write_text(json.dumps({**record, "params": {**record["params"], "warp": 9}}))
    with pytest.raises(InputError, match="unknown index parameters"):
        search(str(out), [QUERY], top=3)
    # a rebuild replaces the pointer and deletes only the builds the index wrote
    (out / "_index" / "notes").mkdir()
    (out / "_index" / "notes" / "mine.txt").write_text("mine")
    stale = record["path"]
    again = ann_index.build_index(str(out))
    assert again["path"] != stale and not (out / "_index" / stale).exists()
    assert (out / "_index" / "notes" / "mine.txt").read_text() == "mine"
    assert search(str(out), [QUERY], top=3).used_index
    _untouched(victim)
