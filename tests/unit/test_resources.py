"""check_layout: refuse, on the driver, a pool layout that leaves no CPU for I/O tasks."""

from __future__ import annotations

import pytest

from docintel.actors.resources import actor_options, check_layout
from docintel.pipeline.config import Config
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.layout import stage_layout


def test_default_layout_fits_two_cpus():
    check_layout(Config(), 2)
    # 0.25 + 1.0 + 0.25 held by actors, 0.25 for I/O: exactly 1.75 is enough
    check_layout(Config(), 1.75)


def test_default_layout_refused_on_one_cpu():
    with pytest.raises(ConfigError, match="CPUs") as exc:
        check_layout(Config(), 1)
    msg = str(exc.value)
    assert "1.5" in msg  # what the pools hold
    assert "--num-cpus" in msg


def test_just_below_the_need_is_refused():
    with pytest.raises(ConfigError, match="CPUs"):
        check_layout(Config(), 1.74)


def test_replicas_count():
    cfg = Config().with_overrides({"resources.embed.replicas": 2})
    with pytest.raises(ConfigError, match=r"embed 2x1"):
        check_layout(cfg, 2)
    check_layout(cfg, 3)


def test_stage_layout_and_actor_options():
    res = stage_layout(Config())
    assert set(res) == {"sentencize", "embed", "classify"}
    assert [r.kind for r in res["embed"]] == ["cpu"]  # no GPU replicas by default
    assert res["embed"][0].cpus == 1.0
    assert res["embed"][0].precision == "fp32"  # the main path, not a spill pool
    opts = actor_options(res["embed"][0], "docintel:r1:embed/cpu/0")
    assert opts["name"] == "docintel:r1:embed/cpu/0"
    assert opts["num_cpus"] == 1.0
    assert opts["num_gpus"] == 0.0
    assert opts["max_concurrency"] == 1


def _gpu_cfg(spill: str = "auto", **more: object) -> Config:
    overrides: dict[str, object] = {"run.spill": spill, "resources.embed.cpus": 0.5}
    for stage in ("sentencize", "embed", "classify"):
        overrides[f"resources.{stage}.gpu_replicas"] = 1
        overrides[f"resources.{stage}.gpu_cpus"] = 0.1
    overrides.update(more)
    return Config().with_overrides(overrides)


@pytest.mark.parametrize(
    ("spill", "kinds"),
    [("auto", ["gpu", "cpu"]), ("gpu-only", ["gpu"]), ("cpu-only", ["cpu"]), ("off", ["gpu"])],
)
def test_spill_mode_chooses_the_pools(spill, kinds):
    res = stage_layout(_gpu_cfg(spill))
    assert all([r.kind for r in pools] == kinds for pools in res.values())
    gpu = next(r for r in res["embed"] if r.kind == "gpu") if "gpu" in kinds else None
    if gpu is not None:
        assert gpu.gpu_fraction == 0.5 and actor_options(gpu, "x")["num_gpus"] == 0.5
    cpu = next((r for r in res["embed"] if r.kind == "cpu"), None)
    if cpu is not None:  # int8 only where the CPU replicas are the spill pool
        assert cpu.precision == ("int8" if spill == "auto" else "fp32")


def test_off_without_gpu_replicas_uses_the_cpu_pool():
    res = stage_layout(Config().with_overrides({"run.spill": "off"}))
    assert [r.kind for r in res["embed"]] == ["cpu"]


def test_gpu_only_without_gpu_replicas_is_refused():
    with pytest.raises(ConfigError, match=r"no GPU replicas.*gpu_replicas"):
        stage_layout(Config().with_overrides({"run.spill": "gpu-only"}))


def test_three_stages_fit_one_gpu_and_more_is_refused():
    check_layout(_gpu_cfg(), 2, 1)  # 0.25 + 0.5 + 0.25 of one GPU
    with pytest.raises(ConfigError, match=r"GPU replicas need 1.5 GPUs.*has 1"):
        check_layout(_gpu_cfg(**{"resources.embed.gpu_replicas": 2}), 3, 1)
    with pytest.raises(ConfigError, match="--spill cpu-only"):
        check_layout(_gpu_cfg(), 2, 0)
    check_layout(_gpu_cfg("cpu-only"), 2, 0)


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_gpu_fraction_out_of_range_is_a_config_error(fraction):
    with pytest.raises(ConfigError, match="gpu_fraction"):
        Config().with_overrides({"resources.embed.gpu_fraction": fraction})
