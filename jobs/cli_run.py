"""`docintel run` and `docintel ingest`: options, help and printing only."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from docintel.jobs.cli_models import model_overrides
from docintel.jobs.ui import (
    PROGRESS_ENV,
    ConfigOpt,
    ProgressOpt,
    console,
    fail,
    out,
    print_run_summary,
    run_with_progress,
    safe,
    warn_partial,
)
from docintel.pipeline.config import load_config
from docintel.pipeline.errors import ConfigError, DocintelError
from docintel.pipeline.exitcodes import ExitCode

if TYPE_CHECKING:
    from docintel.pipeline.input.ingest import IngestResult

InputArg = Annotated[
    str,
    typer.Argument(
        help="Parquet file, folder of Parquet files, glob ('data/*.parquet') or s3://prefix."
    ),
]
OutputArg = Annotated[
    str,
    typer.Argument(
        help="Output folder or s3://prefix; gets documents/, sentences/, errors/ and "
        "_manifest.json (written last)."
    ),
]
IdColumnOpt = Annotated[
    str | None,
    typer.Option(help="Column with unique document ids. Default: \\[input] id_column, doc_id."),
]
TextColumnOpt = Annotated[
    str | None,
    typer.Option(help="Column with the document text. Default: \\[input] text_column, text."),
]
RunIdOpt = Annotated[
    str | None,
    typer.Option(
        help="Name of the run. Rerun with the same id to resume an interrupted run. "
        "Default: a new id, printed when the run starts."
    ),
]
BatchSizeOpt = Annotated[
    int | None,
    typer.Option(
        help="Documents per batch, the unit written exactly once. Default: auto, which is "
        "128, or about 1 MiB of text per batch on a run with GPU replicas."
    ),
]
EmbeddingsOpt = Annotated[
    bool | None,
    typer.Option(
        "--embeddings/--no-embeddings",
        help="Write the embedding column in sentences/. Default: \\[run] embeddings, on.",
    ),
]
SpillOpt = Annotated[
    str | None,
    typer.Option(
        help="auto (GPU replicas first, spill to CPU replicas when they are saturated), "
        "gpu-only, cpu-only, or off (no spill). Default: auto.",
    ),
]
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose",
        help="Also show Ray's notices and the stage actors' framework log lines "
        "(TensorFlow, ONNX export); by default they go to Ray's log files and only "
        "docintel's progress and summary show. The embedded Ray keeps them in "
        "session_latest/logs of its private folder: $XDG_RUNTIME_DIR/docintel/ray, else "
        "/tmp/docintel-UID/ray (RAY_TMPDIR/docintel-UID/ray when RAY_TMPDIR is set).",
    ),
]
GpusOpt = Annotated[
    int | None,
    typer.Option(
        help="GPUs declared to the embedded local Ray. Default: every GPU the machine has "
        "(detected), each shared by one replica of every stage. On a machine without GPUs, "
        "N logical GPUs schedule GPU replicas that run on the CPU, labelled gpu-sim; with "
        "CUDA, at most the number of cards.",
    ),
]
CpusOpt = Annotated[
    int | None, typer.Option(help="CPUs for the embedded local Ray (default: all cores).")
]
FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        help="Table format of OUTPUT: parquet (one run per folder), iceberg (OUTPUT is a "
        "warehouse of Iceberg tables each run appends to; the config's output table sets "
        "the catalog) or delta (Delta Lake tables at OUTPUT/documents, sentences and errors "
        "each run appends to). Default: parquet.",
    ),
]
AppendOpt = Annotated[
    bool,
    typer.Option(
        "--append",
        help="With --format iceberg or delta: append the input as a new run even when a "
        "completed run of the same input and plan is already in OUTPUT (without it, such a "
        "run is a no-op that names the completed run).",
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Classifier to label with: a folder written by `docintel train` (with its "
        "fine-tuned encoder when it has one, OUT/encoder), or 'default' / 'stock' (the "
        "bundled models). Default: \\[classify] model_dir and \\[embed] model_path.",
    ),
]
ClassifierOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--classifier",
        metavar="N=DIR",
        help="Also label with the head in DIR (a folder written by `docintel train`, trained "
        "on the run's encoder) under the name N, beside the default head: sentences/ and "
        "documents/ get N_label and N_score (a document's: the arg-max of its sentences' "
        "mean probabilities). Repeat for several; N is a lower-case identifier. The default "
        "head's columns are unchanged. Default: \\[classify.heads], none.",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        help="Join a running Ray cluster ('auto' or ray://host:10001) instead of starting "
        "an embedded one. Default: an embedded Ray."
    ),
]
WatchListOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--watch-list",
        metavar="FILE",
        help="Screen every sentence against this watch list (repeat for several): a CSV or "
        "Parquet file of entity_id, name, optional aliases ('|'-separated) and type, named "
        "by its file's stem. Adds the entities stage: sentences/ gets an entities column "
        "and documents/ entity_ids. A bad list is refused before any work, naming its file "
        "and line. See docs/entities.md. Default: \\[entities] lists, none.",
    ),
]

RedactOpt = Annotated[
    bool | None,
    typer.Option(
        "--redact/--no-redact",
        help="Replace personal values (e-mail addresses, phone numbers, card numbers, IBANs, "
        "US SSNs, IP addresses, and \\[privacy.patterns] of the config) in every sentence by "
        "<TYPE> placeholders before it is embedded, classified, written, searched or "
        "reported; sentences/ gets a pii column of the placeholders' spans, never the "
        "values. Recorded in the manifest; a resume must ask the same. See "
        "docs/privacy.md. Default: \\[privacy] redact, off.",
    ),
]
RedactOnlyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--redact-only",
        metavar="TYPES",
        help="Redact only these built-in types (implies --redact), comma-separated or the "
        "option repeated: EMAIL_ADDRESS, PHONE_NUMBER, CREDIT_CARD, IBAN_CODE, US_SSN, "
        "IP_ADDRESS. Your own patterns go in the config file (\\[privacy.patterns]), "
        "never on the command line. Default: every type when redacting.",
    ),
]


def redact_setting(redact: bool | None, types: list[str] | None) -> bool | list[str] | None:
    """``[privacy] redact`` as --redact / --redact-only ask (None: the config's)."""
    if not types:
        return redact
    if redact is False:
        raise ConfigError("--no-redact and --redact-only contradict each other; give one")
    return [t.strip() for item in types for t in item.split(",") if t.strip()]


def run(
    input: InputArg,
    output: OutputArg,
    config: ConfigOpt = None,
    id_column: IdColumnOpt = None,
    text_column: TextColumnOpt = None,
    run_id: RunIdOpt = None,
    batch_size: BatchSizeOpt = None,
    embeddings: EmbeddingsOpt = None,
    spill: SpillOpt = None,
    gpus: GpusOpt = None,
    num_cpus: CpusOpt = None,
    ray_address: RayAddressOpt = None,
    model: ModelOpt = None,
    classifier: ClassifierOpt = None,
    watch_list: WatchListOpt = None,
    redact: RedactOpt = None,
    redact_only: RedactOnlyOpt = None,
    table_format: FormatOpt = None,
    append: AppendOpt = False,
    progress: ProgressOpt = True,
    verbose: VerboseOpt = False,
) -> None:
    """Run the pipeline over INPUT and write the result tables to OUTPUT.

    Examples:

      docintel run data/demo/documents.parquet demo-out

      docintel run corpus/ out/run1 --text-column body --id-column uuid

      docintel run corpus/ out/run1 --run-id run1     # resume after a crash

      docintel run corpus/ out/ --watch-list clients.csv --watch-list pep.parquet
    """
    from docintel.actors.runner import execute

    overrides = {
        "input.id_column": id_column,
        "input.text_column": text_column,
        "run.run_id": run_id,
        "run.batch_size": batch_size,
        "run.embeddings": embeddings,
        "run.num_cpus": num_cpus,
        "run.spill": spill,
        "run.num_gpus": gpus,
        "run.ray_address": ray_address,
        "output.format": table_format,
        "run.append": True if append else None,
        "run.show_progress": None if progress else False,
        "run.verbose": True if verbose else None,
        "entities.lists": watch_list or None,
    }
    try:
        cfg = _run_config(config, overrides, model, redact_setting(redact, redact_only))
        summary = _watched(execute, with_heads(cfg, classifier), input, output, run_id)
    except DocintelError as e:
        fail(e)
    _print_done(summary)


def _run_config(
    config: Path | None, overrides: dict[str, Any], model: str | None, redact: object
) -> Any:
    """The config file with the options' overrides, ``--model``'s and the redaction's."""
    return load_config(config, {**overrides, **model_overrides(model), "privacy.redact": redact})


def with_heads(cfg: Any, options: list[str] | None) -> Any:
    """``cfg`` with the ``--classifier NAME=DIR`` heads added to ``[classify.heads]`` (a
    name given twice is refused)."""
    if not options:
        return cfg
    from docintel.pipeline.stages.classify import parse_head_options

    heads = parse_head_options(options, dict(cfg.classify.heads))
    return cfg.with_overrides({"classify.heads": heads})


def _print_done(summary: Any) -> None:
    """The run's summary, and a warning when input files were skipped (exit 3)."""
    print_run_summary(summary)
    if summary.partial:
        warn_partial(
            "run",
            len(summary.skipped_files),
            "input file(s) were unreadable and skipped (listed above and in _manifest.json "
            "skipped_files)",
        )


def _watched(execute: Any, cfg: Any, input: str, output: str, run_id: str | None) -> Any:
    """The run under a progress bar; its id printed when it starts, and on Ctrl-C what
    resumes it (``interrupted``)."""
    seen: dict[str, Any] = {"batches": 0}

    def opened(run: str, resumed: int) -> None:
        seen.update(run_id=run, resumed=resumed)
        again = f" (resuming: {resumed:,} batches already committed)" if resumed else ""
        console.print(f"docintel: run {safe(run)}{again}", markup=False, highlight=False)

    seen["on_open"] = opened
    from docintel.actors import local_ray  # imports Ray: only once a run is under way

    try:
        with local_ray.on_lost(lambda e: ray_failed(seen, run_id, e)):
            return run_with_progress(execute, cfg, input, output, seen=seen)
    except KeyboardInterrupt:
        interrupted(seen, run_id)
    except local_ray.LocalRayFailed as e:  # its start timed out, or it was lost mid-run
        ray_failed(seen, run_id, e)
        raise typer.Exit(ExitCode.FAILED) from None


def interrupted(seen: dict[str, Any], run_id: str | None) -> NoReturn:
    """Ctrl-C: the stage replicas and the embedded Ray were stopped on the way out; say
    which run it was, what it committed and the exact command that resumes it; exit 130."""
    run = seen.get("run_id") or run_id
    if run is None:  # stopped before the output was opened: nothing was written
        console.print("docintel: interrupted before any work; nothing was written", markup=False)
        raise typer.Exit(ExitCode.INTERRUPTED)
    _resume_hint(seen, run, "docintel: interrupted: ")
    raise typer.Exit(ExitCode.INTERRUPTED)


def ray_failed(seen: dict[str, Any], run_id: str | None, e: Exception) -> None:
    """The embedded Ray failed under the run (its start timed out, or it stopped): say so,
    then what the run committed and the exact command that resumes it."""
    console.print(f"docintel: run failed: {safe(e, multiline=True)}", markup=False)
    run = seen.get("run_id") or run_id
    if run is not None:
        _resume_hint(seen, run, "docintel: ")


def _resume_hint(seen: dict[str, Any], run: str, lead: str) -> None:
    """What run ``run`` committed (stderr) and the command that resumes it (alone on
    stdout)."""
    total = seen.get("resumed", 0) + seen.get("batches", 0)
    command = shlex.join(["docintel", *sys.argv[1:]])
    if "--run-id" not in sys.argv:
        command += f" --run-id {shlex.quote(run)}"
    console.print(
        f"{lead}run {safe(run)} has {total:,} batches committed "
        f"({seen.get('batches', 0):,} by this invocation); resume it with:",
        markup=False,
        highlight=False,
    )
    out.print(safe(command), markup=False, highlight=False, soft_wrap=True)


FolderArg = Annotated[
    Path,
    typer.Argument(
        help="Folder of documents (searched recursively).", exists=True, file_okay=False
    ),
]
ParquetOutArg = Annotated[Path, typer.Argument(help="Parquet file to write.", dir_okay=False)]
PatternOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--pattern",
        help="Glob(s) of files to take (default: every type docintel reads: *.pdf *.html "
        "*.htm *.docx *.eml *.txt *.md; other files are then listed as skipped).",
    ),
]
MaxFileOpt = Annotated[
    int,
    typer.Option(
        "--max-file-mib", min=1, metavar="MIB", help="Skip (and list) files larger than this."
    ),
]


EncodingOpt = Annotated[
    str | None,
    typer.Option(
        help="Encoding of every file (e.g. cp1252, latin-1, shift_jis). Default: UTF-8 for "
        "files that are valid UTF-8, else the encoding charset-normalizer detects."
    ),
]


def ingest(
    folder: FolderArg,
    output: ParquetOutArg,
    pattern: PatternOpt = None,
    max_file_mib: MaxFileOpt = 64,  # docintel.pipeline.input.ingest.MAX_FILE_BYTES (tested)
    encoding: EncodingOpt = None,
    progress: ProgressOpt = True,
) -> None:
    """Turn a folder of documents into a documents Parquet file (doc_id, text, title,
    source_format, page_starts, encoding).

    PDF, HTML, DOCX and e-mail files are read by the same parsers as `docintel run` on a
    folder (each in a parser process with a time limit; e-mail attachments become rows
    <path>/<name>; a file a parser refuses is skipped and listed with the reason).
    `docintel run FOLDER OUT` reads such a folder directly: ingest is for a Parquet step.

    Text files: doc_id is the file's path relative to FOLDER; text is its content, decoded as UTF-8
    when it is valid UTF-8 (or as its byte-order mark says), else with the encoding
    charset-normalizer detects (Western European text that reads as cp1252 is cp1252),
    or --encoding. The encoding column records it, and the decoding column how it was
    chosen: exact, given, guessed or lossy. Every file whose encoding was guessed, and
    every file decoded lossily (bytes its encoding does not map became U+FFFD), is named
    on stderr. In doc_id, each byte of a file name that is not UTF-8 is written as %XX
    and a literal % as %25, so the Latin-1 name café.txt (byte E9) becomes caf%E9.txt
    and every doc_id names exactly one file.

    Skipped and listed with the reason, never read: files and folders reached through a
    symlink that leads outside FOLDER, binary files (NUL bytes in the first 8 KiB, or
    mostly undecodable), files over --max-file-mib, and a second path to a file already
    taken. Rows are written as files are read (memory stays bounded) to a temporary file
    beside OUTPUT, renamed to OUTPUT only when complete. Exit code 2 if nothing was
    ingested.

    Example:

      docintel ingest my_reports/ reports.parquet

      docintel run reports.parquet out/
    """
    from docintel.pipeline.input.ingest import DEFAULT_PATTERNS, ingest_folder

    bar = _files_bar(progress)
    task = bar.add_task("ingest", total=None)
    try:
        with bar:
            result = ingest_folder(
                folder,
                output,
                pattern or list(DEFAULT_PATTERNS),
                max_file_bytes=max_file_mib * 1024 * 1024,
                on_file=lambda done, total: bar.update(task, completed=done, total=total),
                encoding=encoding,
            )
    except DocintelError as e:
        fail(e)
    _print_ingested(result, output)


def _files_bar(progress: bool) -> Progress:
    """ingest's progress bar (files done of total), on a terminal or when asked for."""
    show = progress and (sys.stderr.isatty() or bool(os.environ.get(PROGRESS_ENV)))
    return Progress(
        TextColumn("[bold]ingest"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("files"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not show,
        transient=True,
    )


def _print_ingested(result: IngestResult, output: Path) -> None:
    """What ingest wrote and skipped. File names, ids and reasons (which quote paths) are
    data: no markup, and no control character reaches the terminal (``safe``)."""
    notes = [f"{n:,} decoded as {enc}" for enc, n in sorted(result.encodings.items())]
    if result.guessed:
        notes.append(f"{len(result.guessed):,} with a guessed encoding, listed on stderr")
    if result.lossy:
        notes.append(f"{len(result.lossy):,} decoded lossily, listed on stderr")
    note = f" ({'; '.join(notes)})" if notes else ""
    out.print(f"wrote {result.documents:,} documents to {safe(output)}{note}", markup=False)
    for doc_id, encoding in result.guessed:
        console.print(
            f"warning: {safe(doc_id)}: not UTF-8; decoded as {encoding}, a guessed "
            "encoding; check its text, or pass --encoding",
            markup=False,
            highlight=False,
        )
    for doc_id in result.lossy:
        console.print(
            f"warning: {safe(doc_id)}: decoded lossily (bytes its encoding does not map "
            "became U+FFFD); pass --encoding if it is wrong",
            markup=False,
            highlight=False,
        )
    if result.skipped:
        out.print(f"[yellow]skipped {len(result.skipped):,} files:[/]", highlight=False)
    for s in result.skipped:
        line = f"  {safe(s.doc_id)}: {safe(s.reason)}"
        out.print(line, highlight=False, soft_wrap=True, markup=False)
