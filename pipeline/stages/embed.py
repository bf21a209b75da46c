"""Sentence embeddings from a BERT-family encoder (transformers + PyTorch).

Mean pooling over the attention mask, then L2 normalisation: the sentence-transformers
recipe for all-MiniLM-L6-v2. Sentences are sorted by token length and packed into
micro-batches under a padded-token budget, so padding stays small.

The encoder folder is a Hugging Face model folder (the stock MiniLM, any local encoder,
or one fully fine-tuned by `docintel train --fine-tune --method full`), or a LoRA adapter
(``--method lora``) that :func:`load_encoder` merges into its base's weights at load, so
inference costs what the base costs. Either way the version recorded on every row is the
fingerprint of the folder's files (an adapter's ``base.json`` pins its base's version).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from docintel.pipeline.artefacts import (
    ADAPTER_BASE_FILE,
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    STOCK,
    stock_encoder_dir,
)
from docintel.pipeline.config import EmbedConfig
from docintel.pipeline.errors import ModelError
from docintel.pipeline.schema import (
    BACKEND_CPU_FP32,
    BACKEND_GPU_BF16,
    BACKEND_GPU_FP16,
    BACKEND_GPU_SIM,
    EMBEDDING,
    N_TOKENS,
    TEXT,
    TRUNCATED,
)
from docintel.pipeline.stages.base import Placement, Stage, usable_cores
from docintel.pipeline.versions import fingerprint

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
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
        raise ModelError(
            f"embedding model folder {path} has no weights; expected one of "
            f"{', '.join(_WEIGHT_FILES)}"
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
            return AutoModel.from_pretrained(str(path), dtype=torch.float32, **kwargs)
        import warnings

        from peft import PeftModel

        base = load_encoder(adapter_base(path)[0], **kwargs)
        with warnings.catch_warnings():  # peft calls a transformers API deprecated for v6
            warnings.simplefilter("ignore", FutureWarning)
            return PeftModel.from_pretrained(base, str(path)).merge_and_unload()
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


# Sentences per tokenizer call and forward-pass plan: bounds the token ids and padding held
# at once (a batch of long documents can hold tens of thousands of sentences).
ENCODE_CHUNK = 4096
# Characters kept per token of max_length before tokenizing (256 tokens -> 16,384 chars):
# English averages ~4-5 characters per token, so this never cuts what the model would read,
# while a 1,000,000-character "sentence" is not tokenized whole.
MAX_CHARS_PER_TOKEN = 64


def pack_by_length(lengths: list[int], token_budget: int, max_items: int) -> list[list[int]]:
    """Indices sorted longest first, packed so that ``len(group) * longest <= token_budget``."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        size = len(current) + 1
        if current and (size > max_items or size * longest > token_budget):
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups


class Embedder(Stage):
    name: ClassVar[str] = "embed"
    input_columns: ClassVar[tuple[str, ...]] = (TEXT,)
    output_columns: ClassVar[tuple[str, ...]] = (EMBEDDING, N_TOKENS, TRUNCATED)

    def __init__(
        self, cfg: EmbedConfig, replicas: int = 1, placement: Placement | None = None
    ) -> None:
        self.cfg = cfg
        self.replicas = replicas
        self.placement = placement or Placement()
        self.device = "cpu"
        self.model: Any = None
        self.tokenizer: Any = None
        self.dim = 0

    def setup(self) -> None:
        path = self.cfg.resolved_model_path()
        check_encoder_dir(path)
        import torch
        import transformers
        from transformers import AutoTokenizer

        # Truncation is ours (flagged per sentence), so the tokenizer's over-length warning
        # is noise; so is the weight-loading progress bar in every actor's log.
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()

        threads = self.cfg.torch_threads or max(1, usable_cores() // self.replicas)
        torch.set_num_threads(threads)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as e:
            raise ModelError(f"could not load the tokenizer of {path}: {e}") from e
        self.model = load_encoder(path).eval()
        self._place(torch)
        self.dim = int(self.model.config.hidden_size)
        # never beyond what the tokenizer (and so the position table) was built for
        self.max_length = min(self.cfg.max_length, int(self.tokenizer.model_max_length))
        # how many special tokens the tokenizer puts before and after a text ([CLS] … [SEP])
        probe = self.tokenizer("a")["input_ids"]
        special = set(self.tokenizer.all_special_ids)
        self.n_lead = next(i for i, t in enumerate(probe) if t not in special)
        self.n_tail = next(i for i, t in enumerate(reversed(probe)) if t not in special)
        self.uses_token_types = "token_type_ids" in self.tokenizer.model_input_names
        self.version = fingerprint(path)

    def _place(self, torch: Any) -> None:
        """Cap a GPU replica at its fraction and use half precision; else fp32 on the CPU."""
        self.backend = BACKEND_CPU_FP32
        if not self.placement.wants_gpu:
            return
        if not torch.cuda.is_available():
            self.backend = BACKEND_GPU_SIM
            return
        torch.cuda.set_per_process_memory_fraction(self.placement.gpu_fraction)
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        self.model = self.model.to("cuda", dtype=dtype)
        self.device = "cuda"
        self.backend = BACKEND_GPU_BF16 if dtype == torch.bfloat16 else BACKEND_GPU_FP16

    @property
    def token_budget(self) -> int:
        """Padded tokens per forward pass: the CUDA budget on a card, else the CPU one."""
        return self.cfg.gpu_token_budget if self.device == "cuda" else self.cfg.token_budget

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Embed ``texts``: (float32 [n, dim] unit vectors, token counts, truncated flags)."""
        import torch

        if not texts:  # a batch whose documents have no sentences
            return np.zeros((0, self.dim), np.float32), np.zeros(0, np.int32), np.zeros(0, bool)
        full = self.tokenizer(texts, truncation=False)["input_ids"]
        limit = self.max_length
        truncated = np.array([len(x) > limit for x in full], dtype=bool)
        room = limit - self.n_lead - self.n_tail  # keep [CLS] … [SEP] around a cut body
        ids = [
            x if len(x) <= limit else x[: self.n_lead + room] + x[len(x) - self.n_tail :]
            for x in full
        ]
        lengths = [len(x) for x in ids]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        pad = self.tokenizer.pad_token_id or 0
        with torch.inference_mode():
            for group in pack_by_length(lengths, self.token_budget, self.cfg.max_microbatch):
                width = lengths[group[0]]
                input_ids = torch.full((len(group), width), pad, dtype=torch.long)
                mask = torch.zeros((len(group), width), dtype=torch.long)
                for row, i in enumerate(group):
                    input_ids[row, : lengths[i]] = torch.tensor(ids[i])
                    mask[row, : lengths[i]] = 1
                kwargs = {"input_ids": input_ids, "attention_mask": mask}
                if self.uses_token_types:
                    kwargs["token_type_ids"] = torch.zeros_like(input_ids)
                kwargs = {k: v.to(self.device) for k, v in kwargs.items()}
                mask = kwargs["attention_mask"]
                hidden = self.model(**kwargs).last_hidden_state
                m = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled.float(), p=2, dim=1)
                out[group] = pooled.cpu().numpy()
        return out, np.array(lengths, dtype=np.int32), truncated

    def __call__(self, table: pa.Table) -> pa.Table:
        """Embed every sentence, ENCODE_CHUNK sentences per tokenizer call (memory for
        token ids and padding stays bounded however many sentences a batch holds), each
        cut to MAX_CHARS_PER_TOKEN characters per token of max_length first: a sentence
        cut there is longer than the model reads anyway, and is flagged truncated."""
        texts = table[TEXT].to_pylist()
        cap = self.cfg.max_length * MAX_CHARS_PER_TOKEN
        parts = []
        for a in range(0, max(len(texts), 1), ENCODE_CHUNK):
            chunk = texts[a : a + ENCODE_CHUNK]
            cut = np.array([len(t) > cap for t in chunk], dtype=bool)
            vectors, n_tokens, truncated = self.encode([t[:cap] for t in chunk])
            parts.append((vectors, n_tokens, truncated | cut))
        vectors = np.concatenate([v for v, _, _ in parts])
        n_tokens = np.concatenate([n for _, n, _ in parts])
        truncated = np.concatenate([t for _, _, t in parts])
        flat = pa.array(vectors.reshape(-1), type=pa.float32())
        emb = pa.FixedSizeListArray.from_arrays(flat, self.dim)
        for name, col in (
            (EMBEDDING, emb),
            (N_TOKENS, pa.array(n_tokens)),
            (TRUNCATED, pa.array(truncated)),
        ):
            table = table.append_column(name, col)
        return table

    def teardown(self) -> None:
        self.model = None
        self.tokenizer = None
