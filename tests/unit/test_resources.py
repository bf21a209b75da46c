"""check_layout: refuse, on the driver, a pool layout that leaves no CPU for I/O tasks."""

from __future__ import annotations

import pytest

from actors.resources import actor_options, check_layout, stage_resources
from pipeline.config import Config
from pipeline.errors import ConfigError


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


def test_stage_resources_and_actor_options():
    res = stage_resources(Config())
    assert set(res) == {"sentencize", "embed", "classify"}
    assert res["embed"].cpus == 1.0
    opts = actor_options(res["embed"], "docintel:r1:embed/cpu/0")
    assert opts["name"] == "docintel:r1:embed/cpu/0"
    assert opts["num_cpus"] == 1.0
    assert opts["num_gpus"] == 0.0
    assert opts["max_concurrency"] == 1
