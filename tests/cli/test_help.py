"""Every command's --help reads as prose at any terminal width: paragraphs are filled to the
width, never broken mid-sentence where the docstring's source lines happened to end."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

COMMANDS = ("run", "train", "evaluate", "quantize", "ingest", "audit", "submit", "status", "logs")
WIDTHS = (60, 150)
BOX = ("╭", "│", "╰")  # rich's option panels: their own layout, not the docstring


def _help(command: str, width: int) -> list[str]:
    env = {**os.environ, "COLUMNS": str(width), "TERMINAL_WIDTH": str(width)}
    r = subprocess.run(
        [sys.executable, "-m", "docintel.jobs.cli", command, "--help"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def _description(lines: list[str]) -> list[list[str]]:
    """The prose paragraphs between the usage line and the first option panel."""
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    body: list[str] = []
    for line in lines[start:]:
        if line.lstrip().startswith(BOX):
            break
        body.append(line.rstrip())
    paragraphs: list[list[str]] = [[]]
    for line in body:
        if line.strip():
            paragraphs[-1].append(line)
        elif paragraphs[-1]:
            paragraphs.append([])
    # Example lines are indented deeper than prose (" docintel ..." vs "   docintel ...").
    return [p for p in paragraphs if p and not p[0].startswith("   ")]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_paragraphs_fill_the_width(command: str) -> None:
    for width in WIDTHS:
        paragraphs = _description(_help(command, width))
        assert paragraphs, f"`docintel {command} --help` shows no description"
        for para in paragraphs:
            for line, nxt in itertools.pairwise(para):
                assert len(line) <= width, f"{command} at {width}: overlong line {line!r}"
                next_word = nxt.split()[0]
                # Greedy fill: a line ends early only if the next word would not fit.
                assert len(line) + 1 + len(next_word) > width - 2, (
                    f"`docintel {command} --help` at width {width} breaks a sentence early:\n"
                    f"{line!r}\n{nxt!r}"
                )


def test_wide_help_keeps_each_paragraph_on_one_line() -> None:
    """At 150 columns a short paragraph is one line: no hard-wrapped source lines leak."""
    paragraphs = _description(_help("submit", 150))
    first = paragraphs[0]
    assert len(first) == 1 and "Run the pipeline on a Ray cluster" in first[0], paragraphs


def test_short_help_and_version() -> None:
    """`-h` is `--help` for the app and every command; `--version` prints the version."""
    from importlib.metadata import version

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "docintel.jobs.cli", *args],
            capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
        )  # fmt: skip

    assert cli("--version").stdout.strip() == f"docintel {version('docintel')}"
    for args in (("-h",), ("run", "-h")):
        short, long = cli(*args), cli(*args[:-1], "--help")
        assert short.returncode == 0 and short.stdout == long.stdout
