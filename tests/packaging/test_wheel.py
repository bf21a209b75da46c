"""The built wheel, installed into a fresh virtualenv, is a complete docintel.

Why: the editable install every other test runs on maps the source folders onto
``docintel.*`` with a finder; a wheel is built from ``[tool.setuptools]`` instead. A
subpackage missing from ``packages``, package data (the bundled classifier) left out, a
generic top-level ``pipeline/`` landing in site-packages, or an entry point naming a module
that only the source checkout has would pass every other tier and first break on a user's
machine. This module builds the wheel from the repository, checks its contents, installs it
into a new virtualenv and runs ``docintel run`` from there, far from the checkout.

The fresh virtualenv gets the wheel only (``pip install --no-deps --no-index``). The heavy
dependencies (torch, TensorFlow, Ray, transformers, spaCy...) are not reinstalled: they are
borrowed from the test's own virtualenv by a ``.pth`` file that holds the path of its
site-packages. The test checks our wheel, not PyPI's packages, and must run offline and in
seconds, not download gigabytes. A plain path line in a ``.pth`` file is appended to
``sys.path`` as is: the ``.pth`` files of the borrowed folder, among them the editable
install's finder that maps ``docintel.*`` onto this checkout, are not processed, so the
source tree stays invisible and every ``docintel`` module must come from the wheel.
"""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
import sysconfig
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, write_docs

pytestmark = pytest.mark.packaging

CODE_FOLDERS = ("pipeline", "actors", "jobs", "models")  # installed as docintel.<folder>
# The default model: a head and its fine-tuned encoder (a LoRA adapter over the stock MiniLM)
CLASSIFIER = "docintel/models/finsent_ft"
ENCODER_FILES = tuple(
    f"encoder/{f}"
    for f in (
        "adapter_model.safetensors", "adapter_config.json", "base.json", "config.json",
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
    )
)  # fmt: skip
CLASSIFIER_FILES = ("model.keras", "labels.json", "training.json", *ENCODER_FILES)
# The head trained on the stock MiniLM ([classify] model_dir = "stock")
STOCK_CLASSIFIER = "docintel/models/finsent"
STOCK_CLASSIFIER_FILES = ("model.keras", "labels.json", "training.json")
ENTRY_POINT = "docintel.jobs.cli:main"
BUILD_TIMEOUT = 300
RUN_TIMEOUT = 900  # an embedded Ray on 2 CPUs plus three model loads: ~60-120 s


@dataclass
class Installed:
    venv: Path
    python: Path
    docintel: Path
    wheel: Path


def _tail(r: subprocess.CompletedProcess[str], n: int = 4000) -> str:
    return f"exit {r.returncode}\n--- stdout ---\n{r.stdout[-n:]}\n--- stderr ---\n{r.stderr[-n:]}"


def _run(
    cmd: list[str | Path], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _base_python() -> str:
    """The interpreter the test virtualenv was made from (not the venv's own python)."""
    base = getattr(sys, "_base_executable", "")
    if base and Path(base).is_file():
        return base
    cfg = Path(sys.prefix) / "pyvenv.cfg"  # fallback: the venv's `home`
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                return str(Path(value.strip()) / f"python{sys.version_info[0]}")
    return sys.executable


def _clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """The user's environment as a fresh install sees it: no PYTHONPATH, no trace of the
    test virtualenv on PATH, the fresh virtualenv's bin first."""
    test_bin = str(Path(sys.executable).parent)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}
    }
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != test_bin]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["VIRTUAL_ENV"] = str(venv)
    env["COLUMNS"] = "200"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from the repository root exactly as a release is.

    setuptools' intermediate ``build/`` and ``*.egg-info`` go to a temporary folder
    (``DIST_EXTRA_CONFIG``): the checkout is left untouched, and a stale ``build/lib`` of an
    earlier build (a renamed module, the old top-level ``pipeline/`` layout) cannot be copied
    into this wheel.
    """
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    extra_cfg = tmp / "setup-extra.cfg"
    extra_cfg.write_text(f"[build]\nbuild_base = {tmp / 'build'}\n[egg_info]\negg_base = {tmp}\n")
    env = {**os.environ, "DIST_EXTRA_CONFIG": str(extra_cfg)}
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    r = _run([*cmd, "--no-cache-dir", "-w", dist, REPO], tmp, BUILD_TIMEOUT, env)
    assert r.returncode == 0, f"building the wheel failed:\n{_tail(r)}"
    wheels = sorted(dist.glob("docintel-*.whl"))
    built = [p.name for p in dist.iterdir()]
    assert len(wheels) == 1, f"expected one docintel wheel in {dist}: {built}"
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A new virtualenv holding the wheel, with the dependencies borrowed (module docstring)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    r = _run([_base_python(), "-m", "venv", venv], elsewhere, BUILD_TIMEOUT, _clean_env(venv))
    assert r.returncode == 0, f"python -m venv failed:\n{_tail(r)}"
    python = venv / "bin" / "python"
    site = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        elsewhere,
        60,
        _clean_env(venv),
    )
    assert site.returncode == 0, _tail(site)
    fresh_site = Path(site.stdout.strip())
    assert fresh_site.is_relative_to(venv), fresh_site
    r = _run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "--no-cache-dir", wheel],
        elsewhere,
        BUILD_TIMEOUT,
        _clean_env(venv, PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    assert r.returncode == 0, f"installing the wheel failed:\n{_tail(r)}"
    # Borrowed only after the install: pip must not see (nor try to replace) the test venv's
    # editable docintel, which lives in the borrowed folder.
    borrowed = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (fresh_site / "_docintel_test_borrowed_deps.pth").write_text("\n".join(borrowed) + "\n")
    script = venv / "bin" / "docintel"
    assert script.is_file(), "the wheel installed no `docintel` console script"
    return Installed(venv=venv, python=python, docintel=script, wheel=wheel)


def _wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def _read(wheel: Path, name: str) -> bytes:
    with zipfile.ZipFile(wheel) as z:
        return z.read(name)


def _dist_info(names: list[str]) -> str:
    infos = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    assert len(infos) == 1, f"expected one .dist-info folder: {sorted(infos)}"
    return infos.pop()


def test_wheel_holds_only_the_docintel_namespace(wheel: Path) -> None:
    names = _wheel_names(wheel)
    info = _dist_info(names)
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"docintel", info}, (
        f"the wheel installs top-level names besides docintel/: {sorted(tops - {'docintel', info})}"
    )
    stray = [n for n in names if n.endswith(".py") and not n.startswith("docintel/")]
    assert not stray, f"Python modules outside docintel/: {stray}"
    # `docintel` is a PEP 420 namespace package: no docintel/__init__.py in the wheel
    assert "docintel/__init__.py" not in names
    assert _read(wheel, f"{info}/top_level.txt").decode().split() == ["docintel"]


def test_wheel_holds_every_source_module_and_the_classifier(wheel: Path) -> None:
    """Every .py of the code folders lands as docintel.<folder>.*: a subpackage missing from
    ``[tool.setuptools] packages`` is dropped from the wheel silently otherwise."""
    names = set(_wheel_names(wheel))
    expected = {
        f"docintel/{folder}/{p.relative_to(REPO / folder).as_posix()}"
        for folder in CODE_FOLDERS
        for p in (REPO / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    missing = sorted(expected - names)
    assert not missing, f"source modules missing from the wheel: {missing}"
    for folder, files in (
        (CLASSIFIER, CLASSIFIER_FILES),
        (STOCK_CLASSIFIER, STOCK_CLASSIFIER_FILES),
    ):
        for f in files:
            name = f"{folder}/{f}"
            assert name in names, f"{name} is not in the wheel (package data)"
            source = REPO / "models" / folder.rsplit("/", 1)[1] / f
            assert _read(wheel, name) == source.read_bytes(), name


def test_wheel_entry_point_is_the_namespaced_cli(wheel: Path) -> None:
    names = _wheel_names(wheel)
    text = _read(wheel, f"{_dist_info(names)}/entry_points.txt").decode()
    eps = configparser.ConfigParser()
    eps.read_string(text)
    assert eps.has_section("console_scripts"), text
    assert dict(eps["console_scripts"]) == {"docintel": ENTRY_POINT}, text


def test_installed_package_imports_from_the_fresh_venv(
    installed: Installed, tmp_path: Path
) -> None:
    """From an unrelated folder, without PYTHONPATH: docintel comes from the fresh venv, and
    the bare folder names of the checkout are not importable."""
    env = _clean_env(installed.venv)
    code = (
        "import json, docintel, docintel.pipeline, docintel.models; "
        "from docintel.pipeline.config import ClassifyConfig; "
        "print(docintel.pipeline.__file__); "
        "print(json.dumps({'docintel': list(docintel.__path__), "
        "'classifier': str(ClassifyConfig().resolved_model_dir())}))"
    )
    r = _run([installed.python, "-c", code], tmp_path, 300, env)
    assert r.returncode == 0, _tail(r)
    first, second = r.stdout.strip().splitlines()[-2:]
    venv = installed.venv.resolve()
    assert Path(first).resolve().is_relative_to(venv), f"docintel.pipeline from {first}"
    info = json.loads(second)
    outside = [p for p in info["docintel"] if not Path(p).resolve().is_relative_to(venv)]
    assert not outside, f"docintel namespace portions outside the fresh venv: {outside}"
    classifier = Path(info["classifier"]).resolve()
    assert classifier.is_relative_to(venv), classifier
    assert {f: (classifier / f).is_file() for f in CLASSIFIER_FILES} == dict.fromkeys(
        CLASSIFIER_FILES, True
    )
    for bare in ("pipeline", "jobs", "actors", "models"):
        r = _run([installed.python, "-c", f"import {bare}"], tmp_path, 120, env)
        assert r.returncode != 0, f"`import {bare}` works in the fresh venv: {_tail(r)}"
        assert f"ModuleNotFoundError: No module named '{bare}'" in r.stderr, _tail(r)


def test_console_script_runs_the_pipeline(installed: Installed, tmp_path: Path) -> None:
    """`docintel run` of the installed wheel, on a small corpus: the output contract holds."""
    texts = [
        "Revenue rose 12% in the third quarter. Margins improved on lower costs.",
        "The company cut its full-year guidance. Shares fell sharply in early trading.",
        "Analysts expect flat sales next year. The dividend was kept unchanged.",
        "Profits doubled thanks to strong demand. The board approved a buyback. Debt was reduced.",
        "",
        "The bank reported record losses. Its chief executive resigned on Monday.",
        "Oil prices climbed for a fifth day. Energy stocks led the market higher.",
        "The merger was blocked by regulators. Both stocks dropped after the news.",
        "Quarterly earnings met expectations. The outlook remains cautious.",
        "Inflation slowed more than forecast. Bond yields eased across the curve.",
        "The retailer will close forty stores. Online sales kept growing though.",
        "Cash flow turned positive this year. Management raised its targets. Investors cheered.",
    ]
    ids = [f"doc-{i:02d}" for i in range(len(texts))]
    corpus = write_docs(tmp_path / "in" / "corpus.parquet", ids, texts)
    out = tmp_path / "out"
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    env = _clean_env(installed.venv, DOCINTEL_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [installed.docintel, "run", corpus, out, "--num-cpus", "2", "--batch-size", "4"]
    start = time.monotonic()
    r = _run([*cmd, "--no-progress"], workdir, RUN_TIMEOUT, env)
    elapsed = time.monotonic() - start
    assert r.returncode == 0, f"docintel run failed after {elapsed:.0f}s:\n{_tail(r)}"

    assert (out / "_manifest.json").is_file()
    manifest = json.loads((out / "_manifest.json").read_text())
    docs = pd.read_parquet(out / "documents")
    assert sorted(docs["doc_id"]) == ids
    assert docs["doc_id"].is_unique
    assert set(docs["status"]) == {"ok"}, docs[["doc_id", "status"]]
    assert len(pd.read_parquet(out / "errors")) == 0

    labels = json.loads(_read(installed.wheel, f"{CLASSIFIER}/labels.json"))
    dim = json.loads(_read(installed.wheel, f"{CLASSIFIER}/training.json"))["embedding_dim"]
    sentences = pd.read_parquet(out / "sentences")
    assert len(sentences) >= len(texts) - 1
    assert set(sentences["doc_id"]) == {i for i, t in zip(ids, texts, strict=True) if t}
    assert set(sentences["label"]) <= set(labels), sorted(set(sentences["label"]))
    assert "embedding" in sentences.columns
    assert sentences["embedding"].map(len).eq(dim).all()

    classifier_versions = [
        v for v in manifest["models"].values() if str(v).startswith("finsent_ft@")
    ]
    assert len(classifier_versions) == 1, manifest["models"]
    assert set(sentences["classify_model"]) == set(classifier_versions), (
        sorted(set(sentences["classify_model"])),
        manifest["models"],
    )
