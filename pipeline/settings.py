"""The base of every config section, below the stages.

A built-in stage declares its own section (``[sentencize]``, ``[embed]``, ...) on
:class:`Settings`, next to its code, and names it in its registry declaration;
:mod:`docintel.pipeline.config` assembles the config tree from those declarations. Nothing
here imports a stage.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from docintel.pipeline.schema import ONNX_FP32

# The name of the bundled defaults wherever a model folder is asked for ([embed]
# model_path, [classify] model_dir, `docintel evaluate`, `docintel run --model`): the same
# as "" (the fine-tuned encoder and its head); "stock" names the stock pair.
DEFAULT_MODEL_NAME = "default"


class Settings(BaseModel):
    """A config section: frozen, and an unknown key is refused (naming the nearest one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def onnx_alias(v: Any) -> Any:
    """``cpu_runtime = "onnx"`` (its name before the backend keys): the key ``onnx-fp32``."""
    return ONNX_FP32 if v == "onnx" else v
