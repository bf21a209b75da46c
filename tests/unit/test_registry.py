"""The stage registry: the built-in chain, user-defined stages (``module:Class`` and entry
points), and what is refused before any work, from the classes' declarations."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from docintel.pipeline import registry
from docintel.pipeline.config import load_config
from docintel.pipeline.errors import ChainError, ConfigError
from docintel.pipeline.run.layout import CPU_POOL, GPU_POOL, ClusterShape, build_stage, stage_layout
from docintel.pipeline.schema import BACKEND_CPU_FP32
from tests.userstage import ENTRY, PACKAGE, write_entry_point

BUILTIN = ["sentencize", "language", "embed", "classify"]


def _cfg(*stages: str, **overrides: object):
    return load_config(None, {"pipeline.stages": list(stages), **overrides})


def test_the_default_chain_is_the_built_in_one() -> None:
    assert registry.chain(load_config()).names == BUILTIN
    assert [s.name for s in registry.check_config(load_config())] == BUILTIN
    # every built-in stage is declared once: its entry's name is its class's
    for spec in registry.BUILTIN:
        assert spec.cls.name == spec.name and spec.builtin


def test_a_user_stage_by_module_path(user_package: Path) -> None:
    cfg = _cfg(*BUILTIN, ENTRY, **{"stages.keywords.words": ["fell"]})
    specs = registry.check_config(cfg)
    assert [s.name for s in specs] == [*BUILTIN, "keywords"]
    final = registry.check_columns(specs)
    assert final[-1] == "keyword_hits"
    # its own pool: CPU replicas sized like the light built-in stages, no GPU replica
    layout = stage_layout(cfg, ClusterShape.of(8, 1))
    assert [p.kind for p in layout["keywords"]] == [CPU_POOL]
    assert layout["keywords"][0].cpus == cfg.resources.sentencize.cpus
    stage = build_stage(registry.chain(cfg), layout["keywords"][0])
    stage.setup()
    out = stage(pa.table({"text": ["Shares fell, then fell again.", "Flat."]}))
    assert out["keyword_hits"].to_pylist() == [2, 0]
    assert stage.backend == BACKEND_CPU_FP32  # the stage names none: its pool says
    assert stage.version == f"{PACKAGE}.keywords:Keywords"


def test_a_user_stage_between_built_in_ones_and_on_gpu_pools(user_package: Path) -> None:
    cfg = _cfg("sentencize", ENTRY, "embed", "classify", **{"resources.keywords.gpu_fraction": 0.1})
    assert registry.chain(cfg).names == ["sentencize", "language", "keywords", "embed", "classify"]
    layout = stage_layout(cfg, ClusterShape.of(8, 1))
    kinds = {p.kind: p for p in layout["keywords"]}
    assert kinds[GPU_POOL].replicas == 1 and kinds[GPU_POOL].gpu_fraction == 0.1
    assert kinds[CPU_POOL].replicas >= 1  # spill replicas, as for every stage


def test_a_user_stage_by_entry_point(user_package: Path) -> None:
    write_entry_point(user_package)
    cfg = _cfg(*BUILTIN, "keywords")
    assert registry.chain(cfg).names == [*BUILTIN, "keywords"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("no_such_pkg.mod:Stage", "cannot import module 'no_such_pkg.mod'"),
        (f"{PACKAGE}.keywords:Missing", "has no 'Missing'"),
        (f"{PACKAGE}.keywords:NotAStage", "is not a subclass of"),
        ("nosuchstage", "neither a built-in stage"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(user_package: Path, entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        registry.check_config(_cfg(*BUILTIN, entry))
    assert repr(entry) in str(e.value)


def test_columns_the_chain_does_not_provide_are_refused(user_package: Path) -> None:
    with pytest.raises(ChainError, match=r"needs_missing.*sentiment_vector"):
        registry.check_config(_cfg(*BUILTIN, f"{PACKAGE}.keywords:NeedsMissing"))
    # before the sentencizer, its column would be dropped with the document rows
    with pytest.raises(ConfigError, match="place it after sentencize"):
        registry.check_config(_cfg(ENTRY, *BUILTIN))


def test_built_in_stages_stay_in_order_and_once(user_package: Path) -> None:
    with pytest.raises(ConfigError, match="built-in stages"):
        registry.check_config(_cfg("embed", "sentencize", "classify"))
    with pytest.raises(ConfigError, match="more than once"):
        registry.check_config(_cfg(*BUILTIN, ENTRY, ENTRY))


def test_stage_keyed_settings_are_checked_against_the_chain(user_package: Path) -> None:
    with pytest.raises(ConfigError, match="did you mean 'embed'"):
        registry.check_config(load_config(None, {"resources.embd.cpus": 1.0}))
    with pytest.raises(ConfigError, match=r"\[stages.<stage>\]"):
        registry.check_config(load_config(None, {"stages.keywords.words": ["x"]}))
    with pytest.raises(ConfigError, match="poison_stage"):
        registry.check_config(load_config(None, {"faults.poison_stage": "embedd"}))
    wrong = _cfg(*BUILTIN, ENTRY, **{"stages.keywords.wordz": ["x"]})
    with pytest.raises(ConfigError, match=r"cannot be constructed.*wordz"):
        registry.check_config(wrong)
