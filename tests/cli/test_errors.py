"""No traceback reaches a user: bad inputs and outputs end in a clear message, exit 2,
and a hint that holds a command or a path is printed on one line (never hard-wrapped)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli.test_cli import docintel
from tests.conftest import write_docs

LATIN1_NAME = b"caf\xe9.txt"  # a file name that is not UTF-8


def _one_line_with(stderr: str, *needles: str) -> str:
    """The single stderr line that holds every needle (at 80 columns: never wrapped)."""
    lines = [line for line in stderr.splitlines() if all(n in line for n in needles)]
    assert lines, f"no single line holds {needles}:\n{stderr}"
    return lines[0]


@pytest.fixture
def text_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / os.fsdecode(LATIN1_NAME)).write_bytes(b"Caf\xe9 sales fell.")
    (folder / "notes.txt").write_text("Profits rose.")
    return folder


def test_run_on_a_folder_of_text_files_with_a_latin1_name_exits_2(
    text_folder: Path, tmp_path: Path
) -> None:
    """The folder is document input (run reads .txt directly), but a name that is not
    UTF-8 cannot be opened through pyarrow: refused before any work, naming it escaped,
    with ingest (which escapes such names) as the way."""
    r = docintel("run", text_folder, tmp_path / "out", COLUMNS="80")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    line = _one_line_with(r.stderr, "caf\\xe9.txt", "not UTF-8", "`docintel ingest DIR")
    assert line.startswith("docintel: usage error:")
    assert not (tmp_path / "out").exists()


def test_a_parquet_file_with_a_latin1_name_is_named_escaped(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    good = write_docs(tmp_path / "good.parquet", ["a"], ["Fine."])
    (folder / "good.parquet").write_bytes(good.read_bytes())
    (folder / os.fsdecode(b"b\xe9.parquet")).write_bytes(good.read_bytes())
    r = docintel("run", folder, tmp_path / "out", COLUMNS="80")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    _one_line_with(r.stderr, "b\\xe9.parquet", "not UTF-8", "docintel ingest")


@pytest.mark.integration
def test_audit_source_with_a_latin1_name_exits_2(text_folder: Path, tmp_path: Path) -> None:
    r = docintel("audit", "--source", text_folder, "--output", tmp_path / "audits")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    _one_line_with(r.stderr, "caf\\xe9.txt", "docintel ingest")


def test_an_output_that_is_a_file_exits_2_naming_it(tmp_path: Path) -> None:
    docs = write_docs(tmp_path / "in.parquet", ["a"], ["Fine."])
    target = tmp_path / "outfile"
    target.write_text("not a folder")
    r = docintel("run", docs, target)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert str(target) in r.stderr and "is a file" in r.stderr
    assert target.read_text() == "not a folder"
