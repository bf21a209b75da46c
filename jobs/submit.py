"""Submitting docintel batch runs as Ray jobs and following them (the Jobs SDK side).

`docintel submit / status / logs` (jobs/cli_jobs.py) are thin wrappers over this module,
so the CLI stays about options and printing while everything that talks to the cluster's
Jobs API, stages the job's files and maps job states to exit codes lives here.

The job runs ``python -m docintel.jobs.batch`` on the cluster (jobs/batch.py), which calls the
same run function as `docintel run`. By default the job's working directory holds nothing but
the config (as ``job.toml``): the cluster's image must have docintel installed (see
infra/Dockerfile.cpu); nothing is pip-installed at run time (docs/design.md, anti-patterns).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import shlex
import shutil
import socket
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from docintel.jobs.workdir import LeftOut, Plan, copy_plan, plan_working_dir
from docintel.pipeline.config import Config, load_config
from docintel.pipeline.errors import RunFailed, UsageError
from docintel.pipeline.exitcodes import ExitCode

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

# Where `docintel submit` looks for the cluster when neither --address nor RAY_ADDRESS
# says: the dashboard of a head started on this machine (`ray start --head`).
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
DASHBOARD_PORT = 8265  # Ray's default dashboard port, for an address given without one
# The config travels to the cluster under this name, in the job's working directory.
JOB_CONFIG_NAME = "job.toml"
# A reachable dashboard accepts a TCP connection at once; a dead or firewalled address
# would otherwise hang in the SDK's first request for minutes before any message.
CONNECT_TIMEOUT_S = 10.0
# How often the final job state is polled once the log stream has ended.
POLL_S = 0.5
# After the log stream ends the job is terminal within moments; this bounds the wait for
# the state to be recorded before we keep polling at a slower pace.
SETTLE_S = 30.0
LEFT_OUT_SHOWN = 10  # paths named in `docintel submit`'s "left out" line; the rest counted
# A failed job's summary shows this many last lines of its log (from its last traceback
# when that starts within them); `docintel logs` shows the whole log.
LOG_TAIL_LINES = 15
RECENT_JOBS = 20  # `docintel status` without an id lists this many, newest first
MISSING_DOCINTEL = "No module named 'docintel'"
MISSING_DOCINTEL_HINT = (
    "the cluster's Python has no docintel installed: run the cluster on the image built "
    "from infra/ (infra/Dockerfile.cpu), or ship this source tree with the job: "
    "docintel submit --working-dir . (its nodes then need docintel's dependencies only)"
)


class ClusterUnreachable(UsageError):
    """No Ray dashboard (Jobs API) answers at the given address."""


class ClusterAuthError(UsageError):
    """The cluster requires a token (Ray's token authentication) that we lack or is wrong."""


class UnknownJob(UsageError):
    """The cluster has no job with this id."""


def resolve_address(address: str | None) -> str:
    """--address, else RAY_ADDRESS, else the local default; ``host:port`` gets http://."""
    addr = (address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS).strip()
    if addr.startswith("ray://"):
        raise UsageError(
            f"{addr} is a Ray Client address; job submission talks to the dashboard: "
            f"give --address http://HEAD:{DASHBOARD_PORT}"
        )
    return addr if "://" in addr else f"http://{addr}"


def _probe(address: str) -> None:
    """Fail fast, naming the address, when nothing listens there."""
    parts = urlsplit(address)
    default_port = 443 if parts.scheme == "https" else DASHBOARD_PORT
    try:
        host, port = parts.hostname, parts.port or default_port
    except ValueError as e:  # a port that is not a number
        raise UsageError(f"--address {address} is not a valid URL: {e}") from e
    if not host or parts.scheme not in {"http", "https"}:
        raise UsageError(
            f"--address {address} is not an http(s) URL; give the head's dashboard, "
            f"e.g. http://HEAD:{DASHBOARD_PORT}"
        )
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ClusterUnreachable(
            f"cannot reach the Ray dashboard at {address} ({e.strerror or e}); check that "
            "the head is running and its dashboard is reachable from here: forward it "
            "(`kubectl port-forward svc/HEAD-svc 8265`, or `ray dashboard CLUSTER.yaml`) and "
            "pass --address http://127.0.0.1:8265, or set RAY_ADDRESS"
        ) from e


def connect(address: str) -> JobSubmissionClient:
    """A Jobs API client for the dashboard at ``address`` (already resolved)."""
    import requests
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    _probe(address)
    try:
        return JobSubmissionClient(address)
    except AuthenticationError as e:
        reason = str(e).splitlines()[0]
        raise ClusterAuthError(
            f"the Ray cluster at {address} requires token authentication ({reason}): "
            "export RAY_AUTH_MODE=token and give the cluster's token in RAY_AUTH_TOKEN, or "
            "in a file named by RAY_AUTH_TOKEN_PATH (default ~/.ray/auth_token)"
        ) from e
    except (ConnectionError, requests.RequestException) as e:
        raise ClusterUnreachable(
            f"cannot reach the Ray Jobs API at {address}: {e}; check the address"
        ) from e
    except RuntimeError as e:  # a server that is not a Ray dashboard, or too old
        raise ClusterUnreachable(f"{address} does not serve Ray's Jobs API: {e}") from e


@dataclass(frozen=True)
class JobRequest:
    """What `docintel submit` sends: validated locally before the cluster is contacted."""

    config: Config
    config_path: Path | None
    input: str | None  # --input (else the config's [job] input, read on the cluster)
    output: str | None
    run_id: str | None
    working_dir: Path | None  # --working-dir: project source to ship with the job

    @property
    def entrypoint(self) -> str:
        """The shell command the cluster runs; flags only for what the user passed."""
        args = ["python", "-m", "docintel.jobs.batch", "--config", JOB_CONFIG_NAME]
        for flag, value in (("--input", self.input), ("--output", self.output)):
            if value:
                args += [flag, value]
        if self.run_id:
            args += ["--run-id", self.run_id]
        return shlex.join(args)


def _is_relative_local(uri: str) -> bool:
    return "://" not in uri and not Path(uri).expanduser().is_absolute()


def check_request(
    config_path: Path | None,
    input: str | None,
    output: str | None,
    run_id: str | None,
    working_dir: Path | None,
) -> JobRequest:
    """Validate the job locally (exit 2 before any network): config, input, output."""
    overrides = {"job.input": input, "job.output": output, "run.run_id": run_id}
    cfg = load_config(config_path, overrides)
    where = f"in {config_path}" if config_path else "(no --config given)"
    for key, value in (("input", cfg.job.input), ("output", cfg.job.output)):
        if not value:
            raise UsageError(f"the job has no {key}: pass --{key} URI or set [job] {key} {where}")
        if working_dir is None and _is_relative_local(value):
            raise UsageError(
                f"the job's {key} {value!r} is a relative path, but the job runs in a "
                "temporary working directory on the cluster: give an absolute path that "
                "every node sees, or an s3:// URI (relative paths are only meaningful "
                "with --working-dir, relative to that folder)"
            )
    return JobRequest(cfg, config_path, input, output, run_id, working_dir)


@dataclass
class StagedDir:
    """What --working-dir ships: the staged folder, and what went in or was left out."""

    path: Path
    files: int = 0
    bytes: int = 0
    left_out: list[str] = field(default_factory=list)

    def describe(self) -> str:
        shown = ", ".join(self.left_out[:LEFT_OUT_SHOWN])
        more = len(self.left_out) - LEFT_OUT_SHOWN
        extra = f" and {more} more" if more > 0 else ""
        left = f"; left out: {shown}{extra}" if self.left_out else ""
        return f"{self.files:,} files, {self.bytes / 1e6:,.1f} MB{left}"


def _package_dirs(root: Path) -> dict[str, str]:
    """The source folders of the ``docintel.*`` packages, from the shipped pyproject.toml."""
    try:
        with (root / "pyproject.toml").open("rb") as f:
            mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as e:
        raise UsageError(
            f"--working-dir {root} is not a docintel source folder: its pyproject.toml "
            f"has no [tool.setuptools] package-dir ({e}); give the repository root"
        ) from e
    return {pkg: folder for pkg, folder in mapping.items() if pkg.startswith("docintel.")}


def plan_job(req: JobRequest) -> Plan:
    """What the job's working directory would hold, decided without copying anything:
    the --working-dir files that ship and those left out, with reasons (jobs/workdir.py),
    plus the config as job.toml. A job.toml of the folder is replaced by the config."""
    if req.working_dir is None:
        return Plan(None, ship=[JOB_CONFIG_NAME])
    root = req.working_dir.resolve()
    _package_dirs(root)  # a docintel source folder, or a usage error now
    plan = plan_working_dir(root)
    if JOB_CONFIG_NAME in plan.ship:
        plan.ship.remove(JOB_CONFIG_NAME)
        plan.bytes -= (root / JOB_CONFIG_NAME).lstat().st_size
        plan.left_out.append(LeftOut(JOB_CONFIG_NAME, "replaced by the job's config"))
    plan.ship.append(JOB_CONFIG_NAME)
    return plan


MB = 1_000_000  # [job] max_working_dir_mb and the sizes printed are in 10^6 bytes


def max_ship_bytes(req: JobRequest) -> int:
    """The most bytes --working-dir may ship: ``[job] max_working_dir_mb``."""
    return int(req.config.job.max_working_dir_mb * MB)


def check_size(req: JobRequest, plan: Plan) -> None:
    """UsageError (exit 2) naming the cap and the size when ``plan`` ships more than
    ``[job] max_working_dir_mb``: checked before anything is copied or uploaded."""
    cap = req.config.job.max_working_dir_mb
    if plan.root is None or plan.bytes <= max_ship_bytes(req):
        return
    where = f"in {req.config_path}" if req.config_path else "in the config (--config)"
    raise UsageError(
        f"--working-dir {plan.root} would ship {plan.bytes / MB:,.2f} MB, over the cap of "
        f"{cap:g} MB ([job] max_working_dir_mb); list large files in its .rayignore "
        "(`docintel submit --dry-run` shows what ships), keep data on s3://, or raise "
        f"[job] max_working_dir_mb {where}"
    )


def job_imports(cfg: Config) -> list[tuple[str, str]]:
    """(module, why) for the code outside docintel that the job's config makes it load,
    in config order: the module of each ``module:Class`` entry of ``[pipeline] stages``,
    the module an entry point name of the group ``docintel.stages`` points to (as
    installed here; the cluster's installed one decides), and the spaCy pipeline of
    ``[sentencize] spacy_model`` unless it is a blank one. Nothing is imported."""
    import importlib.metadata

    from docintel.pipeline.registry import BUILTIN_NAMES, ENTRY_POINT_GROUP

    found: list[tuple[str, str]] = []
    for entry in cfg.pipeline.stages:
        if entry in BUILTIN_NAMES:
            continue
        if ":" in entry:
            found.append((entry.partition(":")[0], f"stage {entry}, [pipeline] stages"))
            continue
        points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=entry)
        module = next(iter(points)).module if points else entry
        where = "" if points else "; not installed here, the cluster's decides"
        found.append((module, f"stage entry point {entry!r}, [pipeline] stages{where}"))
    spacy_model = cfg.sentencize.spacy_model
    if not spacy_model.startswith("blank:"):
        found.append((spacy_model, "spaCy pipeline, [sentencize] spacy_model"))
    return found


def stage_working_dir(req: JobRequest, dest: Path) -> StagedDir:
    """Fill ``dest`` with the job's working directory: the config as job.toml, plus a
    filtered copy of --working-dir when given. ``dest`` must not exist yet.

    The copy follows ``plan_job``: never secrets (the deny list of jobs/workdir.py, which
    no ignore file overrides, and JSON private keys) or symlinks, nor ``.git/``,
    ``.venv/``, ``tests/``, ``bench/``, outputs, caches and what the folder's .gitignore /
    .rayignore list; more than ``[job] max_working_dir_mb`` is refused (UsageError)
    before anything is copied. The code folders are laid out as the
    installed namespace (``pipeline/`` becomes ``docintel/pipeline/``...), so the job's
    ``python -m docintel.jobs.batch`` and every worker import the shipped code from the
    working directory, which Ray puts first on their path; the rest (data, relative
    inputs) keeps its place."""
    plan = plan_job(req)
    check_size(req, plan)
    staged = StagedDir(dest, left_out=[x.path for x in plan.left_out])
    dest.mkdir(parents=True)
    if plan.root is not None:
        plan.ship.remove(JOB_CONFIG_NAME)  # written below, from the config
        copied = copy_plan(plan, dest, max_ship_bytes(req))
        staged.files, staged.bytes = copied.files, copied.bytes
        staged.left_out += [x.path for x in copied.left_out]
        for pkg, folder in _package_dirs(plan.root).items():
            if (dest / folder).is_dir():
                target = dest.joinpath(*pkg.split("."))
                target.parent.mkdir(parents=True, exist_ok=True)
                (dest / folder).rename(target)
    target = dest / JOB_CONFIG_NAME
    if req.config_path is not None:
        shutil.copyfile(req.config_path, target)
    else:
        target.write_text("# docintel submit: no --config given; every key at its default\n")
    return staged


def submit(
    client: JobSubmissionClient,
    req: JobRequest,
    staging: Path,
    on_staged: Callable[[StagedDir], None],
) -> str:
    """Stage the working directory under ``staging``, upload it and start the job."""
    workdir = stage_working_dir(req, staging / "job")
    on_staged(workdir)
    try:
        return client.submit_job(
            entrypoint=req.entrypoint,
            runtime_env={"working_dir": str(workdir.path)},
            metadata={
                "docintel": "batch",
                "config": req.config_path.name if req.config_path else "",
            },
        )
    except ValueError as e:  # e.g. a --working-dir over Ray's package size limit
        raise UsageError(f"the job's working directory cannot be shipped: {e}") from e
    except RuntimeError as e:
        raise RunFailed(f"the cluster refused the job: {e}") from e


def job_info(client: JobSubmissionClient, job_id: str) -> JobDetails:
    """The job's details; UnknownJob when the cluster has no such job."""
    import requests

    try:
        return client.get_job_info(job_id)
    except RuntimeError as e:
        if "404" in str(e):
            raise UnknownJob(
                f"the cluster has no job {job_id!r}; list its jobs with `ray job list "
                "--address ADDRESS` or the dashboard's Jobs page"
            ) from e
        raise RunFailed(f"could not read job {job_id!r}: {e}") from e
    except requests.RequestException as e:
        raise RunFailed(f"lost contact with the cluster while reading job {job_id!r}: {e}") from e


def job_logs(client: JobSubmissionClient, job_id: str) -> str:
    """Everything the job's entrypoint has written so far (stdout and stderr)."""
    job_info(client, job_id)  # a clear UnknownJob instead of the SDK's raw 404
    return client.get_job_logs(job_id)


def follow_logs(client: JobSubmissionClient, job_id: str, write: Callable[[str], None]) -> str:
    """Stream the job's logs to ``write`` until the job ends; returns a problem, or ""."""
    import aiohttp

    # The SDK logs every normal end of the stream at INFO ("WebSocket closed ...").
    logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            write(chunk)

    try:
        asyncio.run(tail())
    except (RuntimeError, OSError, aiohttp.ClientError) as e:  # the job may still run
        return f"the log stream ended early ({e}); waiting for the job's final state"
    return ""


def wait_terminal(client: JobSubmissionClient, job_id: str) -> JobDetails:
    """Poll until the job reaches a terminal state (fast at first, then every few s)."""
    t0 = time.monotonic()
    while True:
        info = job_info(client, job_id)
        if info.status.is_terminal():
            return info
        time.sleep(POLL_S if time.monotonic() - t0 < SETTLE_S else 5 * POLL_S)


def exit_code(info: JobDetails) -> int:
    """The exit code that mirrors a job's state: 0 while it runs or when it succeeded;
    for a failed job the entrypoint's own code (2 usage, 3 partial, 1 run failed) when
    Ray reports one, else 1; a stopped job 1."""
    status = str(info.status)
    if status in {"PENDING", "RUNNING", "SUCCEEDED"}:
        return ExitCode.OK
    if status == "FAILED":
        code = info.driver_exit_code
        return code if code is not None and 0 < code < 256 else ExitCode.FAILED
    return ExitCode.FAILED


def failure_reason(info: JobDetails) -> str:
    """Why a job did not succeed, in one or two lines.

    Ray's message for a failed entrypoint carries the last 20,000 characters of its log;
    the entrypoint's own ``docintel: ...`` line is the reason a user wants, so that is
    picked out; other failures (runtime env setup, a stopped job) keep Ray's message.
    """
    message = (info.message or "").strip()
    if not message:
        return f"job ended {info.status} without a message"
    head, *rest = message.splitlines()
    head = head.split(", last available logs")[0]  # the log itself follows, or was shown
    ours = [line.strip() for line in rest if line.strip().startswith("docintel:")]
    return f"{head}\n{ours[-1]}" if ours else (head if rest else message)


@dataclass(frozen=True)
class Failure:
    """What a failed job's summary shows: why, its last log lines, a hint or None."""

    reason: str
    last_lines: list[str]
    hint: str | None


def last_error_lines(log: str, n: int = LOG_TAIL_LINES) -> list[str]:
    """The log's last ``n`` non-blank lines; from its last traceback when that starts
    within them (the error and its frames, not the progress lines before it)."""
    lines = [line.rstrip() for line in log.splitlines() if line.strip()]
    tail = lines[-n:]
    starts = [i for i, line in enumerate(tail) if line.startswith("Traceback (most recent")]
    return tail[starts[-1] :] if starts else tail


def failure(client: JobSubmissionClient, info: JobDetails) -> Failure:
    """The summary of a job that did not succeed: Ray's reason, the last lines of the
    job's log (read through the Jobs API; Ray's message when the log cannot be read),
    and a hint when the cause is a known one (docintel missing on the cluster)."""
    import requests

    log = ""
    job = info.submission_id or info.job_id
    if job:
        try:
            log = client.get_job_logs(job)
        except (RuntimeError, OSError, requests.RequestException):
            log = ""  # the summary still has Ray's message
    message = info.message or ""
    if not log:  # Ray's message carries the log's tail after its first line
        log = "\n".join(message.splitlines()[1:])
    hint = MISSING_DOCINTEL_HINT if MISSING_DOCINTEL in log + message else None
    return Failure(failure_reason(info), last_error_lines(log), hint)


def recent_jobs(client: JobSubmissionClient, n: int = RECENT_JOBS) -> list[JobDetails]:
    """The cluster's ``n`` most recently started jobs, newest first."""
    import requests

    try:
        jobs = client.list_jobs()
    except requests.RequestException as e:
        raise RunFailed(f"lost contact with the cluster while listing its jobs: {e}") from e
    except RuntimeError as e:
        raise RunFailed(f"could not list the cluster's jobs: {e}") from e
    return sorted(jobs, key=lambda j: j.start_time or 0, reverse=True)[:n]


def format_time(ms: int | None) -> str:
    """A job timestamp (Unix ms) as UTC text; '-' when not set yet."""
    if not ms:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
