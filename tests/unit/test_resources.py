"""Pool layouts: sized to the cluster ("auto"), checked on the driver before any work."""

from __future__ import annotations

import pytest

from docintel.actors.resources import actor_options, check_layout
from docintel.pipeline.config import Config
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.run import layout as layout_mod
from docintel.pipeline.run.layout import ClusterShape, NodeShape, check_declared_gpus, stage_layout

STAGES = ("sentencize", "embed", "classify")  # the stages with a share of a card
CPU_ONLY = ("language",)  # always CPU replicas, whatever the spill mode


def _check(cfg: Config, cpus: float, gpus: float = 0.0) -> None:
    shape = ClusterShape.of(cpus, gpus)
    check_layout(cfg, stage_layout(cfg, shape), shape)


def _counts(cfg: Config, shape: ClusterShape) -> dict[str, dict[str, int]]:
    res = stage_layout(cfg, shape)
    return {s: {p.kind: p.replicas for p in pools} for s, pools in res.items()}


def test_default_layout_fits_two_cpus():
    _check(Config(), 2)
    # 0.25 + 1.0 + 0.25 held by actors, 0.25 for I/O: exactly 1.75 is enough
    _check(Config(), 1.75)


def test_default_layout_refused_on_one_cpu():
    with pytest.raises(ConfigError, match="CPUs") as exc:
        _check(Config(), 1)
    msg = str(exc.value)
    assert "1.75" in msg  # what the pools hold
    assert "--num-cpus" in msg


def test_just_below_the_need_the_light_stages_squeeze_and_below_their_floor_it_is_refused():
    _check(Config(), 1.74)  # sentencize and classify hold a little less than 0.25 each
    assert stage_layout(Config(), ClusterShape.of(1.74))["sentencize"][0].cpus < 0.25
    with pytest.raises(ConfigError, match="CPUs"):  # 1.0 + 2 x 0.05 + 0.25 I/O > 1.3
        _check(Config(), 1.3)


def test_replicas_count():
    cfg = Config().with_overrides({"resources.embed.replicas": 2})
    with pytest.raises(ConfigError, match=r"embed 2x1"):
        _check(cfg, 2)
    _check(cfg, 3)


def test_stage_layout_and_actor_options():
    res = stage_layout(Config(), ClusterShape.of(2))
    assert set(res) == {*STAGES, *CPU_ONLY}
    assert [r.kind for r in res["embed"]] == ["cpu"]  # no GPU on the cluster: CPU pools
    assert res["embed"][0].cpus == 1.0
    assert res["embed"][0].precision == "fp32"  # the main path, not a spill pool
    opts = actor_options(res["embed"][0], "docintel:r1:embed/cpu/0")
    assert opts["name"] == "docintel:r1:embed/cpu/0"
    assert opts["num_cpus"] == 1.0
    assert opts["num_gpus"] == 0.0
    assert opts["max_concurrency"] == 1


def test_auto_pools_grow_with_the_cpus():
    assert _counts(Config(), ClusterShape.of(2)) == {s: {"cpu": 1} for s in (*STAGES, *CPU_ONLY)}
    # 16 CPUs: 15.75 after I/O; rounds of one encoder replica, plus one sentencize and
    # one classify replica every 4 rounds: 13 + 4 x 0.25 x 2 = 15 CPUs held
    big = _counts(Config(), ClusterShape.of(16))
    light = {"cpu": 3}
    assert big == {"sentencize": light, "language": light, "embed": {"cpu": 12}, "classify": light}
    _check(Config(), 16)


def test_gpus_by_default_one_replica_per_stage_per_card():
    one = stage_layout(Config(), ClusterShape.of(16, 1))
    assert [p.kind for p in one.pop("language")] == ["cpu"]  # no share of the card
    for stage, pools in one.items():
        assert [p.kind for p in pools] == ["gpu", "cpu"], stage
        assert pools[0].replicas == 1
    assert sum(p[0].gpu_fraction for p in one.values()) == 1.0  # the stages share the card
    assert one["embed"][1].precision == "int8"  # CPU replicas are the spill pool
    assert _counts(Config(), ClusterShape.of(32, 4))["embed"]["gpu"] == 4
    # two cores and one GPU: the GPU replicas and I/O leave 1 CPU, too little for a CPU
    # encoder replica: every stage runs on its GPU replica alone
    counts = _counts(Config(), ClusterShape.of(2, 1))
    assert counts == {**{s: {"gpu": 1} for s in STAGES}, "language": {"cpu": 1}}
    _check(Config(), 2, 1)


def test_min_and_max_bound_the_auto_size():
    capped = Config().with_overrides({"resources.embed.max_replicas": 3})
    assert _counts(capped, ClusterShape.of(16))["embed"] == {"cpu": 3}
    gpus = Config().with_overrides({"resources.embed.max_gpu_replicas": 2})
    assert _counts(gpus, ClusterShape.of(32, 4))["embed"]["gpu"] == 2
    floor = Config().with_overrides({"resources.embed.min_replicas": 4})
    assert _counts(floor, ClusterShape.of(2))["embed"] == {"cpu": 4}
    with pytest.raises(ConfigError, match=r"embed 4x1"):  # a min the cluster cannot hold
        _check(floor, 2)


def test_a_replica_no_single_node_can_hold_is_refused_naming_it():
    cfg = Config().with_overrides({"resources.embed.cpus": 1.5, "resources.embed.replicas": 1})
    three = ClusterShape(tuple(NodeShape(1.0) for _ in range(3)))  # 3 CPUs, 1 per node
    with pytest.raises(ConfigError, match=r"cannot place embed cpu replica 1 of 1") as exc:
        check_layout(cfg, stage_layout(cfg, three), three)
    assert "3 nodes (1 CPUs; 1 CPUs; 1 CPUs)" in str(exc.value)


def _gpu_cfg(spill: str = "auto", **more: object) -> Config:
    overrides: dict[str, object] = {"run.spill": spill, "resources.embed.cpus": 0.5}
    for stage in STAGES:
        overrides[f"resources.{stage}.gpu_replicas"] = 1
        overrides[f"resources.{stage}.gpu_cpus"] = 0.1
    overrides.update(more)
    return Config().with_overrides(overrides)


@pytest.mark.parametrize(
    ("spill", "kinds"),
    [("auto", ["gpu", "cpu"]), ("gpu-only", ["gpu"]), ("cpu-only", ["cpu"]), ("off", ["gpu"])],
)
def test_spill_mode_chooses_the_pools(spill, kinds):
    res = stage_layout(_gpu_cfg(spill), ClusterShape.of(2, 1))
    assert all([r.kind for r in res[s]] == kinds for s in STAGES)
    assert [r.kind for r in res["language"]] == ["cpu"]  # a CPU-only stage, in every mode
    gpu = next(r for r in res["embed"] if r.kind == "gpu") if "gpu" in kinds else None
    if gpu is not None:
        assert gpu.gpu_fraction == 0.5 and actor_options(gpu, "x")["num_gpus"] == 0.5
    cpu = next((r for r in res["embed"] if r.kind == "cpu"), None)
    if cpu is not None:  # int8 only where the CPU replicas are the spill pool
        assert cpu.precision == ("int8" if spill == "auto" else "fp32")


def test_off_without_gpus_uses_the_cpu_pool():
    res = stage_layout(Config().with_overrides({"run.spill": "off"}), ClusterShape.of(2))
    assert [r.kind for r in res["embed"]] == ["cpu"]


def test_gpu_only_without_gpus_is_refused():
    with pytest.raises(ConfigError, match=r"no GPU replicas.*--gpus N.*gpu_replicas"):
        stage_layout(Config().with_overrides({"run.spill": "gpu-only"}), ClusterShape.of(2))


def test_three_stages_fit_one_gpu_and_more_is_refused():
    _check(_gpu_cfg(), 2, 1)  # 0.25 + 0.5 + 0.25 of one GPU
    with pytest.raises(ConfigError, match=r"GPU replicas need 1.5 GPUs.*has 1"):
        _check(_gpu_cfg(**{"resources.embed.gpu_replicas": 2}), 3, 1)
    with pytest.raises(ConfigError, match="--spill cpu-only"):
        _check(_gpu_cfg(), 2, 0)
    _check(_gpu_cfg("cpu-only"), 2, 0)


def test_more_gpus_than_a_cuda_machine_has_is_refused(monkeypatch):
    monkeypatch.setattr(layout_mod, "detect_gpus", lambda: 2)  # a machine with two cards
    check_declared_gpus(Config().with_overrides({"run.num_gpus": 2}))
    check_declared_gpus(Config())  # auto: every card
    with pytest.raises(ConfigError, match=r"--gpus 3 .* has \(2\)"):
        check_declared_gpus(Config().with_overrides({"run.num_gpus": 3}))
    monkeypatch.setattr(layout_mod, "detect_gpus", lambda: 0)  # none: logical GPUs, any N
    check_declared_gpus(Config().with_overrides({"run.num_gpus": 3}))


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_gpu_fraction_out_of_range_is_a_config_error(fraction):
    with pytest.raises(ConfigError, match="gpu_fraction"):
        Config().with_overrides({"resources.embed.gpu_fraction": fraction})


@pytest.mark.parametrize("value", [-1, "many"])
def test_bad_replica_counts_are_config_errors(value):
    with pytest.raises(ConfigError, match="replicas"):
        Config().with_overrides({"resources.embed.replicas": value})
