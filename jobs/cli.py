"""`docintel`: run the pipeline locally, train and evaluate the classifier, ingest text files.

Exit codes: 0 the command completed (per-document errors are rows, counted in the
summary); 1 the run failed; 2 bad usage or configuration, reported before any work;
3 the run completed but was partial: some input files were unreadable and skipped
(named in the summary and in the manifest's ``skipped_files``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from pipeline.config import load_config
from pipeline.errors import DocintelError, UsageError

app = typer.Typer(
    name="docintel",
    help=(
        "Batch document intelligence on Ray: Parquet documents -> sentences (spaCy) -> "
        "embeddings (PyTorch BERT) -> labels (Keras) -> Parquet tables.\n\n"
        "Example:  docintel run data/demo/documents.parquet out/"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
out = Console()

EXAMPLE_CONFIG = "docintel.example.toml"
EXIT_PARTIAL = 3  # completed, but unreadable input files were skipped


def _fail(e: Exception) -> None:
    code = 2 if isinstance(e, UsageError) else 1
    kind = "usage error" if code == 2 else "run failed"
    console.print(f"[bold red]docintel: {kind}:[/] {escape(str(e))}", highlight=False)
    raise typer.Exit(code)


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


@app.command()
def run(
    input: Annotated[
        str,
        typer.Argument(
            help="Parquet file, folder of Parquet files, glob ('data/*.parquet') or s3://prefix."
        ),
    ],
    output: Annotated[
        str,
        typer.Argument(
            help="Output folder or s3://prefix; gets documents/, sentences/, errors/ and "
            "_manifest.json (written last)."
        ),
    ],
    config: ConfigOpt = None,
    id_column: Annotated[str | None, typer.Option(help="Column with unique document ids.")] = None,
    text_column: Annotated[str | None, typer.Option(help="Column with the document text.")] = None,
    run_id: Annotated[
        str | None,
        typer.Option(help="Name of the run. Rerun with the same id to resume an interrupted run."),
    ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Documents per batch.")] = None,
    embeddings: Annotated[
        bool | None,
        typer.Option(
            "--embeddings/--no-embeddings", help="Write the embedding column in sentences/."
        ),
    ] = None,
    spill: Annotated[
        str | None,
        typer.Option(
            help="auto (GPU replicas first, spill to CPU replicas when they are saturated), "
            "gpu-only, cpu-only, or off (no spill).",
        ),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(
            help="GPUs declared to the embedded local Ray; logical ones work on machines "
            "without GPUs (GPU replicas then run on the CPU as gpu-sim).",
        ),
    ] = None,
    num_cpus: Annotated[
        int | None, typer.Option(help="CPUs for the embedded local Ray (default: all cores).")
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="Join a running Ray cluster ('auto' or ray://host:10001) instead of starting "
            "an embedded one."
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a live progress bar.")] = True,
) -> None:
    """Run the pipeline over INPUT and write the result tables to OUTPUT.

    Examples:

      docintel run data/demo/documents.parquet out/demo

      docintel run corpus/ out/run1 --text-column body --id-column uuid --run-id run1

      docintel run corpus/ out/run1 --run-id run1     # resume after a crash
    """
    from jobs.run import execute

    try:
        cfg = load_config(
            config,
            {
                "input.id_column": id_column,
                "input.text_column": text_column,
                "run.run_id": run_id,
                "run.batch_size": batch_size,
                "run.embeddings": embeddings,
                "run.num_cpus": num_cpus,
                "run.spill": spill,
                "run.num_gpus": gpus,
                "run.ray_address": ray_address,
                "run.show_progress": None if progress else False,
            },
        )
        summary = _run_with_progress(execute, cfg, input, output)
    except DocintelError as e:
        _fail(e)
        return
    _print_summary(summary)
    if summary.partial:
        console.print(
            f"[bold yellow]docintel: partial run:[/] {len(summary.skipped_files)} input "
            "file(s) were unreadable and skipped (listed above and in _manifest.json "
            "skipped_files); exit code 3",
            highlight=False,
        )
        raise typer.Exit(EXIT_PARTIAL)


def _run_with_progress(execute: Any, cfg: Any, input: str, output: str) -> Any:
    show = (cfg.run.show_progress and sys.stderr.isatty()) or os.environ.get("DOCINTEL_PROGRESS")
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} docs"),
        TextColumn("{task.fields[sentences]:,} sentences"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not show,
        transient=False,
    )
    state = {"task": None, "t0": time.perf_counter(), "docs": 0, "sents": 0}

    def on_start(total: int, done: int) -> None:
        state["t0"] = time.perf_counter()
        state["task"] = progress.add_task(
            "docintel", total=total, completed=done, sentences=0, rate=""
        )

    def on_batch(stats: Any) -> None:
        state["docs"] += stats.documents
        state["sents"] += stats.sentences
        dt = max(1e-9, time.perf_counter() - state["t0"])
        rate = f"{state['docs'] / dt:,.1f} docs/s {state['sents'] / dt:,.1f} sent/s"
        progress.update(state["task"], advance=stats.documents, sentences=state["sents"], rate=rate)

    with progress:
        return execute(cfg, input, output, on_start=on_start, on_batch=on_batch)


def _print_summary(s: Any) -> None:
    if s.already_complete:
        out.print(
            f"run {s.run_id} in {s.output} is already complete: nothing to do "
            f"({s.documents:,} documents, {s.sentences:,} sentences, {s.errors:,} errors)"
        )
        return
    for w in s.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    t = Table(title=f"docintel run {s.run_id}", show_header=False)
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
        t.add_row(
            f"{stage} batches by backend", ", ".join(f"{b}: {n}" for b, n in sorted(counts.items()))
        )
    t.add_row("output", s.output)
    out.print(t)


@app.command()
def train(
    data: Annotated[
        Path,
        typer.Argument(
            help="Labelled CSV or Parquet with text,label columns.", exists=True, dir_okay=False
        ),
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the classifier.")],
    config: ConfigOpt = None,
    label_names: Annotated[
        str | None,
        typer.Option(help="Names for integer labels 0,1,2,... (e.g. Bearish,Bullish,Neutral)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed (split and weights).")] = 0,
) -> None:
    """Train the Keras classifier head on embeddings of a labelled file.

    Holds out a stratified 10% for early stopping and metrics; writes model.keras,
    labels.json, training.json and metrics.json to --out.

    Example:

      docintel train data/twitter_fin_sentiment/sent_train.csv --out models/finsent
      --label-names Bearish,Bullish,Neutral
    """
    from pipeline.train import train as do_train

    try:
        cfg = load_config(config)
        names = [n.strip() for n in label_names.split(",")] if label_names else None
        with console.status("embedding texts and training the head"):
            m = do_train(data, out_dir, cfg.embed, names, seed=seed)
    except DocintelError as e:
        _fail(e)
        return
    _print_metrics(m, f"held-out split of {data.name} -> {out_dir}")


@app.command()
def evaluate(
    model_dir: Annotated[Path, typer.Argument(help="Classifier folder written by `train`.")],
    data: Annotated[
        Path,
        typer.Argument(help="Labelled CSV or Parquet (text,label).", exists=True, dir_okay=False),
    ],
    config: ConfigOpt = None,
    label_names: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated names for integer labels (default: the model's label order)."
        ),
    ] = None,
) -> None:
    """Print accuracy, macro-F1, per-class scores and the confusion matrix on DATA.

    Example:

      docintel evaluate models/finsent data/twitter_fin_sentiment/sent_valid.csv
    """
    from pipeline.train import evaluate as do_evaluate

    try:
        cfg = load_config(config)
        names = [n.strip() for n in label_names.split(",")] if label_names else None
        with console.status("embedding and classifying"):
            m = do_evaluate(model_dir, data, cfg.embed, names)
    except DocintelError as e:
        _fail(e)
        return
    _print_metrics(m, f"{model_dir} on {data.name}")


def _print_metrics(m: dict[str, Any], title: str) -> None:
    t = Table(
        title=f"{title}: accuracy {m['accuracy']:.4f}, macro-F1 {m['macro_f1']:.4f} (n={m['n']:,})"
    )
    for col in ("label", "precision", "recall", "F1", "support"):
        t.add_column(col, justify="left" if col == "label" else "right")
    for name, c in m["per_class"].items():
        t.add_row(
            name,
            f"{c['precision']:.3f}",
            f"{c['recall']:.3f}",
            f"{c['f1']:.3f}",
            f"{c['support']:,}",
        )
    out.print(t)
    cm = m["confusion_matrix"]
    c = Table(title="confusion matrix (rows: true, columns: predicted)")
    c.add_column("")
    for name in cm["labels"]:
        c.add_column(name, justify="right")
    for name, row in zip(cm["labels"], cm["rows_true_cols_pred"], strict=True):
        c.add_row(name, *(f"{v:,}" for v in row))
    out.print(c)


@app.command()
def quantize(
    config: ConfigOpt = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="int8 folder (default: \\[embed] int8_dir, i.e. "
            "models/int8/<encoder version>/); the classifier goes to "
            "OUT/classify/<classifier version>.int8.onnx.",
        ),
    ] = None,
    data: Annotated[
        Path,
        typer.Option(help="Labelled CSV/Parquet for the parity report."),
    ] = Path("data/twitter_fin_sentiment/sent_valid.csv"),
) -> None:
    """Build the int8 CPU encoder and classifier offline, with a parity report against fp32.

    Exports the configured encoder to ONNX and quantizes it (ONNX Runtime dynamic int8,
    per-channel weights, FFN output projections kept fp32); rebuilds the configured Keras
    classifier as ONNX from its weights and quantizes it the same way (runs without
    TensorFlow). Then measures, on DATA, the encoder's embedding cosines to fp32 and the
    macro-F1 of int8 encoder, int8 classifier and both together against fp32 + fp32;
    writes parity.json in the int8 folder. CPU replicas of a spill layout load both.

    Example:

      docintel quantize && docintel run corpus/ out/ --gpus 1 --config gpu.toml
    """
    import json

    from pipeline.quantize import (
        INT8_MODEL_FILE,
        PARITY_FILE,
        build_int8,
        build_int8_classifier,
        parity_report,
    )

    try:
        cfg = load_config(config)
        target = out_dir or cfg.embed.resolved_int8_dir()
        clf_dir = cfg.classify.resolved_model_dir()
        with console.status(f"exporting and quantizing {cfg.embed.resolved_model_path()}"):
            build_int8(cfg.embed.resolved_model_path(), target)
        with console.status(f"converting and quantizing {clf_dir}"):
            head = build_int8_classifier(clf_dir, target)
        with console.status(f"parity report on {data}"):
            report = parity_report(target, cfg.embed, clf_dir, data)
    except DocintelError as e:
        _fail(e)
        return
    (target / PARITY_FILE).write_text(json.dumps(report, indent=2) + "\n")
    enc, clf, both = report["encoder"], report["classifier"], report["end_to_end"]
    t = Table(
        title=f"int8 vs fp32 on {data.name} (n={report['n']:,}; "
        f"fp32 + fp32 macro-F1 {report['macro_f1_fp32']:.4f})"
    )
    for col in ("int8", "macro-F1", "drop", "labels agree"):
        t.add_column(col, justify="left" if col == "int8" else "right")
    for name, part in (("encoder", enc), ("classifier", clf), ("both", both)):
        t.add_row(
            name,
            f"{part['macro_f1_int8']:.4f}",
            f"{part['macro_f1_drop']:+.4f}",
            f"{part['labels_agree']:.2%}",
        )
    out.print(t)
    out.print(
        f"encoder embeddings: cosine to fp32 mean {enc['cosine_mean']:.4f}, "
        f"min {enc['cosine_min']:.4f}; classifier probabilities: max difference "
        f"{clf['max_prob_diff']:.4f}"
    )
    out.print(f"wrote {target / INT8_MODEL_FILE}, {head} and {target / PARITY_FILE}")


@app.command()
def ingest(
    folder: Annotated[
        Path,
        typer.Argument(
            help="Folder of .txt / .md files (searched recursively).", exists=True, file_okay=False
        ),
    ],
    output: Annotated[Path, typer.Argument(help="Parquet file to write.", dir_okay=False)],
    pattern: Annotated[
        list[str] | None,
        typer.Option("--pattern", help="Glob(s) of files to take (default: *.txt and *.md)."),
    ] = None,
) -> None:
    """Turn a folder of text files into a documents Parquet file (doc_id, text).

    doc_id is the file's path relative to FOLDER; text is its content decoded as UTF-8
    (undecodable bytes are replaced and counted).

    Example:

      docintel ingest my_reports/ reports.parquet && docintel run reports.parquet out/
    """
    from pipeline.ingest import ingest_folder

    try:
        n, replaced = ingest_folder(folder, output, pattern or ["*.txt", "*.md"])
    except DocintelError as e:
        _fail(e)
        return
    out.print(
        f"wrote {n:,} documents to {output}"
        + (f" ({replaced} with undecodable bytes replaced)" if replaced else "")
    )


# Commands defined in their own modules register themselves on `app` when imported.
from jobs import cli_audit, cli_jobs  # noqa: E402, F401


def main() -> None:
    app()


if __name__ == "__main__":
    # Run as `python -m jobs.cli`, this file is `__main__`, while the command modules
    # imported above registered on the `app` of the module `jobs.cli`: use that one.
    from jobs.cli import main as _main

    _main()
