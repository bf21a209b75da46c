"""A built-in stage is one declaration: its registry entry names its config section and
its pool defaults, and the config tree is assembled from the entries (``[<name>]``,
``[resources.<name>]`` with the declared CPUs and a share of a card normalised over the
GPU stages)."""

from __future__ import annotations

import dataclasses

import pytest

from docintel.pipeline import config, registry
from docintel.pipeline.config import Config, load_config
from docintel.pipeline.settings import Settings


def test_the_config_tree_comes_from_the_declarations() -> None:
    fields = list(Config.model_fields)
    sections = [s.name for s in registry.BUILTIN if s.section]
    assert fields[fields.index("pipeline") + 1 : fields.index("resources")] == sections
    cfg = Config()
    for spec in registry.BUILTIN:
        assert type(getattr(cfg, spec.name)) is spec.section
        assert cfg.resources.pool(spec.name).cpus == spec.pool.cpus
    assert list(type(cfg.resources).model_fields) == [*registry.BUILTIN_NAMES, "io_cpus"]


def test_the_default_shares_are_unchanged() -> None:
    r = load_config().resources
    assert [r.pool(s).gpu_fraction for s in ("sentencize", "embed", "classify")] == [
        0.25, 0.5, 0.25,
    ]  # fmt: skip
    assert [r.pool(s).cpus for s in ("sentencize", "embed", "classify")] == [0.25, 1.0, 0.25]
    # a table still overrides its stage's defaults, key by key
    r = load_config(None, {"resources.embed.gpu_fraction": 0.3}).resources
    assert r.embed.gpu_fraction == 0.3 and r.embed.cpus == 1.0


class ParseConfig(Settings):
    language: str = "en"


def test_a_new_built_in_stage_is_one_more_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    """What one more registry entry gives: its section, and a pool whose share of a card
    is normalised with the others' (0.25 of 1.25 = 0.2)."""
    parse = dataclasses.replace(
        registry.SENTENCIZE,
        name="parse",
        section=ParseConfig,
        pool=registry.PoolDefaults(0.5, gpu_share=0.25),
    )
    monkeypatch.setattr(registry, "BUILTIN", (*registry.BUILTIN, parse))
    resources = config._resources_model()
    monkeypatch.setattr(config, "ResourcesConfig", resources)
    tree = config._config_model()
    cfg = tree.model_validate({"parse": {"language": "de"}, "resources": {"parse": {}}})
    assert cfg.parse == ParseConfig(language="de")
    shares = {s: cfg.resources.pool(s).gpu_fraction for s in ("sentencize", "embed", "parse")}
    assert shares == pytest.approx({"sentencize": 0.2, "embed": 0.4, "parse": 0.2})
    assert cfg.resources.pool("parse").cpus == 0.5
    with pytest.raises(ValueError, match="langauge"):
        tree.model_validate({"parse": {"langauge": "de"}})


def _optional_redact(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake optional stage after sentencize, wanted when [faults] poison_stage says so
    (any config key does; this one needs no new section)."""
    redact = dataclasses.replace(
        registry.SENTENCIZE,
        name="redact",
        section=None,
        wanted=lambda cfg: cfg.faults.poison_stage == "redact",
        wanted_by="[faults] poison_stage = 'redact'",
    )
    at = registry.BUILTIN.index(registry.SENTENCIZE) + 1
    stages = (*registry.BUILTIN[:at], redact, *registry.BUILTIN[at:])
    monkeypatch.setattr(registry, "BUILTIN", stages)


def test_an_optional_stage_joins_the_chain_only_when_its_setting_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _optional_redact(monkeypatch)
    assert registry.chain(load_config()).names == ["sentencize", "language", "embed", "classify"]
    on = load_config(None, {"faults.poison_stage": "redact"})
    assert registry.chain(on).names == ["sentencize", "redact", "language", "embed", "classify"]
    # an explicit list that leaves it out gets it after its built-in predecessor
    listed = on.with_overrides({"pipeline.stages": ["sentencize", "embed", "classify"]})
    assert registry.chain(listed).names == ["sentencize", "redact", "language", "embed", "classify"]


def test_an_optional_stage_named_without_its_setting_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _optional_redact(monkeypatch)
    cfg = load_config(None, {"pipeline.stages": ["sentencize", "redact", "embed", "classify"]})
    with pytest.raises(registry.ConfigError, match=r"'redact'.*\[faults\] poison_stage"):
        registry.chain(cfg)
