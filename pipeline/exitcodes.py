"""Exit codes of every docintel command and job entrypoint, and the one mapping from an
error to its code.

``docintel run``, ``docintel audit``, ``python -m docintel.jobs.batch`` and
``python -m docintel.jobs.nightly_audit`` all end with one of these; ``docintel submit`` and
``docintel status`` mirror a job's own code.
"""

from __future__ import annotations

from enum import IntEnum

from docintel.pipeline.errors import DocintelError, UsageError


class ExitCode(IntEnum):
    OK = 0  # completed; per-document failures are error rows, counted in the summary
    FAILED = 1  # the run failed; nothing committed; rerun with the same run id to resume
    USAGE = 2  # bad usage or configuration, reported before any work
    PARTIAL = 3  # completed, but unreadable input files were skipped (named in the output)
    INTERRUPTED = 130  # Ctrl-C while following a job (the job itself keeps running)


def exit_code(error: DocintelError) -> ExitCode:
    """The code a command exits with when ``error`` stops it."""
    return ExitCode.USAGE if isinstance(error, UsageError) else ExitCode.FAILED


def error_kind(error: DocintelError) -> str:
    """How the one-line message names the failure: ``usage error`` or ``run failed``."""
    return "usage error" if exit_code(error) == ExitCode.USAGE else "run failed"
