"""Shared test helpers: corpus builders and output readers (used by every tier)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from docintel.pipeline.config import Config, load_config

REPO = Path(__file__).resolve().parent.parent
VALID_CSV = REPO / "data" / "twitter_fin_sentiment" / "sent_valid.csv"


def pytest_configure(config: pytest.Config) -> None:
    """Derived artefacts (int8 models) go to a cache folder of this test session, never to
    the user's ~/.cache/docintel; subprocesses and Ray workers inherit the variable."""
    from docintel.pipeline.artefacts.paths import CACHE_ENV

    if CACHE_ENV not in os.environ:
        import tempfile

        os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="docintel-test-cache-")


def sigkill_after_parts(
    cmd: list[str],
    parts: Path,
    n: int,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    pattern: str = "part-*.parquet",
) -> int:
    """Start ``cmd`` (a driver), SIGKILL it once ``parts`` holds ``n`` committed part files.

    Also kills its embedded Ray's daemons and workers, which on a real machine would die
    with it. Returns how many parts were committed when it died.
    """
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    tree: list[psutil.Process] = []
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            tree = psutil.Process(proc.pid).children(recursive=True)
            if parts.is_dir() and len(list(parts.glob(pattern))) >= n:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"driver ended before the kill: {proc.stderr.read()[-2000:]}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
    return len(list(parts.glob(pattern)))


def write_docs(
    path: Path,
    ids: list,
    texts: list,
    row_group_size: int = 4,
    text_type: pa.DataType | None = None,
) -> Path:
    """A documents Parquet file with columns doc_id, text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = pa.array(texts, text_type) if text_type is not None else pa.array(texts)
    pq.write_table(
        pa.table({"doc_id": pa.array(ids), "text": text}), path, row_group_size=row_group_size
    )
    return path


def run_config(**overrides: object) -> Config:
    """Defaults for tests: small batches (several per file), no progress bar, CPU pools
    only (the integration tests' Ray declares a logical GPU, which "auto" would give GPU
    replicas; the GPU tests ask for them)."""
    base: dict[str, object] = {"run.batch_size": 4, "run.show_progress": False}
    base.update({f"resources.{s}.gpu_replicas": 0 for s in ("sentencize", "embed", "classify")})
    base.update(overrides)
    return load_config(None, base)


def read_output(out: Path) -> dict[str, pd.DataFrame]:
    return {t: pd.read_parquet(out / t) for t in ("documents", "sentences", "errors")}


def assert_exactly_once(out: Path, expected_ids: list[str]) -> dict[str, pd.DataFrame]:
    """Every input document appears exactly once in documents/; errors name real docs."""
    tables = read_output(out)
    docs = tables["documents"]
    assert sorted(docs["doc_id"].tolist()) == sorted(str(i) for i in expected_ids)
    assert docs["doc_id"].is_unique
    errored = set(tables["errors"]["doc_id"])
    assert errored <= set(docs["doc_id"])
    assert set(docs.loc[docs.status == "error", "doc_id"]) == errored
    assert not tables["sentences"].duplicated(["doc_id", "sent_index"]).any()
    assert (out / "_manifest.json").is_file()
    return tables


@pytest.fixture(scope="session")
def headlines() -> list[str]:
    return pd.read_csv(VALID_CSV)["text"].tolist()


@pytest.fixture(scope="session")
def int8_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The int8 folder, built once per session exactly as `docintel quantize` builds it:
    the encoder's files at its root and the bundled classifier's int8 copy in
    ``classify/`` (so ``[embed] int8_dir`` = this folder serves both CPU int8 stages)."""
    from docintel.pipeline.config import ClassifyConfig, EmbedConfig
    from docintel.pipeline.offline.quantize import build_int8, build_int8_classifier

    folder = build_int8(EmbedConfig().resolved_model_path(), tmp_path_factory.mktemp("int8"))
    build_int8_classifier(ClassifyConfig().resolved_model_dir(), folder)
    return folder


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An out-of-tree stage package (tests/userstage.py), importable in this process and
    its children for one test, as a user's own package would be."""
    import sys

    from tests.userstage import PACKAGE, write_package

    root = write_package(tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    yield root
    for mod in [m for m in sys.modules if m.startswith(PACKAGE)]:
        del sys.modules[mod]


def kill_and_await_restart(handle: object, timeout: float = 120) -> tuple[int, int | None]:
    """Kill a stage actor as an OOM kill would (Ray restarts it), then wait for its new
    process: (old pid, new pid, or None if none came up in ``timeout``)."""
    import ray

    old = ray.get(handle.ready.remote())["pid"]  # type: ignore[attr-defined]
    ray.kill(handle, no_restart=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # the kill is asynchronous; wait for the new one
        with contextlib.suppress(ray.exceptions.RayActorError):
            pid = ray.get(handle.ready.remote())["pid"]  # type: ignore[attr-defined]
            if pid != old:
                return old, pid
        time.sleep(0.2)
    return old, None
