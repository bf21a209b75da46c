"""`docintel submit`, `status` and `logs`: Ray Jobs API commands.

The logic (staging, the Jobs SDK, mapping a job's state to an exit code) is in
docintel.jobs.submit; this module is options, help and printing. Ray is imported inside
the commands, so `docintel --help` stays fast. Exit codes: 0 the job succeeded (or, for
`status`, is still pending or running); a failed job's own exit code when Ray reports it
(1 run failed, 2 usage error on the cluster, 3 partial), else 1; 1 a stopped job; 2 bad
usage here (config, address, unknown job id), reported before anything is submitted.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from docintel.jobs.ui import ConfigOpt, console, fail, out, safe
from docintel.pipeline.errors import DocintelError
from docintel.pipeline.exitcodes import ExitCode

if TYPE_CHECKING:
    from collections.abc import Callable

    from ray.job_submission import JobDetails, JobSubmissionClient

    from docintel.jobs.submit import Failure, JobRequest, StagedDir

AddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="The cluster's Ray dashboard (Jobs API), e.g. http://HEAD:8265. Default: the "
        "RAY_ADDRESS environment variable, else http://127.0.0.1:8265.",
        show_default=False,
    ),
]
JobIdArg = Annotated[
    str, typer.Argument(help="Job id printed by `docintel submit` (raysubmit_...).")
]
StatusJobIdArg = Annotated[
    str | None,
    typer.Argument(
        help="Job id printed by `docintel submit` (raysubmit_...). Default: list the "
        "cluster's recent jobs.",
        show_default=False,
    ),
]


JobInputOpt = Annotated[
    str | None,
    typer.Option(
        help="Parquet file, folder, glob or s3:// prefix, read ON THE CLUSTER "
        "(default: the config's \\[job] input). Use s3:// or a path every node sees."
    ),
]
JobOutputOpt = Annotated[
    str | None,
    typer.Option(
        help="Output folder or s3:// prefix, written ON THE CLUSTER (default: the "
        "config's \\[job] output)."
    ),
]
JobRunIdOpt = Annotated[
    str | None,
    typer.Option(
        help="Run id; resubmit with the same id to resume an interrupted run. Default: "
        "\\[run] run_id, else a new id."
    ),
]
WaitOpt = Annotated[
    bool,
    typer.Option(
        "--wait/--no-wait",
        help="Follow the job's logs and exit with its outcome, or print the job id "
        "and return at once (then: docintel status / logs).",
    ),
]
WorkingDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--working-dir",
        help="Ship this project source folder with the job (never secrets such as .env, "
        "keys or credential files, whatever .gitignore says, nor symlinks, .venv, .git, "
        "tests, bench, outputs, caches; at most \\[job] max_working_dir_mb; --dry-run "
        "lists it), its code laid out as the docintel.* namespace, for clusters "
        "whose nodes have the dependencies but not this code. Default: ship only the "
        "config; the cluster's image has docintel installed (infra/).",
        exists=True,
        file_okay=False,
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Check the config and list what the job's working directory would hold, one "
        "line per path: 'ship PATH' or 'left out PATH (reason)', then the code the config "
        "makes the job import: 'imports MODULE (why)'; submit nothing and contact no "
        "cluster.",
    ),
]
FollowOpt = Annotated[
    bool,
    typer.Option("--follow", "-f", help="Keep streaming new output until the job ends."),
]


def _write(chunk: str) -> None:
    """Job log text goes to stdout without Rich markup parsing and with its control
    characters made visible (a log line must not drive the terminal: colours, cursor
    moves, window titles, overwritten lines)."""
    sys.stdout.write(safe(chunk, multiline=True))
    sys.stdout.flush()


def submit(
    config: ConfigOpt = None,
    address: AddressOpt = None,
    input: JobInputOpt = None,
    output: JobOutputOpt = None,
    run_id: JobRunIdOpt = None,
    wait: WaitOpt = True,
    working_dir: WorkingDirOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Run the pipeline on a Ray cluster as a Ray job (`python -m docintel.jobs.batch`).

    The config is checked here first (bad config: exit 2, nothing submitted), then sent
    as job.toml in the job's working directory. The job runs the same run function as
    `docintel run` and joins the cluster; nothing is pip-installed at run time, so the
    cluster's image must have docintel installed (infra/Dockerfile.cpu) unless
    --working-dir ships the source. Prints the job id, then follows the job's logs;
    the exit code is the job's: 0 succeeded, a failed job's own code (1 failed, 2
    usage, 3 partial), 1 stopped.

    Examples:

      docintel submit --address http://head:8265 --config infra/config/job.toml

      docintel submit -c infra/config/job.toml --run-id r1 --no-wait

      docintel submit -c infra/config/job.toml --working-dir . --input s3://docs/

      docintel submit -c infra/config/job.toml --working-dir . --dry-run
    """
    from docintel.jobs import submit as jobs

    try:
        req = jobs.check_request(config, input, output, run_id, working_dir)
        addr = jobs.resolve_address(address)
        if dry_run:
            _dry_run(req)
            return
        jobs.check_size(req, jobs.plan_job(req))  # over the cap: exit 2, no cluster asked
        client = jobs.connect(addr)
        with tempfile.TemporaryDirectory(prefix="docintel-job-") as staging:
            job_id = jobs.submit(client, req, Path(staging), _say_shipped(req))
    except DocintelError as e:
        fail(e)
    out.print(f"submitted job {safe(job_id)} to {safe(addr)}", highlight=False, markup=False)
    console.print(f"entrypoint: {safe(req.entrypoint)}", highlight=False, markup=False)
    if not wait:
        out.print(
            f"follow it with: docintel logs {safe(job_id)} --follow --address {safe(addr)}",
            highlight=False,
            markup=False,
        )
        return
    _follow_to_end(client, job_id)


def _dry_run(req: JobRequest) -> None:
    """List the working directory's fate, path by path, and the code the config makes the
    job import (stdout), then a summary (stderr); over the size cap: exit 2."""
    from docintel.jobs import submit as jobs

    plan = jobs.plan_job(req)
    for path in plan.ship:
        out.print(f"ship {safe(path)}", highlight=False, markup=False, soft_wrap=True)
    for left in plan.left_out:
        line = f"left out {safe(left.path)} ({safe(left.reason)})"
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    for module, why in jobs.job_imports(req.config):  # code the config makes the job load
        line = f"imports {safe(module)} ({safe(why)})"
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    source = f"{safe(plan.root)} and " if plan.root is not None else ""
    cap = req.config.job.max_working_dir_mb
    console.print(
        f"dry run: {len(plan.ship):,} files would ship ({source}the config as "
        f"{jobs.JOB_CONFIG_NAME}), {plan.bytes / jobs.MB:,.2f} MB (cap {cap:g} MB), "
        f"{len(plan.left_out):,} paths left out; nothing submitted",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    jobs.check_size(req, plan)  # over the cap: exit 2, as the real submit would


def _say_shipped(req: JobRequest) -> Callable[[StagedDir], None]:
    def say(staged: StagedDir) -> None:
        if req.working_dir is not None:
            console.print(
                f"shipping {safe(req.working_dir)}: {safe(staged.describe())}",
                highlight=False,
                markup=False,
            )

    return say


def _follow_to_end(client: JobSubmissionClient, job_id: str) -> None:
    """Stream the logs until the job ends, report how, exit with the job's code."""
    from docintel.jobs import submit as jobs

    try:
        problem = jobs.follow_logs(client, job_id, _write)
        if problem:
            console.print(f"[yellow]warning:[/] {escape(safe(problem))}", highlight=False)
        info = jobs.wait_terminal(client, job_id)
    except KeyboardInterrupt:
        console.print(
            f"\nstopped following; job {safe(job_id)} keeps running: "
            f"docintel status {safe(job_id)}",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    except DocintelError as e:
        fail(e)
    _report_end(client, info)
    raise typer.Exit(jobs.exit_code(info))


def _report_end(client: JobSubmissionClient, info: JobDetails) -> None:
    from docintel.jobs import submit as jobs

    job = escape(safe(info.submission_id or info.job_id))
    status = str(info.status)
    if status == "SUCCEEDED":
        console.print(f"[bold green]job {job} SUCCEEDED[/]", highlight=False)
        return
    code = jobs.exit_code(info)
    why = jobs.failure(client, info)
    console.print(
        f"[bold red]docintel: job {job} {status}[/] (exit code {code}): "
        f"{escape(safe(why.reason, multiline=True))}",
        highlight=False,
    )
    _print_failure(why)


def _print_failure(why: Failure) -> None:
    """A failed job's last log lines and, for a known cause, what to do (log text is
    data: no markup, control characters made visible)."""
    if why.last_lines:
        console.print("last lines of the job's log:", highlight=False, markup=False)
        for line in why.last_lines:
            console.print(f"  {safe(line)}", highlight=False, markup=False)
    if why.hint:
        console.print(f"hint: {why.hint}", highlight=False, markup=False)


def status(job_id: StatusJobIdArg = None, address: AddressOpt = None) -> None:
    """Show a submitted job's state, entrypoint, start/end times and message; for a
    failed job, the last lines of its log. Without a job id, list the recent jobs.

    The exit code mirrors the job: 0 pending, running or succeeded; a failed job's own
    exit code (1 failed, 2 usage error, 3 partial) or 1; 1 stopped. An unknown job id
    is exit 2.

    Examples:

      docintel status raysubmit_4LamXRuQpYdSMg7J --address http://head:8265

      docintel status --address http://head:8265      # the recent jobs
    """
    from docintel.jobs import submit as jobs

    try:
        client = jobs.connect(jobs.resolve_address(address))
        if job_id is None:
            _list_jobs(jobs.recent_jobs(client))
            return
        info = jobs.job_info(client, job_id)
    except DocintelError as e:
        fail(e)
    t = Table(title=f"docintel job {escape(safe(job_id))}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", overflow="fold")
    t.add_row("status", str(info.status))
    t.add_row("entrypoint", Text(safe(info.entrypoint)))  # user data: never markup
    t.add_row("started", jobs.format_time(info.start_time))
    t.add_row("ended", jobs.format_time(info.end_time))
    if info.driver_exit_code is not None:
        t.add_row("entrypoint exit code", str(info.driver_exit_code))
    message = jobs.failure_reason(info) if str(info.status) == "FAILED" else info.message
    t.add_row("message", Text(safe(message or "-", multiline=True)))
    out.print(t, highlight=False)
    if str(info.status) in ("FAILED", "STOPPED"):
        _print_failure(jobs.failure(client, info))
    raise typer.Exit(jobs.exit_code(info))


def _list_jobs(infos: list[JobDetails]) -> None:
    """The recent jobs, newest first: id, state, start, end, entrypoint."""
    from docintel.jobs import submit as jobs

    if not infos:
        out.print("the cluster has no jobs yet", highlight=False, markup=False)
        return
    t = Table(title=f"recent jobs (newest first, at most {jobs.RECENT_JOBS})")
    for col in ("job id", "status", "started", "ended", "entrypoint"):
        t.add_column(col, overflow="fold")
    for info in infos:
        job = info.submission_id or info.job_id or "-"
        start, end = jobs.format_time(info.start_time), jobs.format_time(info.end_time)
        t.add_row(Text(safe(job)), str(info.status), start, end, Text(safe(info.entrypoint)))
    out.print(t, highlight=False)


def logs(job_id: JobIdArg, address: AddressOpt = None, follow: FollowOpt = False) -> None:
    """Print a submitted job's log (its entrypoint's stdout and stderr).

    An unknown job id is exit 2.

    Examples:

      docintel logs raysubmit_4LamXRuQpYdSMg7J --address http://head:8265

      docintel logs raysubmit_4LamXRuQpYdSMg7J --follow
    """
    from docintel.jobs import submit as jobs

    try:
        client = jobs.connect(jobs.resolve_address(address))
        if not follow:
            _write(jobs.job_logs(client, job_id))
            return
        jobs.job_info(client, job_id)  # unknown id: a clear exit 2, not a socket error
        problem = jobs.follow_logs(client, job_id, _write)
    except DocintelError as e:
        fail(e)
    except KeyboardInterrupt:
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    if problem:
        console.print(f"[yellow]warning:[/] {escape(safe(problem))}", highlight=False)
