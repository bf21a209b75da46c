"""Named models: 'default' and 'stock' resolve to the bundled models of the installed
package (never the checkout path) wherever a model folder is asked for; a folder from
`docintel train --fine-tune` brings its own encoder to `docintel run --model`."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pytest

from docintel.jobs.cli_models import model_overrides, resolve_model
from docintel.pipeline.config import ClassifyConfig, EmbedConfig, load_config
from docintel.pipeline.errors import UsageError

PACKAGE = Path(str(files("docintel.models")))


def test_default_and_stock_are_the_bundled_models() -> None:
    head, encoder = resolve_model("default")
    assert head == PACKAGE / "finsent_ft" and (head / "model.keras").is_file()
    assert encoder == "default"
    assert EmbedConfig(model_path="default").resolved_model_path() == head / "encoder"
    assert ClassifyConfig(model_dir="default").resolved_model_dir() == head
    assert ClassifyConfig(model_dir="").resolved_model_dir() == head
    stock, stock_encoder = resolve_model("stock")
    assert stock == PACKAGE / "finsent" and stock_encoder == "stock"


def test_run_model_overrides_follow_the_folder_layout(tmp_path: Path) -> None:
    head_only = tmp_path / "head"
    head_only.mkdir()
    assert model_overrides(str(head_only)) == {"classify.model_dir": str(head_only)}
    tuned = tmp_path / "tuned"
    (tuned / "encoder").mkdir(parents=True)
    overrides = model_overrides(str(tuned))
    assert overrides == {
        "classify.model_dir": str(tuned),
        "embed.model_path": str(tuned / "encoder"),
    }
    cfg = load_config(None, overrides)
    assert cfg.embed.resolved_model_path() == tuned / "encoder"
    assert model_overrides(None) == {}
    cfg = load_config(None, model_overrides("stock"))
    assert cfg.classify.resolved_model_dir() == PACKAGE / "finsent"


def test_a_model_that_is_not_a_folder_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="'default' or 'stock'"):
        resolve_model(str(tmp_path / "nope"))
