"""`docintel`: the command line. This module builds the app and registers the commands
defined in the cli_* modules; it holds no command itself.

Exit codes (docintel.pipeline.exitcodes): 0 the command completed (per-document errors are
rows, counted in the summary); 1 the run failed; 2 bad usage or configuration, reported
before any work; 3 the run completed but was partial: some input files were unreadable
and skipped (named in the summary and in the manifest's ``skipped_files``).
"""

from __future__ import annotations

from typing import Annotated

import typer

from docintel.jobs import cli_audit, cli_jobs, cli_models, cli_run, cli_search
from docintel.jobs.ui import command

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
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"docintel {version('docintel')}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    del show_version  # handled by its callback


for _fn in (
    cli_run.run,
    cli_models.train,
    cli_models.evaluate,
    cli_models.quantize,
    cli_run.ingest,
    cli_audit.audit,
    cli_search.search,
    cli_search.index,
    cli_jobs.submit,
    cli_jobs.status,
    cli_jobs.logs,
):
    command(app, _fn)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
