"""Nothing user-controlled drives the terminal (issue 20, item 11): file names, ids, job
logs and error messages reach stdout and stderr with their control characters escaped
(``docintel.jobs.ui.safe``). `docintel ingest`'s side is in test_ingest.py."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from docintel.jobs.cli import app
from docintel.jobs.ui import safe
from docintel.pipeline.errors import UsageError

RAW = ("\x1b", "\r", "\x07", "\x08", "\x9b", "\u202e", "\u2066")
HOSTILE = "ok\x1b[2J\x1b]0;pwned\x07\rover\x08\x9b31m\u202etxt.exe\u2066"


def _assert_clean(text: str) -> None:
    for raw in RAW:
        assert raw not in text, (raw, text)


def test_safe_escapes_every_terminal_control_visibly() -> None:
    assert safe("plain name-1.txt, été 日本") == "plain name-1.txt, été 日本"
    assert safe("a\x1b[31mb\rc") == "a\\x1b[31mb\\x0dc"
    assert safe("x\u202ey\x9bz\x7f") == "x\\u202ey\\x9bz\\x7f"
    assert safe("two\nlines\tand tab") == "two\\x0alines\\x09and tab"  # a name: one line
    # multi-line text (logs, messages) keeps newlines and tabs; CRLF becomes LF
    assert safe("l1\r\nl2\tx\x1b[0m\r", multiline=True) == "l1\nl2\tx\\x1b[0m\\x0d"
    assert safe("caf\udce9.txt") == "caf\\udce9.txt"  # a lone surrogate would not print
    _assert_clean(safe(HOSTILE))
    _assert_clean(safe(HOSTILE, multiline=True))


class _Jobs:
    """What `docintel logs / status` get from the Jobs SDK, with hostile contents."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from docintel.jobs import submit as jobs

        self.info = SimpleNamespace(
            status="FAILED",
            entrypoint=f"python -m docintel.jobs.batch --input {HOSTILE}",
            start_time=None,
            end_time=None,
            driver_exit_code=1,
            message=f"Job failed\ndocintel: run failed: {HOSTILE}",
            submission_id=f"raysubmit_{HOSTILE}",
            job_id=None,
        )
        monkeypatch.setattr(jobs, "connect", lambda *_: object())
        monkeypatch.setattr(jobs, "job_logs", lambda *_: f"line 1\n{HOSTILE}\n")
        monkeypatch.setattr(jobs, "job_info", self.job_info)

        def follow(_client: Any, _job_id: str, write: Any) -> str:
            write(f"streamed {HOSTILE}\r\n")
            return ""

        monkeypatch.setattr(jobs, "follow_logs", follow)

    def job_info(self, _client: Any, job_id: str) -> Any:
        if "\x1b" in job_id:
            raise UsageError(f"the cluster has no job {job_id!r}")
        return self.info


def test_logs_status_and_errors_print_hostile_text_escaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _Jobs(monkeypatch)
    runner = CliRunner()
    logs = runner.invoke(app, ["logs", "raysubmit_x"])
    assert logs.exit_code == 0, logs.output
    assert logs.stdout.startswith("line 1\nok\\x1b[2J\\x1b]0;pwned\\x07\\x0dover")
    follow = runner.invoke(app, ["logs", "raysubmit_x", "--follow"])
    assert follow.exit_code == 0 and follow.stdout.startswith("streamed ok\\x1b[2J")
    status = runner.invoke(app, ["status", "raysubmit_x"], env={"COLUMNS": "400"})
    assert status.exit_code == 1, status.output
    assert "--input ok\\x1b[2J" in status.stdout and "failed: ok\\x1b[2J" in status.stdout
    unknown = runner.invoke(app, ["status", f"raysubmit_{HOSTILE}"])
    assert unknown.exit_code == 2 and "no job" in unknown.stderr
    for r in (logs, follow, status, unknown):
        _assert_clean(r.stdout + r.stderr)


def _result(hits: list[dict[str, Any]], queries: list[str] | None = None) -> Any:
    from docintel.pipeline.search.query import SearchResult

    queries = queries or ["going concern"]
    return SearchResult(queries, [hits] * len(queries), [False] * len(queries), False, "exact")


HIT = {
    "doc_id": "invoice-\u202egpj.exe\x9b",
    "sent_index": 3,
    "text": "Shares\u2066 fell\u200f\x85 12%\x1b[2J, été 日本",
    "label": "Bear\u061cish",
    "score": 0.91,
    "similarity": 0.8,
}


def test_search_json_lines_escape_every_control(capsys: pytest.CaptureFixture[str]) -> None:
    """`docintel search --json`: each control (bidi, C1, C0) is a \\u escape in the line,
    other text stays readable UTF-8, and a parser gets the exact values back."""
    from docintel.jobs.cli_search import _print_json

    _print_json(_result([HIT], ["q\u202e1", "q2"]))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line in lines:
        _assert_clean(line)
        assert "\\u202e" in line and "\\u009b" in line and "été 日本" in line
    assert json.loads(lines[0]) == {"query": "q\u202e1", **HIT}


SENTENCE = (
    "The company said on Tuesday that it expects revenue to fall\nsharply next quarter "
    "as demand for its flagship products weakens\r\nin Europe and Asia."
)


def test_search_table_is_readable_at_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text column gets the width the other columns leave (not a sliver), wraps at
    word boundaries, and shows a sentence's newlines as spaces, not \\x0a."""
    from rich.cells import cell_len

    from docintel.jobs.cli_search import _print_tables

    monkeypatch.setenv("COLUMNS", "80")
    hit = {"doc_id": "10-K/2024/acme-corporation-annual-report", "sent_index": 12,
           "text": SENTENCE, "label": "Bearish", "score": 0.98765,
           "similarity": 0.812345}  # fmt: skip
    _print_tables(_result([hit, {**HIT, "label": "Neutral"}]))
    lines = capsys.readouterr().out.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#"))
    col = lines[header].index("text")
    assert 80 - col >= 24, lines[header]  # it was 15 columns wide
    rows = lines[header + 2 :]
    second = next(i for i, line in enumerate(rows) if line.startswith("2 "))
    first = [line[col:].strip() for line in rows[:second]]
    assert " ".join(first) == " ".join(SENTENCE.split())  # whole words, newlines as spaces
    out = "\n".join(lines)
    assert "\\x0a" not in out and "\\x0d" not in out
    _assert_clean(out)  # the second hit's controls: escaped
    assert "\\u2066" in out and "\\x1b[2J" in out
