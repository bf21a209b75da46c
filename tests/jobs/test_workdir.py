"""What `docintel submit --working-dir` ships (jobs/workdir.py, jobs/submit.py), without a
cluster: secrets left out (by name, and JSON private keys by content), tests/ and bench/
left out by default, no symlink followed in any component of a copied path, and the size
cap (`[job] max_working_dir_mb`) refused with exit 2 before anything is copied."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from docintel.jobs.submit import JOB_CONFIG_NAME, check_request, plan_job, stage_working_dir
from docintel.jobs.workdir import PRIVATE_KEY_REASON, copy_plan, plan_working_dir
from docintel.pipeline.errors import UsageError
from tests.conftest import REPO

# Issue 31 item 9: each of these held credentials and shipped.
SECRETS = (
    ".pyiceberg.yaml", "conf/.s3cfg", ".boto", ".databrickscfg", ".pypirc", ".vault-token",
    "rclone.conf", ".config/rclone/rclone.conf", ".streamlit/secrets.toml",
    "app/.streamlit/secrets.toml", ".huggingface/token", ".cache/huggingface/token",
    "keys/deploy.ppk",
)  # fmt: skip
GCP_KEY = {
    "type": "service_account",
    "project_id": "acme-prod",
    "private_key_id": "0123456789abcdef",
    "private_key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----\n",
    "client_email": "docintel@acme-prod.iam.gserviceaccount.com",
}


def _config(path: Path, extra: str = "") -> Path:
    path.write_text(f'[job]\ninput = "s3://corpus/x"\noutput = "s3://results/y"\n{extra}')
    return path


def _project(root: Path) -> Path:
    """A docintel source folder with code, data, tests, benchmarks and secrets."""
    files = {
        "pipeline/config.py": "code",
        "data/notes.md": "notes",
        "data/labels.json": json.dumps({"labels": ["Bearish", "Neutral", "Bullish"]}),
        "tests/test_x.py": "test",
        "bench/run.py": "bench",
        "pipeline/tests/helper.py": "only the top-level tests/ is left out",
        "deploy/prod-2024.json": json.dumps(GCP_KEY),  # a key under any *.json name
        "deploy/KEY.JSON": json.dumps(GCP_KEY, indent=2),
        **{rel: f"SECRET {rel}" for rel in SECRETS},
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    shutil.copyfile(REPO / "pyproject.toml", root / "pyproject.toml")
    # a user's ignore file trying to re-include secrets changes nothing
    (root / ".gitignore").write_text("!.pyiceberg.yaml\n!*.ppk\n!deploy/\n")
    return root


def _dry_run(src: Path, config: Path) -> tuple[int, dict[str, str], set[str], str]:
    from docintel.jobs.cli import app

    args = ["submit", "-c", str(config), "--working-dir", str(src), "--dry-run"]
    r = CliRunner().invoke(app, args)
    ships, left = set(), {}
    for line in r.stdout.splitlines():
        if line.startswith("ship "):
            ships.add(line.removeprefix("ship "))
        else:
            m = re.fullmatch(r"left out (\S+) \((.+)\)", line)
            assert m, f"not a `ship` or `left out` line: {line!r}"
            left[m.group(1)] = m.group(2)
    return r.exit_code, left, ships, r.stderr


def test_secret_files_are_left_out_and_the_dry_run_still_succeeds(tmp_path: Path) -> None:
    src = _project(tmp_path / "project")
    code, left, ships, err = _dry_run(src, _config(tmp_path / "job.toml"))
    assert code == 0, err
    assert ships == {
        ".gitignore", "pyproject.toml", "pipeline/config.py", "data/notes.md",
        "data/labels.json", "pipeline/tests/helper.py", JOB_CONFIG_NAME,
    }  # fmt: skip
    for rel in SECRETS:
        assert left.get(rel, "").startswith("secret: matches"), (rel, left)
    assert left["deploy/prod-2024.json"] == PRIVATE_KEY_REASON
    assert left["deploy/KEY.JSON"] == PRIVATE_KEY_REASON
    assert left["tests/"] == "excluded by default: '/tests/'"
    assert left["bench/"] == "excluded by default: '/bench/'"
    size = sum((src / p).stat().st_size for p in ships if p != JOB_CONFIG_NAME)
    assert f"{size / 1e6:,.2f} MB (cap 100 MB)" in err and "nothing submitted" in err
    staged = stage_working_dir(
        check_request(tmp_path / "job.toml", None, None, None, src), tmp_path / "staged"
    )
    shipped = [p for p in staged.path.rglob("*") if p.is_file()]
    assert not any("SECRET" in p.read_text() or "private_key" in p.read_text() for p in shipped)
    assert staged.bytes == size


def test_ignore_files_may_bring_back_tests_and_bench(tmp_path: Path) -> None:
    src = _project(tmp_path / "project")
    (src / ".rayignore").write_text("!/tests/\n")
    _, left, ships, _ = _dry_run(src, _config(tmp_path / "job.toml"))
    assert "tests/test_x.py" in ships and "bench/" in left


def test_over_the_size_cap_is_refused_naming_cap_and_size(tmp_path: Path) -> None:
    from docintel.jobs.cli import app

    src = _project(tmp_path / "project")
    (src / "data" / "big.bin").write_bytes(b"x" * 60_000)
    config = _config(tmp_path / "job.toml", "max_working_dir_mb = 0.05\n")
    code, _, ships, err = _dry_run(src, config)
    assert code == 2 and "data/big.bin" in ships  # the listing still shows what is big
    size = sum((src / p).stat().st_size for p in ships if p != JOB_CONFIG_NAME)
    assert 60_000 < size < 70_000
    assert (
        f"would ship {size / 1e6:.2f} MB, over the cap of 0.05 MB ([job] max_working_dir_mb)" in err
    )
    assert str(config) in err
    with pytest.raises(UsageError, match=r"over the cap of 0\.05 MB"):
        stage_working_dir(check_request(config, None, None, None, src), tmp_path / "staged")
    assert not (tmp_path / "staged").exists()  # refused before anything is copied
    # a real submit is refused the same way, before any cluster is contacted
    args = ["submit", "-c", str(config), "--working-dir", str(src)]
    r = CliRunner().invoke(app, [*args, "--address", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "over the cap of 0.05 MB" in r.stderr, r.output
    raised = _config(tmp_path / "raised.toml", "max_working_dir_mb = 1\n")
    assert _dry_run(src, raised)[0] == 0


def test_copy_follows_no_symlink_in_any_component_of_a_path(tmp_path: Path) -> None:
    src = _project(tmp_path / "project")
    plan = plan_working_dir(src.resolve())
    assert "data/notes.md" in plan.ship
    elsewhere = tmp_path / "elsewhere"  # same names, outside the folder
    elsewhere.mkdir()
    (elsewhere / "notes.md").write_text("SECRET from outside")
    (elsewhere / "labels.json").write_text("{}")
    shutil.rmtree(src / "data")
    (src / "data").symlink_to(elsewhere, target_is_directory=True)  # swapped after planning
    dest = tmp_path / "dest"
    with pytest.raises(UsageError, match=r"data/\S+ .*changed while being staged"):
        copy_plan(plan, dest, 10**9)
    assert not any("SECRET" in p.read_text() for p in dest.rglob("*") if p.is_file())


def test_a_key_written_after_planning_is_left_out_while_copying(tmp_path: Path) -> None:
    src = _project(tmp_path / "project")
    big = {"pad": "x" * (1024 * 1024 - 20), "private_key": "k"}  # straddles a 1 MiB read
    (src / "data" / "late.json").write_text(json.dumps({"ok": True}))
    plan = plan_working_dir(src.resolve())
    assert "data/late.json" in plan.ship
    (src / "data" / "late.json").write_text(json.dumps(big))
    raw = (src / "data" / "late.json").read_bytes()
    assert raw.index(b'"private_key"') < 1024 * 1024 < raw.index(b'"private_key"') + 13
    copied = copy_plan(plan, tmp_path / "dest", 10**9)
    assert [(x.path, x.reason) for x in copied.left_out] == [("data/late.json", PRIVATE_KEY_REASON)]
    assert not (tmp_path / "dest" / "data" / "late.json").exists()
    assert (tmp_path / "dest" / "data" / "labels.json").exists()
    assert plan_job(check_request(_config(tmp_path / "j.toml"), None, None, None, src)).left_out


def test_a_file_that_grows_past_the_cap_while_copying_is_refused(tmp_path: Path) -> None:
    src = _project(tmp_path / "project")
    plan = plan_working_dir(src.resolve())
    (src / "data" / "notes.md").write_bytes(b"x" * 50_000)  # planned at 5 bytes
    with pytest.raises(UsageError, match="grew while being staged"):
        copy_plan(plan, tmp_path / "dest", plan.bytes + 1_000)


def test_dry_run_lists_the_code_the_config_makes_the_job_import(tmp_path: Path) -> None:
    """Issue 31 item 12: a config is code; --dry-run names each module it would load,
    without importing any of them."""
    from docintel.jobs.cli import app

    src = _project(tmp_path / "project")
    marker = tmp_path / "imported"
    (tmp_path / "mystages.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    stages = '["sentencize", "mystages:Redact", "embed", "classify", "acme_entities"]'
    config = _config(
        tmp_path / "job.toml",
        f'[pipeline]\nstages = {stages}\n[sentencize]\nspacy_model = "en_core_web_sm"\n',
    )
    args = ["submit", "-c", str(config), "--working-dir", str(src), "--dry-run"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    imports = [line for line in r.stdout.splitlines() if line.startswith("imports ")]
    assert imports == [
        "imports mystages (stage mystages:Redact, [pipeline] stages)",
        "imports acme_entities (stage entry point 'acme_entities', [pipeline] stages; "
        "not installed here, the cluster's decides)",
        "imports en_core_web_sm (spaCy pipeline, [sentencize] spacy_model)",
    ]
    assert not marker.exists()  # listed, not imported
    plain = CliRunner().invoke(
        app, ["submit", "-c", str(_config(tmp_path / "p.toml")), "--dry-run"]
    )
    assert plain.exit_code == 0 and "imports " not in plain.stdout  # built-ins, blank:en
