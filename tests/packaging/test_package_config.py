"""`make demo` installs quietly (issue 31, item 16): building docintel from
``[tool.setuptools]`` raises no setuptools warning, such as the box about a data folder
("Package 'docintel.models.finsent_ft.encoder' is absent from the `packages`
configuration") that every `pip install` printed. Seconds: the build itself, no install;
test_wheel.py checks what the wheel holds."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

BUILD = """
import sys, warnings
warnings.simplefilter("always")
from setuptools import build_meta
getattr(build_meta, sys.argv[1])(sys.argv[2])
"""


@pytest.mark.parametrize("hook", ["build_wheel", "build_editable"])
def test_build_raises_no_setuptools_warning(hook: str, tmp_path: Path) -> None:
    # build/ and *.egg-info in tmp_path, never in the checkout (as test_wheel.py)
    cfg = tmp_path / "setup.cfg"
    cfg.write_text(
        f"[build]\nbuild_base = {tmp_path / 'build'}\n[egg_info]\negg_base = {tmp_path}\n"
    )
    dist = tmp_path / "dist"
    r = subprocess.run(
        [sys.executable, "-c", BUILD, hook, str(dist)],
        cwd=REPO, env={**os.environ, "DIST_EXTRA_CONFIG": str(cfg)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    assert "absent from the `packages` configuration" not in r.stderr, r.stderr[-4000:]
    assert "Warning" not in r.stderr, r.stderr[-4000:]
    if hook == "build_wheel":
        (wheel,) = dist.glob("docintel-*.whl")
        names = zipfile.ZipFile(wheel).namelist()
        encoder = sorted(n for n in names if "/finsent_ft/encoder/" in n)
        assert [n.rsplit("/", 1)[1] for n in encoder] == sorted(
            p.name for p in (REPO / "models" / "finsent_ft" / "encoder").iterdir()
        )
