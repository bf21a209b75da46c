"""The spill policy on a real local Ray with a logical GPU: what the executor measures and
where batches go, checked against the committed output.

GPU replicas sleep ``[faults] gpu_delay_s`` per call, which bounds their call times from
below; CPU replicas run fp32 (the routing under test does not depend on the CPU model's
precision, and fp32 needs no int8 artefact build).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from docintel.actors.runner import execute
from docintel.pipeline.config import Config
from tests.conftest import assert_exactly_once, run_config, write_docs

pytestmark = pytest.mark.usefixtures("ray_cluster")

STAGES = ("sentencize", "embed", "classify")  # the stages given GPU replicas here
BATCH = 2


def _config(run_id: str, delay: float, **more: object) -> Config:
    overrides: dict[str, object] = {
        "run.run_id": run_id,
        "run.spill": "auto",
        "run.batch_size": BATCH,
        "run.embeddings": False,
        "embed.cpu_precision": "fp32",
        "faults.gpu_delay_s": delay,
        "resources.embed.cpus": 0.5,  # 2 CPUs: CPU pools 1.0 + GPU replicas 0.3 + I/O
    }
    for stage in STAGES:
        overrides[f"resources.{stage}.gpu_replicas"] = 1
        overrides[f"resources.{stage}.gpu_cpus"] = 0.1
    overrides.update(more)
    return run_config(**overrides)


def _corpus(tmp_path: Path, headlines: list[str], n: int, row_group: int) -> tuple[Path, list]:
    ids = [f"s{i:02d}" for i in range(n)]
    texts = [h.rstrip(".") + "." for h in headlines[:n]]
    return write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=row_group), ids


def _run(
    caplog: pytest.LogCaptureFixture, cfg: Config, inp: Path, out: Path
) -> tuple[dict[str, dict[str, Any]], dict[str, float], dict[str, dict[str, int]]]:
    """Execute; return the executor's per-replica stats, driver hold times, and backends."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="docintel.actors.executor"):
        execute(cfg, str(inp), str(out))
    records = [r for r in caplog.records if hasattr(r, "replicas")]
    assert len(records) == 1, "the executor logs one dispatch record per run"
    replicas = {s["replica"]: s for s in records[0].__dict__["replicas"]}
    backends = json.loads((out / "_manifest.json").read_text())["backends"]
    return replicas, records[0].__dict__["held_s"], backends


def test_saturated_gpus_spill_and_the_driver_measures_every_replica(
    tmp_path: Path, headlines: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    delay = 1.0
    inp, ids = _corpus(tmp_path, headlines, 24, row_group=6)  # 12 batches, all admitted
    out = tmp_path / "out"
    replicas, _, backends = _run(caplog, _config("route1", delay), inp, out)
    assert_exactly_once(out, ids)
    for stage in STAGES:
        gpu, cpu = replicas[f"{stage}/gpu/0"], replicas[f"{stage}/cpu/0"]
        # the dispatcher's accounting is what the committed rows say about each batch
        assert gpu["calls"] + cpu["calls"] == len(ids) // BATCH
        cpu_backend = "cpu-fp32" if stage == "sentencize" else "cpu-fp32-onnx"
        assert backends[stage] == {"gpu-sim": gpu["calls"], cpu_backend: cpu["calls"]}
        # GPU first, and saturated GPU replicas spill to the CPU pool
        assert gpu["calls"] >= 1 and cpu["calls"] >= 1, replicas
        # every call of a GPU replica sleeps `delay` first: the driver-side timing sees it
        # (a margin for a driver that was descheduled when a call finished)
        assert gpu["service_s"] >= 0.75 * delay, gpu
        assert gpu["busy_s"] >= 0.75 * delay * gpu["calls"], gpu
        assert cpu["service_s"] is not None and cpu["service_s"] < gpu["service_s"], replicas


def test_without_saturation_nothing_spills_and_nothing_queues(
    tmp_path: Path, headlines: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    # one batch in the pipeline at a time: an idle GPU replica always takes it, however
    # much faster the CPU replica would be
    inp, ids = _corpus(tmp_path, headlines, 10, row_group=BATCH)
    out = tmp_path / "out"
    cfg = _config("calm2", 0.3, **{"run.max_batches_in_flight": 1})
    replicas, held, backends = _run(caplog, cfg, inp, out)
    assert_exactly_once(out, ids)
    assert all(set(backends[s]) == {"gpu-sim"} for s in STAGES), backends
    # a CPU-only stage (language, ...) has no GPU pool to spill from: its CPU pool runs all
    assert all(set(b) == {"cpu-fp32"} for s, b in backends.items() if s not in STAGES)
    for stage in STAGES:
        assert replicas[f"{stage}/cpu/0"]["calls"] == 0
        gpu = replicas[f"{stage}/gpu/0"]
        assert gpu["calls"] == len(ids) // BATCH
        assert gpu["queued_s"] == 0.0  # never a call behind another
        assert held[stage] < 0.5, held  # and never held on the driver for a slot


def test_spilled_batches_run_as_slices_on_the_cpu_pool_exactly_once(
    tmp_path: Path, headlines: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Batches of 256 documents spilled to a saturated GPU's CPU pool run as slices
    (pipeline/run/slices.py), with a poisoned document and the CPU embed replica killed
    mid-run: every document once, the rows of a run without slicing, and more CPU calls
    than CPU-served batches (the slices)."""
    import ray

    from docintel.actors.cluster import actor_name
    from tests.conftest import kill_and_await_restart

    n, batch = 1_536, 256
    inp, ids = _corpus(tmp_path, headlines, n, row_group=batch)
    poison = [ids[700]]
    more = {
        "run.batch_size": batch,
        "faults.poison_stage": "embed",
        "faults.poison_doc_ids": poison,
    }
    killed: list[int | None] = []

    def kill_cpu_embed_once(_stats: object) -> None:
        if not killed:
            handle = ray.get_actor(actor_name("slices", "embed/cpu/0"))
            killed.extend(kill_and_await_restart(handle))

    caplog.clear()
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="docintel.actors.executor"):
        execute(_config("slices", 1.5, **more), str(inp), str(out), on_batch=kill_cpu_embed_once)
    record = next(r for r in caplog.records if hasattr(r, "replicas"))
    replicas = {s["replica"]: s for s in record.__dict__["replicas"]}
    backends = json.loads((out / "_manifest.json").read_text())["backends"]
    tables = assert_exactly_once(out, ids)
    assert killed and killed[0] != killed[-1], "the CPU embed replica was not replaced"
    assert tables["errors"]["doc_id"].tolist() == poison  # bisected out inside its slice
    assert sum(backends["embed"].values()) == n // batch  # one backend per batch: joined
    cpu_batches = backends["embed"].get("cpu-fp32-onnx", 0)
    assert cpu_batches >= 1, backends
    assert replicas["embed/cpu/0"]["calls"] > cpu_batches, replicas  # sliced calls

    plain = tmp_path / "plain"
    execute(_config("noslices", 1.5, **more, **{"run.spill_slicing": False}), str(inp), str(plain))
    ref = assert_exactly_once(plain, ids)
    cols = ["doc_id", "sent_index", "text"]
    got = tables["sentences"][cols].sort_values(cols[:2]).reset_index(drop=True)
    assert got.equals(ref["sentences"][cols].sort_values(cols[:2]).reset_index(drop=True))
