"""Every exception type docintel raises on purpose.

Messages say what happened, where (file, column, document id, model path) and how to fix it.
``UsageError`` and its subclasses map to exit code 2 (bad usage or configuration, reported
before any work); anything else that escapes a run maps to exit code 1.
"""

from __future__ import annotations


class DocintelError(Exception):
    """Base class of docintel's own errors."""


class UsageError(DocintelError):
    """Bad usage or configuration, detected before any work starts (exit code 2)."""


class ConfigError(UsageError):
    """The configuration file or a CLI override is invalid."""


class InputError(UsageError):
    """The input cannot be processed as given: missing file, column, unreadable file, ids."""


class OutputError(UsageError):
    """The output location cannot be used as given: missing bucket, no permission, a
    read-only, immutable or full folder, a file in the path (an OS error while a run opens
    its output, before any work; the same error later in the run fails it: exit code 1)."""


class ModelError(UsageError):
    """A model file is missing or does not match what the pipeline expects."""


class ChainError(UsageError):
    """A stage needs a column that no earlier stage (nor the source) produces."""


class RunFailed(DocintelError):
    """The run started but could not complete (exit code 1)."""


class DocumentsRejected(DocintelError):
    """A stage refuses some documents of a batch by a stated limit, and has the output of
    the others ready: the refused ones become error rows, nothing is recomputed.

    ``reasons`` maps each refused document id to (error type, message); ``output`` is the
    stage's output table without them.
    """

    def __init__(self, reasons: dict[str, tuple[str, str]], output: object) -> None:
        first = next(iter(reasons.values()), ("", ""))[1]
        super().__init__(f"{len(reasons)} document(s) refused; first: {first}")
        self.reasons = reasons
        self.output = output
