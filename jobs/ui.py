"""What every docintel command shares: consoles, the config option, help text, errors,
the live progress bar and the run summary table. No command lives here."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from docintel.pipeline.errors import DocintelError
from docintel.pipeline.exitcodes import ExitCode, error_kind, exit_code
from docintel.pipeline.untrusted import visible

# Text is never hard-wrapped (soft_wrap): a message that holds a command, a URL or a path
# stays one line the terminal folds, so it can be copied and pasted whole. Tables still
# fit the width.
console = Console(stderr=True, soft_wrap=True)  # messages, warnings, progress
out = Console(soft_wrap=True)  # results: summaries, tables

EXAMPLE_CONFIG = "docintel.example.toml"
PROGRESS_ENV = "DOCINTEL_PROGRESS"  # force the live bar when stderr is not a terminal

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help=f"TOML config file (every key is in {EXAMPLE_CONFIG}).",
        exists=False,
        dir_okay=False,
    ),
]

ProgressOpt = Annotated[bool, typer.Option(help="Show a live progress bar.")]

FRAMEWORK_LOG = "logs/frameworks.log"  # under the docintel cache folder
FRAMEWORK_LOG_MAX = 16 * 1024 * 1024  # a larger log is started afresh by the next command
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose",
        help="Also show the frameworks' log lines (TensorFlow, absl, ONNX Runtime, PyTorch "
        "warnings); by default they go to logs/frameworks.log in the docintel cache "
        "($DOCINTEL_CACHE_DIR, else ~/.cache/docintel).",
    ),
]

F = TypeVar("F", bound=Callable[..., Any])
_INDENTED = re.compile(r"^\s")


def safe(text: object, *, multiline: bool = False) -> str:
    """``text`` as it may reach a terminal: every control character that a terminal
    would act on (escape sequences, carriage return, bidi overrides...; the list is
    docintel.pipeline.untrusted's, shared with the JSON, CSV and HTML docintel writes)
    becomes a visible escape such as ``\\x1b`` or ``\\u202e``; the rest is kept as is. A
    single line (file names, ids, paths) escapes newline and tab too, so a name cannot
    forge output lines; ``multiline`` keeps them (and turns CRLF into LF) for log text and
    messages. Use it on everything user-controlled that is printed: file names, doc and
    job ids, log lines, error messages that echo paths. It does not escape Rich markup:
    print the result with ``markup=False`` or through ``rich.markup.escape``."""
    return visible(text, multiline=multiline)


def prose(doc: str | None) -> str:
    """A docstring as help text: each prose paragraph on one line, so the terminal wraps it
    at its own width (rich keeps a docstring's hard line breaks, which then break lines
    mid-sentence); indented lines (examples) stay lines of their own."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", inspect.cleandoc(doc or "")):
        lines = block.splitlines()
        if any(_INDENTED.match(line) for line in lines):
            paragraphs.extend(line.rstrip() for line in lines)  # examples: one per line
        else:
            paragraphs.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs)


def command(app: typer.Typer, fn: F) -> F:
    """Register ``fn`` as a command of ``app``, its docstring as prose help. Every command
    is quiet (:func:`quiet_frameworks`) unless ``--verbose``: a command without its own
    ``verbose`` parameter gets the option here."""
    sig = inspect.signature(fn, eval_str=True)
    own = "verbose" in sig.parameters

    @functools.wraps(fn)
    def quiet_command(*args: Any, **kwargs: Any) -> Any:
        verbose = bool(kwargs.get("verbose") if own else kwargs.pop("verbose", False))
        with quiet_frameworks(verbose):
            return fn(*args, **kwargs)

    params = list(sig.parameters.values())
    if not own:
        kind = inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter("verbose", kind, default=False, annotation=VerboseOpt))
    quiet_command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    quiet_command.__annotations__ = {p.name: p.annotation for p in params}
    app.command(help=prose(fn.__doc__))(quiet_command)
    return fn


# Loggers of the frameworks the commands load; their notices are not docintel's output.
_FRAMEWORK_LOGGERS = ("tensorflow", "absl", "keras", "transformers", "torch", "onnxruntime")


@contextlib.contextmanager
def quiet_frameworks(verbose: bool) -> Iterator[None]:
    """Keep the frameworks' log lines off the terminal unless ``verbose``: TensorFlow's
    oneDNN and absl lines and ONNX Runtime's notices (written by C++ straight to file
    descriptor 2, which no environment variable of theirs reliably silences), Python
    warnings (torch's TracerWarning, deprecations) and the frameworks' Python loggers
    below ERROR. Descriptor 2 is pointed at the log file (``<cache>/logs/frameworks.log``)
    while docintel's own messages, and any traceback, keep the terminal through a copy of
    the original descriptor. Everything is restored on the way out."""
    if verbose:
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    levels = {name: logging.getLogger(name).level for name in _FRAMEWORK_LOGGERS}
    for name in levels:
        logging.getLogger(name).setLevel(logging.ERROR)
    with _native_stderr_to_log() as log, warnings.catch_warnings():
        if log is not None:
            warnings.showwarning = functools.partial(_log_warning, log)
        else:
            warnings.simplefilter("ignore")
        try:
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


def _log_warning(
    log: Any, message: Any, category: Any, filename: str, lineno: int, *_: Any
) -> None:
    log.write(warnings.formatwarning(message, category, filename, lineno))
    log.flush()


def framework_log() -> Path:
    from docintel.pipeline.artefacts.paths import cache_dir

    return cache_dir() / FRAMEWORK_LOG


@contextlib.contextmanager
def _native_stderr_to_log() -> Iterator[Any]:
    """Descriptor 2 to the framework log, ``sys.stderr`` to a copy of the terminal's;
    yields the log as a text file, or None where stderr is not the process's descriptor
    2 (a test runner's capture) or the log cannot be opened (then nothing is moved)."""
    try:
        if sys.stderr.fileno() != 2:
            raise OSError("stderr is not descriptor 2")
        path = framework_log()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        mode = "w" if path.is_file() and path.stat().st_size > FRAMEWORK_LOG_MAX else "a"
        log = path.open(mode, encoding="utf-8", errors="backslashreplace")
    except (OSError, ValueError, AttributeError):
        yield None
        return
    previous, saved = sys.stderr, os.dup(2)
    previous.flush()
    os.dup2(log.fileno(), 2)
    enc, errs = previous.encoding, previous.errors
    sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, encoding=enc, errors=errs)
    try:
        yield log
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
            sys.stderr.close()
        sys.stderr = previous
        os.dup2(saved, 2)
        os.close(saved)
        log.close()


def fail(e: DocintelError) -> NoReturn:
    """Print the error (its text is data: never markup, control characters escaped) and
    exit with its code."""
    message = escape(safe(e, multiline=True))
    console.print(f"[bold red]docintel: {error_kind(e)}:[/] {message}", highlight=False)
    raise typer.Exit(exit_code(e))


def warn_partial(what: str, n: int, detail: str) -> NoReturn:
    """A completed but partial run or audit: say so, exit 3."""
    console.print(
        f"[bold yellow]docintel: partial {what}:[/] {n} {detail}; exit code "
        f"{int(ExitCode.PARTIAL)}",
        highlight=False,
    )
    raise typer.Exit(ExitCode.PARTIAL)


def _progress_bar(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} docs"),
        TextColumn("{task.fields[sentences]:,} sentences"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
        transient=False,
    )


def run_with_progress(
    run: Callable[..., Any], cfg: Any, *args: Any, seen: dict[str, Any] | None = None
) -> Any:
    """Call ``run(cfg, *args, on_start=..., on_batch=...)`` under a live progress bar (on a
    terminal, or when DOCINTEL_PROGRESS is set, unless the config turns it off).
    ``seen["batches"]`` counts the batches written, for a message after an interrupt."""
    show = (cfg.run.show_progress and sys.stderr.isatty()) or os.environ.get(PROGRESS_ENV)
    progress = _progress_bar(bool(show))
    state: dict[str, Any] = {"task": None, "t0": time.perf_counter(), "docs": 0, "sents": 0}

    def on_start(total: int, done: int) -> None:
        state["t0"] = time.perf_counter()
        state["task"] = progress.add_task(
            "docintel", total=total, completed=done, sentences=0, rate=""
        )

    def on_batch(stats: Any) -> None:
        if seen is not None:
            seen["batches"] = seen.get("batches", 0) + 1
        state["docs"] += stats.documents
        state["sents"] += stats.sentences
        dt = max(1e-9, time.perf_counter() - state["t0"])
        rate = f"{state['docs'] / dt:,.1f} docs/s {state['sents'] / dt:,.1f} sent/s"
        progress.update(state["task"], advance=stats.documents, sentences=state["sents"], rate=rate)

    extra = {"on_open": seen["on_open"]} if seen and "on_open" in seen else {}
    with progress:
        return run(cfg, *args, on_start=on_start, on_batch=on_batch, **extra)


def print_run_summary(s: Any) -> None:
    """A run's summary table (or one line when the run was already complete)."""
    if s.already_complete:
        out.print(
            f"run {safe(s.run_id)} in {safe(s.output)} is already complete: nothing to do "
            f"({s.documents:,} documents, {s.sentences:,} sentences, {s.errors:,} errors)",
            markup=False,
        )
        return
    for w in s.warnings:
        console.print(f"[yellow]warning:[/] {escape(safe(w, multiline=True))}", highlight=False)
    t = Table(title=f"docintel run {escape(safe(s.run_id))}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    t.add_row("documents", f"{s.documents:,}")
    t.add_row("sentences", f"{s.sentences:,}")
    t.add_row("errors (documents)", f"{s.errors:,}")
    t.add_row("tokens", f"{s.tokens:,}")
    t.add_row("batches (this run / resumed)", f"{s.batches:,} / {s.skipped_batches:,}")
    t.add_row("wall time", f"{s.wall_seconds:,.1f} s")
    t.add_row("documents/s", f"{s.docs_per_s:,.1f}")
    t.add_row("sentences/s", f"{s.sentences / max(s.wall_seconds, 1e-9):,.1f}")
    for stage, sec in s.stage_seconds.items():
        t.add_row(f"time in {stage}", f"{sec:,.1f} s")
    for stage, counts in s.backends.items():
        served = ", ".join(f"{b}: {n}" for b, n in sorted(counts.items()))
        t.add_row(f"{stage} batches by backend", served)
    for stage, pools in getattr(s, "replicas", {}).items():
        t.add_row(f"{stage} replicas", ", ".join(f"{k}: {n}" for k, n in sorted(pools.items())))
    t.add_row("output", Text(safe(s.output)))  # user data: never markup
    out.print(t)
