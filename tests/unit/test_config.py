"""Config: the example file, strict keys, readable errors, dotted overrides."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from docintel.pipeline.config import DEFAULT_BATCH_SIZE, Config, load_config
from docintel.pipeline.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "docintel.example.toml"


def test_example_file_loads_and_matches_the_defaults():
    if not EXAMPLE.exists():
        pytest.skip("docintel.example.toml not written yet")
    cfg = load_config(EXAMPLE)
    # the example documents "every key, with its default"
    assert cfg == Config()
    assert load_config(None) == Config()
    written = tomllib.loads(EXAMPLE.read_text())

    def keys(tree: dict, prefix: str = "") -> set[str]:
        out: set[str] = set()
        for k, v in tree.items():
            out |= keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
        return out

    missing = keys(Config().model_dump()) - keys(written)
    assert not missing, f"docintel.example.toml does not show these keys: {sorted(missing)}"


def test_defaults():
    cfg = load_config()
    assert cfg.run.batch_size == "auto"  # resolved by the plan: 128 docs on CPU pools
    assert cfg.run.fixed_batch_size() == DEFAULT_BATCH_SIZE
    assert cfg.input.id_column == "doc_id"
    assert cfg.input.text_column == "text"
    assert cfg.sentencize.spacy_model == "blank:en"


def test_partial_file_keeps_other_defaults(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        "[run]\nbatch_size = 7\n\n[embed]\nmax_length = 128\n\n[resources.embed]\ncpus = 0.5\n"
    )
    cfg = load_config(path)
    assert cfg.run.batch_size == 7
    assert cfg.embed.max_length == 128
    assert cfg.resources.embed.cpus == 0.5
    assert cfg.resources.embed.replicas == "auto"  # sized to the cluster at the start
    assert cfg.classify == Config().classify


@pytest.mark.parametrize(
    ("toml", "name"),
    [
        ("[run]\nbatch_sise = 8\n", "batch_sise"),
        ("[runn]\nbatch_size = 8\n", "runn"),
        ("[resources.embed]\ncpus = 1.0\ngpus = 1\n", "gpus"),
        ("top_level_typo = 1\n", "top_level_typo"),
    ],
)
def test_unknown_key_raises_config_error_naming_it(tmp_path, toml, name):
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=re.escape(name)) as exc:
        load_config(path)
    assert str(path) in str(exc.value)


def test_bad_toml_raises_config_error_naming_the_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[run\nbatch_size = \n")
    with pytest.raises(ConfigError, match="not valid TOML") as exc:
        load_config(path)
    assert str(path) in str(exc.value)


def test_missing_file_raises_config_error(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_config(path)


def test_with_overrides_dotted_keys():
    base = Config()
    cfg = base.with_overrides(
        {"run.batch_size": 16, "embed.max_length": 64, "input.text_column": "body"}
    )
    assert cfg.run.batch_size == 16
    assert cfg.embed.max_length == 64
    assert cfg.input.text_column == "body"
    assert base.run.batch_size == "auto"  # the original is untouched (frozen)
    deep = base.with_overrides({"resources.embed.replicas": 2})
    assert deep.resources.embed.replicas == 2


def test_with_overrides_none_keeps_the_value(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[run]\nbatch_size = 9\n")
    cfg = load_config(path, {"run.batch_size": None, "run.run_id": "r7"})
    assert cfg.run.batch_size == 9
    assert cfg.run.run_id == "r7"


def test_override_of_unknown_leaf_raises_config_error():
    with pytest.raises(ConfigError, match=re.escape("run.batch_sise")):
        Config().with_overrides({"run.batch_sise": 3})


@pytest.mark.parametrize("key", ["runn.batch_size", "run.batch_size.value"])
def test_override_of_unknown_section_raises_config_error(key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        Config().with_overrides({key: 3})


def test_invalid_value_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"run\.batch_size"):
        Config().with_overrides({"run.batch_size": 0})
    with pytest.raises(ConfigError, match="command-line"):
        load_config(None, {"run.batch_size": 0})
    path = tmp_path / "c.toml"
    path.write_text("[run]\nbatch_size = 0\n")
    with pytest.raises(ConfigError, match=r"run\.batch_size") as exc:
        load_config(path)
    assert str(path) in str(exc.value)


@pytest.mark.parametrize(
    "override",
    [
        {"run.batch_size": "many"},
        {"sentencize.chunk_chars": 10},
        {"resources.embed.cpus": 0},
        {"input.text_column": "doc_id"},
    ],
)
def test_other_invalid_values_raise_config_error(override):
    with pytest.raises(ConfigError):
        Config().with_overrides(override)
