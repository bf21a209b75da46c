"""What an encoder folder is: a Hugging Face model folder, or a LoRA adapter over one.

The checks that say what is wrong with a folder (and how to fix it) before anything
heavy loads, the loader that merges an adapter into its base's weights (so inference
costs what the base costs), and the hidden size read without importing torch. Used by
the PyTorch runtime, the ONNX exporters and the driver's checks alike.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from docintel.pipeline.artefacts.paths import (
    ADAPTER_BASE_FILE,
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    STOCK,
    stock_encoder_dir,
)
from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.errors import ModelError

# Weights load from safetensors only: a tensor format that holds no code. A
# ``pytorch_model.bin`` is a pickle: torch's weights_only unpickler stops the known attacks
# but has been bypassed before (CVE-2025-32434), and a file it stops surfaced as a raw
# UnpicklingError whose text suggests ``weights_only=False``, i.e. running the file. So
# pickle weights are refused before anything loads, and a folder holding both kinds is
# loaded from its safetensors (``use_safetensors=True``), never from the pickle.
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")  # one file, or shards
_PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def is_adapter_dir(path: Path) -> bool:
    """Whether ``path`` holds a LoRA adapter (``docintel train --fine-tune --method lora``)
    rather than a whole encoder."""
    return (path / ADAPTER_CONFIG_FILE).is_file()


def adapter_base(path: Path) -> tuple[Path, str]:
    """The base encoder folder an adapter applies to, and the version it was trained on."""
    import json

    record = path / ADAPTER_BASE_FILE
    try:
        meta = json.loads(record.read_text())
        ref, version = str(meta["base"]), str(meta["base_version"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(
            f"adapter folder {path} has no readable {ADAPTER_BASE_FILE} naming its base "
            f'encoder ({{"base": ..., "base_version": ...}}); retrain it with '
            "`docintel train --fine-tune`"
        ) from e
    if ref == STOCK:
        return stock_encoder_dir(), version
    base = Path(ref).expanduser()
    return (base if base.is_absolute() else path / base), version


def check_encoder_dir(path: Path) -> None:
    """Fail with a clear message unless ``path`` holds a transformers encoder + tokenizer,
    or a LoRA adapter whose base encoder is there with the bytes it was trained on."""
    if not path.is_dir():
        raise ModelError(
            f"embedding model folder {path} does not exist; set [embed] model_path to a local "
            "Hugging Face model folder (config.json, tokenizer files, model.safetensors), "
            'a folder written by `docintel train --fine-tune`, or "stock"'
        )
    if not (path / "config.json").is_file():
        raise ModelError(
            f"embedding model folder {path} has no config.json; expected a "
            "Hugging Face model folder (config.json, tokenizer, weights)"
        )
    if is_adapter_dir(path):
        _check_adapter_dir(path)
        return
    if not any((path / w).is_file() for w in _WEIGHT_FILES):
        raise _no_safetensors(path)


def _no_safetensors(path: Path) -> ModelError:
    pickles = [w for w in _PICKLE_WEIGHTS if (path / w).is_file()]
    if not pickles:
        return ModelError(
            f"embedding model folder {path} has no weights; expected one of "
            f"{', '.join(_WEIGHT_FILES)}"
        )
    return ModelError(
        f"embedding model folder {path} has only pickle weights ({pickles[0]}); docintel "
        "loads safetensors only, because loading a pickle can run code it holds. If the "
        'folder comes from a source you trust, convert it once: python -c "from '
        f"transformers import AutoModel; AutoModel.from_pretrained('{path}')"
        f".save_pretrained('{path}')\" (writes model.safetensors); otherwise use "
        "another model"
    )


def _check_adapter_dir(path: Path) -> None:
    for name in (ADAPTER_WEIGHTS_FILE, *_TOKENIZER_FILES):
        if not (path / name).is_file():
            raise ModelError(
                f"adapter folder {path} has no {name}; expected the folder "
                "`docintel train --fine-tune` writes (adapter, base.json, tokenizer files)"
            )
    base, version = adapter_base(path)
    check_encoder_dir(base)
    actual = fingerprint(base)
    if actual != version:
        raise ModelError(
            f"the adapter {path} was trained on the base encoder {version}, but its base "
            f"{base} is now {actual}; restore that base or retrain the adapter with "
            "`docintel train --fine-tune`"
        )


def load_encoder(path: Path, **kwargs: Any) -> Any:
    """The fp32 transformers encoder in ``path`` (imports torch): a Hugging Face folder
    (fp16 weights are widened), or a base encoder with a LoRA adapter merged into its
    weights, so that inference costs what the base costs. ``kwargs`` go to the base's
    ``from_pretrained`` (e.g. ``attn_implementation``)."""
    import torch
    from transformers import AutoModel

    check_encoder_dir(path)
    try:
        if not is_adapter_dir(path):
            return AutoModel.from_pretrained(
                str(path), dtype=torch.float32, use_safetensors=True, **kwargs
            )
        import warnings

        from peft import PeftModel

        base = load_encoder(adapter_base(path)[0], **kwargs)
        with warnings.catch_warnings():  # peft calls a transformers API deprecated for v6
            warnings.simplefilter("ignore", FutureWarning)
            return PeftModel.from_pretrained(base, str(path)).merge_and_unload()
    except pickle.UnpicklingError as e:  # never expected: no pickle is loaded (see above)
        raise ModelError(
            f"refused to load {path}: its weights are a pickle that holds more than tensors; "
            "use a model folder with model.safetensors from a source you trust"
        ) from e
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ModelError(f"could not load a transformers encoder from {path}: {e}") from e


def embedding_dim(path: Path) -> int:
    """The encoder's hidden size, read from config.json without importing torch."""
    import json

    check_encoder_dir(path)
    cfg = json.loads((path / "config.json").read_text())
    for key in ("hidden_size", "d_model", "dim"):
        if key in cfg:
            return int(cfg[key])
    raise ModelError(f"{path / 'config.json'} names no hidden_size; is it an encoder model?")
