"""Start-up overlaps work: the run does not wait for every replica to load its model.

Reads and the stages whose replicas are ready go on while a slow one loads; a replica of
the starting layout whose model does not load still fails the run with its own message."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from docintel.actors.runner import execute
from docintel.pipeline.artefacts.paths import classifier_fp32_path, write_checksum
from docintel.pipeline.errors import ModelError
from docintel.pipeline.run.plan import ensure_derived
from tests.conftest import assert_exactly_once, run_config, write_docs

pytestmark = pytest.mark.usefixtures("ray_cluster")

LOAD_DELAY_S = 15.0


def _corpus(tmp_path: Path, headlines: list[str], n: int) -> tuple[Path, list[str]]:
    ids = [f"s{i:03d}" for i in range(n)]
    texts = [" ".join(h.rstrip(".") + "." for h in headlines[i * 3 : i * 3 + 3]) for i in range(n)]
    return write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=4), ids


def test_work_starts_before_a_slow_replica_has_loaded(
    tmp_path: Path, headlines: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    inp, ids = _corpus(tmp_path, headlines, 12)
    cfg = run_config(**{"faults.load_delay_stage": "classify", "faults.load_delay_s": LOAD_DELAY_S})
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="docintel.actors.executor"):
        summary = execute(cfg, str(inp), str(out))
    assert_exactly_once(out, ids)
    timings = json.loads((out / "_manifest.json").read_text())["timings"]
    # the first batch went to a replica long before the classifier had loaded
    loaded = timings["models_loaded_seconds"]
    assert loaded >= LOAD_DELAY_S, timings
    assert timings["startup_seconds"] + LOAD_DELAY_S / 2 < loaded, timings
    assert summary.startup_seconds == timings["startup_seconds"]
    # batches waiting for the classifier to load are not counted as held for a slot
    (record,) = [r for r in caplog.records if hasattr(r, "held_s")]
    assert record.__dict__["held_s"].get("classify", 0.0) < LOAD_DELAY_S / 2, record.__dict__


def test_a_starting_replica_whose_model_does_not_load_fails_the_run(
    tmp_path: Path, headlines: list[str]
) -> None:
    """The driver checks that the fp32 ONNX head exists and matches its checksum (a
    damaged one is rebuilt: tests/unit/test_derived.py); one that matches it but does not
    load (a bad build) fails in the replica, and the run stops with the replica's own
    message, nothing committed."""
    inp, _ = _corpus(tmp_path, headlines, 4)
    cfg = run_config()
    ensure_derived(cfg)  # the session cache's artefacts, copied so one can be spoiled
    folder = tmp_path / "int8"
    shutil.copytree(cfg.embed.resolved_int8_dir(), folder)
    cfg = cfg.with_overrides({"embed.int8_dir": str(folder)})
    head = classifier_fp32_path(folder, cfg.classify.resolved_model_dir())
    head.write_bytes(b"not an onnx graph")
    write_checksum(head)  # recorded as built: the driver has no reason to rebuild it
    out = tmp_path / "out"
    with pytest.raises(ModelError, match=f"could not load the fp32 classifier {head}"):
        execute(cfg, str(inp), str(out))
    assert not (out / "_manifest.json").exists()
