"""The documented user stage (docs/configuration.md, "Your own stage") as a user runs it:
`docintel` from its console script, no PYTHONPATH, the stage's module beside the config
file or in the current folder. The driver finds it there (as `python -m` finds a module in
the current folder); a module found nowhere is refused naming the folders searched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from tests.conftest import write_docs
from tests.userstage import readme_stage

# The console script, as installed: unlike `python -m docintel.jobs.cli`, it does not put
# the current folder on Python's path itself.
SCRIPT = Path(sys.executable).with_name("docintel")


def _docintel(cwd: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=600,
        cwd=cwd, env={**env, "COLUMNS": "200"}, check=False,
    )  # fmt: skip


def _config(folder: Path, *entries: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "docintel.toml"
    stages = ", ".join(f'"{e}"' for e in ("sentencize", "embed", "classify", *entries))
    path.write_text(f'[pipeline]\nstages = [{stages}]\n[stages.keywords]\nwords = ["loss"]\n')
    return path


def _package(folder: Path, package: str, code: str) -> None:
    """``code`` as the module ``keywords`` of the package ``package`` in ``folder``."""
    (folder / package).mkdir(parents=True)
    (folder / package / "__init__.py").write_text("")
    (folder / package / "keywords.py").write_text(code)


def test_stages_beside_the_config_file_and_in_the_current_folder_run(tmp_path: Path) -> None:
    """One run, two stages: the docs' own beside the config file, run from another
    folder; a copy under another name (its default words) in the current folder."""
    project = tmp_path / "project"
    config = _config(project, "cfg_stages.keywords:Keywords", "cwd_stages.keywords:Keywords")
    _package(project, "cfg_stages", readme_stage())
    here = tmp_path / "here"
    renamed = readme_stage().replace('"keywords"', '"impairments"').replace("keyword_hits", "hits2")
    _package(here, "cwd_stages", renamed)
    texts = ["Profit rose. A loss.", "An impairment, a loss and another loss."]
    inp = write_docs(here / "in.parquet", ["a", "b"], texts)
    # five stages' replicas: more (logical) CPUs than a 2-core machine's
    run = ("run", inp, "out", "-c", config, "--no-progress", "--num-cpus", "4")
    result = _docintel(here, *run)
    assert result.returncode == 0, result.stderr[-3000:]
    sents = pd.read_parquet(here / "out" / "sentences")
    lower = sents["text"].str.lower()
    assert (sents["keyword_hits"] == lower.str.count("loss")).all()
    assert (sents["hits2"] == lower.str.count("impairment")).all()  # its default words
    assert sents["keyword_hits"].sum() == 3 and sents["hits2"].sum() == 1


def test_a_missing_stage_module_names_the_folders_searched(tmp_path: Path) -> None:
    config = _config(tmp_path / "configs", "no_such_stages.keywords:Keywords")
    here = tmp_path / "here"
    inp = write_docs(here / "in.parquet", ["a"], ["Profit rose."])
    result = _docintel(here, "run", inp, "out", "-c", config, "--no-progress")
    assert result.returncode == 2, result.stderr[-3000:]
    err = " ".join(result.stderr.split())  # the message as one line, however it wraps
    assert "cannot import module 'no_such_stages.keywords'" in err
    assert f"the current folder ({here})" in err
    assert f"the config file's folder ({tmp_path / 'configs'})" in err
    assert "Traceback" not in result.stderr and not (here / "out").exists()
