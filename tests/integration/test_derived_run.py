"""A damaged cached artefact does not break every later run: the run's driver finds that
the fused fp32 ONNX encoder fails its checksum, rebuilds it once (saying so), and the run
completes, every document exactly once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from docintel.actors.runner import execute
from docintel.pipeline.artefacts.paths import FP32_MODEL_FILE, checksum_problem
from docintel.pipeline.run.plan import ensure_derived
from tests.conftest import assert_exactly_once, run_config, write_docs

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_a_truncated_cached_fp32_encoder_is_rebuilt_once_and_the_run_works(
    tmp_path: Path, headlines: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    ids = [f"t{i:02d}" for i in range(6)]
    inp = write_docs(tmp_path / "in.parquet", ids, headlines[: len(ids)])
    cfg = run_config()
    ensure_derived(cfg)  # the session cache's artefacts, copied so one can be damaged
    folder = tmp_path / "int8"
    shutil.copytree(cfg.embed.resolved_int8_dir(), folder)
    cfg = cfg.with_overrides({"embed.int8_dir": str(folder)})
    encoder = folder / FP32_MODEL_FILE
    with encoder.open("r+b") as f:  # a copy cut short (a full disk, a killed copy)
        f.truncate(encoder.stat().st_size // 3)
    capsys.readouterr()
    execute(cfg, str(inp), str(tmp_path / "out"))
    said = capsys.readouterr().err
    assert f"the cached fused fp32 ONNX encoder {encoder} does not match its checksum" in said
    assert said.count("rebuilding it (once)") == 1 and said.count(f"built {FP32_MODEL_FILE}") == 1
    assert checksum_problem(encoder) is None
    assert_exactly_once(tmp_path / "out", ids)
