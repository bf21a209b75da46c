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


def _commands() -> dict[str, str]:
    """Every command of the app and its help text (as registered)."""
    import typer

    from docintel.jobs.cli import app

    group = typer.main.get_command(app)
    return {name: cmd.help or "" for name, cmd in group.commands.items()}  # type: ignore[attr-defined]


def _example_lines(help_text: str) -> list[str]:
    """The example commands of a help text: its indented lines that start with docintel."""
    lines = [line for line in help_text.splitlines() if line[:1].isspace()]
    return [line.strip() for line in lines if line.strip().startswith("docintel ")]


def test_every_example_line_is_whole_at_80_columns() -> None:
    """At 80 columns every example is one line, as written (never wrapped, so an option
    is never split from its value, nor truncated), and no help text ends in '…'."""
    helps = _commands()
    assert set(COMMANDS) <= set(helps)
    for command, text in helps.items():
        lines = [line.strip() for line in _help(command, 80)]
        examples = _example_lines(text)
        assert examples or command in ("search", "index"), f"{command}: no example"
        for example in examples:
            assert len(example) <= 76, f"{command}: example over 76 columns: {example!r}"
            assert example in lines, f"`docintel {command} --help` wraps {example!r}"
        truncated = [line for line in lines if "…" in line]
        assert not truncated, f"`docintel {command} --help` truncates: {truncated}"


def test_options_without_a_fixed_default_say_their_default() -> None:
    """An option whose default is computed (None here) says what it is in its help."""
    import typer

    from docintel.jobs.cli import app

    group = typer.main.get_command(app)
    missing = []
    for name in COMMANDS:
        for p in group.commands[name].params:  # type: ignore[attr-defined]
            if p.param_type_name != "option" or p.required or p.default is not None:
                continue
            if p.name != "config" and "default" not in (p.help or "").lower():
                missing.append(f"{name} {p.opts[0]}")
    assert not missing, f"options that do not say their default: {missing}"
