"""`docintel submit / status / logs` and `python -m docintel.jobs.batch` against a real Ray head.

One head (`ray start --head`, 2 CPUs) serves the module; every command runs as the
installed `docintel` script in a subprocess, the way a user runs it. The default stage
layout holds 1.5 CPUs plus 0.25 for I/O tasks, which the head's 2 CPUs fit; the job's
entrypoint reserves none.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from docintel.jobs.submit import (
    JOB_CONFIG_NAME,
    check_request,
    exit_code,
    failure_reason,
    stage_working_dir,
)
from docintel.pipeline.errors import UsageError
from tests.conftest import REPO, assert_exactly_once, write_docs
from tests.jobs.conftest import BIN, RayHead, docintel, free_ports, plain_env

JOB_ID = re.compile(r"raysubmit_[A-Za-z0-9]+")
N_DOCS = 20


def write_config(path: Path, input: Path | str, output: Path | str, extra: str = "") -> Path:
    """A job config: small batches, no embedding column, [job] input/output."""
    path.write_text(
        "[run]\nbatch_size = 5\nembeddings = false\n"
        f'[job]\ninput = "{input}"\noutput = "{output}"\n{extra}'
    )
    return path


@dataclass
class CompletedRun:
    config: Path
    output: Path
    ids: list[str]
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, headlines: list[str]) -> tuple[Path, list]:
    """~20 documents of two real finance headlines each."""
    ids = [f"doc-{i:02d}" for i in range(N_DOCS)]
    texts = [f"{headlines[2 * i]} {headlines[2 * i + 1]}" for i in range(N_DOCS)]
    path = tmp_path_factory.mktemp("corpus") / "docs.parquet"
    return write_docs(path, ids, texts, row_group_size=10), ids


@pytest.fixture(scope="module")
def completed_run(
    ray_head: RayHead, corpus: tuple[Path, list], tmp_path_factory: pytest.TempPathFactory
) -> CompletedRun:
    """`docintel submit` of the corpus, followed to the end (the module's one full run)."""
    path, ids = corpus
    root = tmp_path_factory.mktemp("run")
    config = write_config(root / "job.toml", path, root / "out")
    result = docintel("submit", "--address", ray_head.address, "--config", config, env=ray_head.env)
    return CompletedRun(config, root / "out", ids, result)


def test_help_has_examples() -> None:
    env = plain_env()
    helps = {
        cmd: docintel(cmd, "--help", env=env, timeout=60) for cmd in ("submit", "status", "logs")
    }
    for cmd, r in helps.items():
        assert r.returncode == 0, r.stderr
        assert "Example" in r.stdout, f"`docintel {cmd} --help` shows no example"
    for opt in ("--address", "--config", "--input", "--output", "--run-id", "--no-wait"):
        assert opt in helps["submit"].stdout
    assert "--working-dir" in helps["submit"].stdout and "--follow" in helps["logs"].stdout
    r = subprocess.run(
        [str(BIN / "python"), "-m", "docintel.jobs.batch", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0 and "Example" in r.stdout and "--config" in r.stdout


def test_submit_runs_the_batch_job_on_the_cluster(
    ray_head: RayHead, completed_run: CompletedRun
) -> None:
    r = completed_run.result
    assert r.returncode == 0, r.stdout + r.stderr
    assert JOB_ID.search(r.stdout), r.stdout
    assert "SUCCEEDED" in r.stderr
    # the followed log: the entrypoint joined the job's cluster (its GCS), printed plain
    # progress lines and the summary
    assert re.search(rf"^docintel: batch run .* on \S+:{ray_head.gcs_port}$", r.stdout, re.M)
    assert f"docintel: processing {N_DOCS} documents" in r.stdout
    assert f"docintel: {N_DOCS}/{N_DOCS} documents (100%)" in r.stdout
    assert "docintel run " in r.stdout  # the summary table's title
    tables = assert_exactly_once(completed_run.output, completed_run.ids)
    assert (tables["documents"]["status"] == "ok").all()
    assert len(tables["sentences"]) >= N_DOCS
    assert "embedding" not in tables["sentences"].columns  # the config travelled
    manifest = json.loads((completed_run.output / "_manifest.json").read_text())
    assert manifest["counts"]["documents"] == N_DOCS
    assert manifest["config"]["run"]["ray_address"].endswith(f":{ray_head.gcs_port}")
    assert manifest["config"]["run"]["batch_size"] == 5
    # every stage of the chain counted its batches
    assert set(manifest["backends"]) == set(manifest["stages"])
    assert {"sentencize", "embed", "classify"} <= set(manifest["stages"])


def test_failed_job_exits_with_the_entrypoint_code_and_reason(
    ray_head: RayHead, tmp_path: Path
) -> None:
    """The entrypoint reports a missing input as a usage error (exit 2); submit mirrors
    it. --working-dir ships this source tree, which the job then runs."""
    missing = tmp_path / "missing.parquet"
    config = write_config(tmp_path / "bad.toml", missing, tmp_path / "out")
    r = docintel(
        "submit", "--address", ray_head.address, "-c", config, "--working-dir", REPO,
        env=ray_head.env,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert "FAILED" in r.stderr and "exit code 2" in r.stderr
    reason = f"docintel: usage error: input '{missing}' does not exist"
    assert reason in r.stderr  # picked out of Ray's message, not only in the log
    code_line = re.search(r"docintel: code from (\S+)", r.stdout)
    assert code_line, r.stdout
    assert Path(code_line.group(1)) != REPO  # the shipped copy, not the installed tree
    assert "runtime_resources" in code_line.group(1)
    assert not (tmp_path / "out").exists()
    assert "Traceback" not in r.stdout + r.stderr


def test_no_wait_then_status_and_logs(ray_head: RayHead, completed_run: CompletedRun) -> None:
    """Resubmitting a completed run is a no-op job; status and logs report it."""
    r = docintel(
        "submit", "--address", ray_head.address, "--config", completed_run.config,
        "--no-wait", env=ray_head.env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    match = JOB_ID.search(r.stdout)
    assert match, r.stdout
    job_id = match.group(0)
    deadline = time.monotonic() + 180
    while True:
        s = docintel("status", job_id, "--address", ray_head.address, env=ray_head.env)
        assert s.returncode == 0, s.stdout + s.stderr  # pending, running or succeeded
        assert "python -m docintel.jobs.batch --config job.toml" in s.stdout
        if "SUCCEEDED" in s.stdout:
            break
        assert time.monotonic() < deadline, s.stdout
        time.sleep(2)
    assert "started" in s.stdout and "UTC" in s.stdout
    # the address from RAY_ADDRESS when --address is not given
    logs = docintel("logs", job_id, env={**ray_head.env, "RAY_ADDRESS": ray_head.address})
    assert logs.returncode == 0, logs.stderr
    assert "is already complete: nothing to do" in logs.stdout
    assert f"({N_DOCS} documents," in logs.stdout
    follow = docintel("logs", job_id, "--follow", "--address", ray_head.address, env=ray_head.env)
    assert follow.returncode == 0, follow.stderr
    assert "is already complete: nothing to do" in follow.stdout
    assert_exactly_once(completed_run.output, completed_run.ids)  # untouched


def test_job_level_env_vars_merge_with_the_pipelines(ray_head: RayHead, tmp_path: Path) -> None:
    """A job submitted with its own env_vars (here by Ray's CLI) sets a key the pipeline's
    ray.init also sets; Ray would refuse the driver's runtime_env, the entrypoint lets the
    pipeline's values win and the run completes."""
    ids = ["p", "q", "r", "s"]
    small = write_docs(
        tmp_path / "small.parquet", ids, ["Profits fell.", "Shares rose.", "", "Flat."]
    )
    jobdir = tmp_path / "jobdir"
    jobdir.mkdir()
    write_config(jobdir / JOB_CONFIG_NAME, small, tmp_path / "out")
    runtime_env = {"working_dir": str(jobdir), "env_vars": {"TOKENIZERS_PARALLELISM": "true"}}
    r = subprocess.run(
        [
            str(BIN / "ray"), "job", "submit", "--address", ray_head.address,
            "--runtime-env-json", json.dumps(runtime_env),
            "--", "python", "-m", "docintel.jobs.batch", "--config", JOB_CONFIG_NAME,
        ],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=ray_head.env,
        check=False,
    )  # fmt: skip
    assert "Failed to merge the Job's runtime env" not in r.stdout + r.stderr
    match = JOB_ID.search(r.stdout + r.stderr)
    assert match, r.stdout + r.stderr
    s = docintel("status", match.group(0), "--address", ray_head.address, env=ray_head.env)
    assert s.returncode == 0 and "SUCCEEDED" in s.stdout, s.stdout + s.stderr
    assert_exactly_once(tmp_path / "out", ids)
    assert pq.read_table(tmp_path / "out" / "documents").num_rows == 4


def test_unknown_job_id_exits_2(ray_head: RayHead) -> None:
    for cmd in ("status", "logs"):
        r = docintel(cmd, "raysubmit_doesnotexist", "--address", ray_head.address, env=ray_head.env)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "no job 'raysubmit_doesnotexist'" in r.stderr
        assert "Traceback" not in r.stderr


def test_missing_token_is_a_usage_error(ray_head: RayHead) -> None:
    env = {k: v for k, v in ray_head.env.items() if not k.startswith("RAY_AUTH")}
    r = docintel("status", "raysubmit_x", "--address", ray_head.address, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "token authentication" in r.stderr and "RAY_AUTH_MODE=token" in r.stderr


def test_unreachable_address_exits_2_naming_it(tmp_path: Path, corpus: tuple[Path, list]) -> None:
    (port,) = free_ports(1)  # nothing listens there
    address = f"http://127.0.0.1:{port}"
    config = write_config(tmp_path / "job.toml", corpus[0], tmp_path / "out")
    env = plain_env()
    for args in (("submit", "-c", config), ("status", "raysubmit_x"), ("logs", "raysubmit_x")):
        r = docintel(*args, "--address", address, env=env, timeout=60)
        assert r.returncode == 2, r.stdout + r.stderr
        assert address in r.stderr and "cannot reach" in r.stderr
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_bad_job_config_exits_2_before_contacting_the_cluster(tmp_path: Path) -> None:
    """Config problems are reported first: the (unreachable) address is never tried."""
    (port,) = free_ports(1)
    address = f"http://127.0.0.1:{port}"
    env = plain_env()
    cases = {
        "no input": (("--output", "/abs/out"), "pass --input URI or set [job] input"),
        "relative": (("--input", "docs.parquet", "--output", "/o"), "'docs.parquet' is a relative"),
        "bad key": (("-c", tmp_path / "bad.toml"), "invalid configuration"),
        "no file": (("-c", tmp_path / "none.toml"), "does not exist"),
    }
    (tmp_path / "bad.toml").write_text("[run]\nbatch_size = 0\n")
    for name, (args, message) in cases.items():
        r = docintel("submit", "--address", address, *args, env=env, timeout=60)
        assert r.returncode == 2, (name, r.stderr)
        assert message in r.stderr, (name, r.stderr)
        assert address not in r.stderr, name
    # the entrypoint itself, without input: exit 2 naming the flag and the config key
    r = subprocess.run(
        [str(BIN / "python"), "-m", "docintel.jobs.batch", "--output", str(tmp_path / "o")],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "no input: pass --input URI or set [job] input" in r.stderr


def test_working_dir_staging(tmp_path: Path) -> None:
    """--working-dir ships the source without secrets, venvs, VCS data, outputs, int8,
    caches or what .gitignore lists; the config always travels as job.toml; the code
    folders are laid out as the docintel.* namespace."""
    src = tmp_path / "project"
    outside = tmp_path / "secret-elsewhere.txt"
    outside.write_text("not yours")
    for rel in (
        "pipeline/config.py", "models/finsent/model.keras", "models/int8/abc/model.onnx",
        ".venv/bin/python", ".git/HEAD", "demo-out/_manifest.json", "jobs/__pycache__/x.pyc",
        "docintel.egg-info/PKG-INFO", "data/demo/documents.parquet",
        ".env", "deploy/.env.prod", "certs/server.pem", ".aws/credentials", "id_rsa",
        "scratch/big.bin", "notes/keep.md",
    ):  # fmt: skip
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(rel)
    (src / ".gitignore").write_text("scratch/\n")
    (src / "data" / "link-out.txt").symlink_to(outside)
    config = write_config(tmp_path / "mine.toml", "s3://corpus/x", "s3://results/y")
    with pytest.raises(UsageError, match="not a docintel source folder"):
        stage_working_dir(check_request(config, None, None, None, src), tmp_path / "nope")
    assert not (tmp_path / "nope").exists()
    shutil.copyfile(REPO / "pyproject.toml", src / "pyproject.toml")
    req = check_request(config, None, None, "r1", src)
    assert req.entrypoint == "python -m docintel.jobs.batch --config job.toml --run-id r1"
    staged = stage_working_dir(req, tmp_path / "staged")
    shipped = {p.relative_to(staged.path).as_posix() for p in staged.path.rglob("*") if p.is_file()}
    assert shipped == {
        "pyproject.toml",
        ".gitignore",
        "docintel/pipeline/config.py",
        "docintel/models/finsent/model.keras",
        "data/demo/documents.parquet",
        "notes/keep.md",
        JOB_CONFIG_NAME,
    }
    assert staged.files == len(shipped) - 1  # job.toml is added, not shipped from the folder
    for secret in (".env", "deploy/.env.prod", "certs/server.pem", ".aws/", "id_rsa"):
        assert secret in staged.left_out, (secret, staged.left_out)
    assert "data/link-out.txt" in staged.left_out and "scratch/" in staged.left_out
    assert "files" in staged.describe() and "left out" in staged.describe()
    assert (staged.path / JOB_CONFIG_NAME).read_text() == config.read_text()
    bare = stage_working_dir(check_request(config, None, None, None, None), tmp_path / "bare")
    assert [p.name for p in bare.path.iterdir()] == [JOB_CONFIG_NAME]
    with pytest.raises(UsageError, match="relative path"):
        check_request(None, "in.parquet", "/abs/out", None, None)
    # relative paths are fine with --working-dir: they are relative to the shipped folder
    assert check_request(None, "data/demo/documents.parquet", "out/x", None, src).input


def test_exit_codes_and_reasons_mirror_the_job() -> None:
    from ray.job_submission import JobDetails

    def job(status: str, code: int | None = None, message: str | None = None) -> JobDetails:
        return JobDetails(
            type="SUBMISSION", job_id="02000000", submission_id="raysubmit_x",
            entrypoint="python -m docintel.jobs.batch", status=status, driver_exit_code=code,
            message=message,
        )  # fmt: skip

    assert [exit_code(job(s)) for s in ("PENDING", "RUNNING", "SUCCEEDED")] == [0, 0, 0]
    assert exit_code(job("FAILED", 3)) == 3  # partial run
    assert exit_code(job("FAILED", 2)) == 2
    assert exit_code(job("FAILED", None, "runtime env setup failed")) == 1
    assert exit_code(job("FAILED", -9)) == 1  # killed by a signal
    assert exit_code(job("STOPPED")) == 1
    message = (
        "Job entrypoint command failed with exit code 1, last available logs (truncated "
        "to 20,000 chars):\nloading\ndocintel: run failed: 30 of 40 documents failed\n"
    )
    assert failure_reason(job("FAILED", 1, message)) == (
        "Job entrypoint command failed with exit code 1\n"
        "docintel: run failed: 30 of 40 documents failed"
    )
    assert failure_reason(job("STOPPED", None, "Job was intentionally stopped.")) == (
        "Job was intentionally stopped."
    )


# Every one of these must stay home, whatever the folder's ignore files say (issue 20).
SECRETS = (
    ".env", "deploy/.env.prod", ".envrc", ".git-credentials", ".kube/config", "credentials",
    "conf/credentials", "id_ecdsa", "id_ed25519", "keys/ID_RSA", ".pypirc", ".npmrc", ".netrc",
    "tls/server.pem", "tls/server.key", "tls/Client.P12", "tls/bundle.pfx", ".aws/credentials",
    ".docker/config.json", ".ssh/id_rsa", "kubeconfig", ".git/config",
)  # fmt: skip
# ... and so the paths left out: a secret folder is left out whole.
LEFT_OUT = (
    ".env", "deploy/.env.prod", ".envrc", ".git-credentials", ".kube/", "credentials",
    "conf/credentials", "id_ecdsa", "id_ed25519", "keys/ID_RSA", ".pypirc", ".npmrc",
    ".netrc", "tls/server.pem", "tls/server.key", "tls/Client.P12", "tls/bundle.pfx",
    ".aws/", ".docker/", ".ssh/", "kubeconfig", ".git/",
    "notes.txt", "data/tls/", "dangling.md", "debug.log",  # symlinks, and an ignored file
)  # fmt: skip


def _project(root: Path) -> Path:
    """A docintel source folder holding code, data and every kind of secret."""
    for rel in ("pipeline/config.py", "data/notes.md", *SECRETS):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"SECRET {rel}" if rel in SECRETS else rel)
    shutil.copyfile(REPO / "pyproject.toml", root / "pyproject.toml")
    # a user's ignore files that try to re-include secrets (the last match wins in git)
    (root / ".gitignore").write_text("!.env\n!*.pem\n!.aws/\n!credentials\n*.log\n")
    (root / ".rayignore").write_text("!id_*\n!.ssh/\n")
    (root / "debug.log").write_text("log")
    (root / "notes.txt").symlink_to(".env")  # a link inside the folder to a secret
    (root / "data" / "tls").symlink_to(root / "tls", target_is_directory=True)
    (root / "dangling.md").symlink_to(root / "missing.md")
    return root


def test_secrets_and_symlinks_never_ship_whatever_the_ignore_files_say(tmp_path: Path) -> None:
    src = _project(tmp_path / "project")
    config = write_config(tmp_path / "mine.toml", "s3://corpus/x", "s3://results/y")
    staged = stage_working_dir(check_request(config, None, None, None, src), tmp_path / "staged")
    files = {p.relative_to(staged.path).as_posix(): p for p in staged.path.rglob("*")}
    shipped = {rel for rel, p in files.items() if p.is_file()}
    assert shipped == {
        ".gitignore", ".rayignore", "pyproject.toml", "docintel/pipeline/config.py",
        "data/notes.md", JOB_CONFIG_NAME,
    }  # fmt: skip
    assert not any(p.is_symlink() for p in files.values())
    assert not any("SECRET" in p.read_text() for p in files.values() if p.is_file())
    for path in LEFT_OUT:
        assert path in staged.left_out, (path, staged.left_out)


def test_dry_run_lists_every_path_with_its_fate_and_contacts_no_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from docintel.jobs import submit as jobs
    from docintel.jobs.cli import app

    def no_cluster(*args: object) -> None:
        raise AssertionError(f"--dry-run contacted the cluster: {args}")

    monkeypatch.setattr(jobs, "connect", no_cluster)
    monkeypatch.setattr(jobs, "submit", no_cluster)
    src = _project(tmp_path / "project")
    (src / JOB_CONFIG_NAME).write_text("# the folder's own, replaced by --config")
    config = write_config(tmp_path / "mine.toml", "s3://corpus/x", "s3://results/y")
    args = ["submit", "-c", str(config), "--working-dir", str(src), "--dry-run"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    ships = {line.removeprefix("ship ") for line in lines if line.startswith("ship ")}
    assert ships == {
        ".gitignore", ".rayignore", "pyproject.toml", "pipeline/config.py", "data/notes.md",
        JOB_CONFIG_NAME,
    }  # fmt: skip
    left = {}
    for line in lines:
        if not line.startswith("ship "):
            m = re.fullmatch(r"left out (\S+) \((.+)\)", line)
            assert m, f"not a `ship` or `left out` line: {line!r}"
            left[m.group(1)] = m.group(2)
    assert set(LEFT_OUT) <= set(left), left
    assert left[".env"].startswith("secret: matches '.env'")
    assert left["tls/server.pem"].startswith("secret: matches '*.pem'")
    assert left["keys/ID_RSA"].startswith("secret: matches 'id_rsa*'")
    assert left[".kube/"].startswith("secret:") and left[".docker/"].startswith("secret:")
    assert left[".git/"] == "VCS data or a virtualenv: matches '.git/'; never shipped"
    assert left["notes.txt"].startswith("symlink") and left["data/tls/"].startswith("symlink")
    assert left["debug.log"] == "listed in .gitignore: '*.log'"
    assert left[JOB_CONFIG_NAME] == "replaced by the job's config"
    assert "nothing submitted" in r.stderr
    # a bad config is still refused first (exit 2), as for a real submit
    r = CliRunner().invoke(app, ["submit", "--dry-run", "--output", "/o"])
    assert r.exit_code == 2 and "no input" in r.stderr


def test_missing_docintel_on_the_cluster_gets_a_hint_and_status_lists_jobs(
    ray_head: RayHead, tmp_path: Path
) -> None:
    """A cluster whose Python has no docintel (here: the job's PATH finds the base
    interpreter of this venv first): the failed job's summary shows the last lines of its
    log, with the import error, and the hint (infra/ image or --working-dir); `docintel
    status` without an id lists the job."""
    base = Path(sys.base_prefix) / "bin" / "python3"
    probe = subprocess.run([str(base), "-c", "import docintel"], capture_output=True, check=False)
    if probe.returncode == 0:
        pytest.skip(f"{base} has docintel installed")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(base)
    jobdir = tmp_path / "jobdir"
    jobdir.mkdir()
    write_config(jobdir / JOB_CONFIG_NAME, tmp_path / "in.parquet", tmp_path / "out")
    path = f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin"
    runtime_env = {"working_dir": str(jobdir), "env_vars": {"PATH": path}}
    r = subprocess.run(
        [
            str(BIN / "ray"), "job", "submit", "--address", ray_head.address, "--no-wait",
            "--runtime-env-json", json.dumps(runtime_env),
            "--", "python", "-m", "docintel.jobs.batch", "--config", JOB_CONFIG_NAME,
        ],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=ray_head.env,
        check=False,
    )  # fmt: skip
    match = JOB_ID.search(r.stdout + r.stderr)
    assert match, r.stdout + r.stderr
    job_id = match.group(0)
    deadline = time.monotonic() + 120
    while True:
        s = docintel("status", job_id, "--address", ray_head.address, env=ray_head.env)
        if "FAILED" in s.stdout or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert s.returncode == 1, s.stdout + s.stderr
    assert "last lines of the job's log:" in s.stderr
    assert "No module named 'docintel'" in s.stderr.split("last lines of the job's log:")[1]
    hint = next(line for line in s.stderr.splitlines() if line.startswith("hint: "))
    assert "infra/" in hint and "docintel submit --working-dir ." in hint
    listed = docintel("status", "--address", ray_head.address, env=ray_head.env)
    assert listed.returncode == 0, listed.stderr
    assert job_id in listed.stdout and "FAILED" in listed.stdout
