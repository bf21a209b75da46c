"""GPU pools and spill on Ray logical GPUs (the session cluster declares 1 GPU, no CUDA)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

from docintel.actors.cluster import actor_name
from docintel.actors.runner import execute
from docintel.pipeline import registry
from docintel.pipeline.config import Config
from tests.conftest import assert_exactly_once, run_config, write_docs

pytestmark = pytest.mark.usefixtures("ray_cluster")

GPU_STAGES = ("sentencize", "embed", "classify")  # the stages given GPU replicas here


def _cpu_only(cfg: Config) -> list[str]:
    """The chain's CPU-only stages (language, ...): a CPU pool in every spill mode."""
    return [n for n in registry.chain(cfg).names if n not in GPU_STAGES]


def _gpu_config(run_id: str, int8: Path, spill: str = "auto", **more: object) -> Config:
    overrides: dict[str, object] = {
        "embed.int8_dir": str(int8),
        "run.run_id": run_id,
        "run.spill": spill,
        "run.batch_size": 2,
        "resources.embed.cpus": 0.5,  # 2 CPUs: CPU pools 1.0 + GPU replicas 0.3 + I/O
    }
    for stage in GPU_STAGES:
        overrides[f"resources.{stage}.gpu_replicas"] = 1
        overrides[f"resources.{stage}.gpu_cpus"] = 0.1
    overrides.update(more)
    return run_config(**overrides)


def _corpus(
    tmp_path: Path, headlines: list[str], n: int = 24, row_group: int = 6
) -> tuple[Path, list[str]]:
    ids = [f"g{i:02d}" for i in range(n)]
    texts = [h.rstrip(".") + "." for h in headlines[:n]]
    return write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=row_group), ids


def _backends(out: Path) -> dict[str, dict[str, int]]:
    return json.loads((out / "_manifest.json").read_text())["backends"]


def test_saturated_gpu_pools_spill_to_cpu_and_all_share_one_gpu(
    tmp_path: Path, headlines: list[str], int8_encoder: Path
) -> None:
    inp, ids = _corpus(tmp_path, headlines)
    out = tmp_path / "out"
    seen: dict[str, object] = {}

    def look(stats: object) -> None:
        if seen:
            return
        pids = {}
        for stage in GPU_STAGES:
            handle = ray.get_actor(actor_name("spill1", f"{stage}/gpu/0"))
            pids[stage] = ray.get(handle.ready.remote())["pid"]
        seen["gpu_actors"] = pids
        seen["free_gpu"] = ray.available_resources().get("GPU", 0.0)

    cfg = _gpu_config(
        "spill1", int8_encoder, **{"faults.gpu_delay_s": 0.5}
    )  # GPU replicas saturate
    execute(cfg, str(inp), str(out), on_batch=look)
    tables = assert_exactly_once(out, ids)
    # three stages' GPU replicas (0.25 + 0.5 + 0.25) alive together on the one logical GPU
    assert len(seen["gpu_actors"]) == 3 and seen["free_gpu"] == 0.0
    backends = _backends(out)
    # the spill pools of the encoder and the classifier run their int8 artefacts; the
    # rule-based sentencizer has no weights and its CPU replicas run as they are
    for stage in ("embed", "classify"):
        assert set(backends[stage]) == {"gpu-sim", "cpu-int8"}, backends
    assert set(backends["sentencize"]) == {"gpu-sim", "cpu-fp32"}, backends
    sents = tables["sentences"]
    for stage in ("embed", "classify"):
        assert set(sents[f"{stage}_backend"]) == {"gpu-sim", "cpu-int8"}
    # every spilled classify row names the int8 copy of the classifier it ran
    spilled = sents[sents.classify_backend == "cpu-int8"]
    gpu = sents[sents.classify_backend == "gpu-sim"]
    assert spilled.classify_model.str.contains(r"^finsent_ft@\w+\+int8@\w+$").all()
    assert set(gpu.classify_model) == {spilled.classify_model.iloc[0].split("+")[0]}


def test_without_saturation_nothing_spills(
    tmp_path: Path, headlines: list[str], int8_encoder: Path
) -> None:
    # one batch per row group, so admission holds exactly one batch in the pipeline: the
    # load never exceeds what one GPU replica slot takes
    inp, ids = _corpus(tmp_path, headlines, 12, row_group=2)
    out = tmp_path / "out"
    cfg = _gpu_config("calm1", int8_encoder, **{"run.max_batches_in_flight": 1})
    execute(cfg, str(inp), str(out))
    assert_exactly_once(out, ids)
    backends = _backends(out)
    assert all(set(backends[s]) == {"gpu-sim"} for s in GPU_STAGES), backends
    assert all(set(backends[s]) == {"cpu-fp32"} for s in _cpu_only(cfg)), backends


@pytest.mark.parametrize(
    ("spill", "expected"), [("gpu-only", "gpu-sim"), ("cpu-only", "cpu-fp32"), ("off", "gpu-sim")]
)  # cpu-fp32: the CPU pools are the main path, fp32 (embed and classify on their ONNX graphs)
def test_modes_use_only_their_pool(
    tmp_path: Path, headlines: list[str], spill: str, expected: str, int8_encoder: Path
) -> None:
    inp, ids = _corpus(tmp_path, headlines, 8)
    out = tmp_path / "out"
    cfg = _gpu_config(f"mode-{spill}", int8_encoder, spill, **{"faults.gpu_delay_s": 0.2})
    execute(cfg, str(inp), str(out))
    tables = assert_exactly_once(out, ids)
    onnx = {"cpu-fp32": "cpu-fp32-onnx"}.get(expected, expected)
    want = {"sentencize": expected, "embed": onnx, "classify": onnx}
    want.update(dict.fromkeys(_cpu_only(cfg), "cpu-fp32"))  # their CPU pool in every mode
    assert {stage: set(b) for stage, b in _backends(out).items()} == {
        stage: {b} for stage, b in want.items()
    }
    assert set(tables["sentences"].embed_backend) == {onnx}


def test_gpu_and_int8_cpu_replicas_agree_on_labels(
    tmp_path: Path, headlines: list[str], int8_encoder: Path
) -> None:
    """The same corpus through GPU replicas only (fp32 here) and through int8 CPU replicas
    only (int8 encoder and int8 classifier): the labels of >= 97% of sentences agree."""
    inp, ids = _corpus(tmp_path, headlines, 400, row_group=100)
    labels = {}
    for spill in ("gpu-only", "cpu-only"):
        out = tmp_path / f"out-{spill}"
        cfg = _gpu_config(
            f"agree-{spill}",
            int8_encoder,
            spill,
            **{"embed.cpu_precision": "int8", "run.batch_size": 50, "run.embeddings": False},
        )
        execute(cfg, str(inp), str(out))
        sents = assert_exactly_once(out, ids)["sentences"].sort_values(["doc_id", "sent_index"])
        # a sentence in another language has a null label in both (one CPU language pool
        # in every mode): null compared as a value, it agrees
        labels[spill] = sents.label.fillna("(unlabelled)").to_numpy()
        expected = "gpu-sim" if spill == "gpu-only" else "cpu-int8"
        assert set(sents.embed_backend) == set(sents.classify_backend) == {expected}
    assert len(labels["gpu-only"]) == len(labels["cpu-only"]) >= 400
    agree = (labels["gpu-only"] == labels["cpu-only"]).mean()
    assert agree >= 0.97, f"labels agree on {agree:.1%} of sentences"


def test_gpus_by_default_every_stage_gets_a_replica_on_the_card(
    tmp_path: Path, headlines: list[str]
) -> None:
    """No pool config ("auto"): the cluster's one (logical) GPU gets one replica of every
    GPU stage; on two cores the GPU replicas and I/O leave too little for their CPU
    replicas (a CPU-only stage keeps its one)."""
    stages = GPU_STAGES
    inp, ids = _corpus(tmp_path, headlines, n=8, row_group=4)
    out = tmp_path / "out"
    auto = {f"resources.{s}.gpu_replicas": "auto" for s in stages}
    cfg = run_config(**{"run.run_id": "auto1"}, **auto)
    cpu_only = _cpu_only(cfg)  # no GPU share declared: their one CPU replica each
    summary = execute(cfg, str(inp), str(out))
    assert summary.replicas == {
        **{s: {"gpu": 1} for s in stages},
        **{s: {"cpu": 1} for s in cpu_only},
    }
    assert _backends(out) == {
        **{s: {"gpu-sim": summary.batches} for s in stages},
        **{s: {"cpu-fp32": summary.batches} for s in cpu_only},
    }
    assert_exactly_once(out, ids)
    replicas = json.loads((out / "_manifest.json").read_text())["replicas"]
    assert sorted((r["stage"], r["pool"], r["backend"]) for r in replicas) == sorted(
        [(s, "gpu", "gpu-sim") for s in stages] + [(s, "cpu", "cpu-fp32") for s in cpu_only]
    )
