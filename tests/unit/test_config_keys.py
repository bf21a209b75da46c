"""An unknown config key is a usage error naming the key and its section, with the
nearest valid key (or the section's keys when none is near), never pydantic's wording."""

from __future__ import annotations

from pathlib import Path

import pytest

from docintel.pipeline.config import load_config
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.exitcodes import exit_code


def test_unknown_keys_suggest_the_nearest_valid_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[run]\nbatchsize = 3\n[classify]\nmodel_dirr = "x"\n[embed]\nzzz = 1\n')
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    text = str(e.value)
    assert "unknown key 'batchsize' in [run]; did you mean 'batch_size'?" in text
    assert "unknown key 'model_dirr' in [classify]; did you mean 'model_dir'?" in text
    assert "unknown key 'zzz' in [embed]; valid keys: model_path," in text
    assert "Extra inputs are not permitted" not in text
    assert exit_code(e.value) == 2


def test_unknown_section_names_the_top_level(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[embedd]\nmodel_path = 'x'\n")
    with pytest.raises(
        ConfigError, match=r"unknown key 'embedd' in the top level; did you mean 'embed'\?"
    ):
        load_config(cfg)
