"""A failed job's summary: the last lines of its log, from its last traceback."""

from __future__ import annotations

from docintel.jobs.submit import LOG_TAIL_LINES, last_error_lines


def test_last_lines_start_at_the_last_traceback_within_them() -> None:
    log = "\n".join(
        [f"docintel: progress {i}" for i in range(40)]
        + ["", "Traceback (most recent call last):", '  File "<frozen runpy>", line 189']
        + ["ModuleNotFoundError: No module named 'docintel'", ""]
    )
    assert last_error_lines(log) == [
        "Traceback (most recent call last):",
        '  File "<frozen runpy>", line 189',
        "ModuleNotFoundError: No module named 'docintel'",
    ]


def test_without_a_traceback_the_last_lines_are_kept() -> None:
    log = "\n".join(f"line {i}" for i in range(100))
    assert last_error_lines(log) == [f"line {i}" for i in range(100 - LOG_TAIL_LINES, 100)]
    assert last_error_lines("") == []
