"""Encoder weights load from safetensors only (issue 20, item 12).

A crafted ``pytorch_model.bin`` (a pickle whose payload would create a file when
unpickled) used to reach torch.load: its weights_only unpickler blocked it, but the run
died with a raw UnpicklingError traceback whose text suggests ``weights_only=False``.
Now such a folder is a model error (exit 2) before anything loads, and a folder with
both kinds of weights is loaded from its safetensors, never from the pickle.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from docintel.pipeline.config import EmbedConfig
from docintel.pipeline.errors import ModelError
from docintel.pipeline.exitcodes import ExitCode, exit_code
from docintel.pipeline.stages.embed import Embedder, check_encoder_dir, load_encoder

TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
TINY = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 8}  # fmt: skip


class _Payload:
    """Unpickled, it opens (creates) ``marker``: proof that the pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def _folder(root: Path, *, safetensors: bool) -> tuple[Path, Path]:
    """A model folder with a malicious pytorch_model.bin (and a real tiny BERT in
    model.safetensors when asked), the stock tokenizer; and the payload's marker."""
    import torch
    from transformers import BertConfig, BertModel

    folder, marker = root / "model", root / "PAYLOAD-RAN"
    stock = EmbedConfig().resolved_model_path()
    vocab = json.loads((stock / "config.json").read_text())["vocab_size"]
    config = BertConfig(vocab_size=vocab, **TINY)
    if safetensors:
        BertModel(config).save_pretrained(folder)
        assert (folder / "model.safetensors").is_file()
    else:
        folder.mkdir()
        config.to_json_file(folder / "config.json")
    for name in TOKENIZER:
        if (stock / name).is_file():
            shutil.copy(stock / name, folder / name)
    torch.save(
        {"embeddings.word_embeddings.weight": _Payload(marker)}, folder / "pytorch_model.bin"
    )
    return folder, marker


def test_pickle_weights_are_a_model_error_before_anything_loads(tmp_path: Path) -> None:
    folder, marker = _folder(tmp_path, safetensors=False)
    embedder = Embedder(EmbedConfig(model_path=str(folder)))
    loads = (lambda: check_encoder_dir(folder), lambda: load_encoder(folder), embedder.setup)
    for load in loads:
        with pytest.raises(ModelError) as exc:
            load()
        message = str(exc.value)
        assert "pytorch_model.bin" in message and "safetensors" in message, message
        assert str(folder) in message
        assert "weights_only" not in message  # never the advice to run the pickle
        assert exit_code(exc.value) == ExitCode.USAGE  # exit 2, before any work
    assert not marker.exists()


def test_a_folder_with_both_kinds_loads_the_safetensors_only(tmp_path: Path) -> None:
    folder, marker = _folder(tmp_path, safetensors=True)
    check_encoder_dir(folder)
    model = load_encoder(folder)
    assert model.config.hidden_size == TINY["hidden_size"]
    assert not marker.exists()
