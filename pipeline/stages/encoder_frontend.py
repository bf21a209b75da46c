"""The encoder's front and back end, shared by every runtime that runs the model.

Tokenization, truncation, length-sorted packing into micro-batches, and mean pooling with
L2 normalisation (the sentence-transformers recipe for all-MiniLM-L6-v2) live here once.
A runtime (encoder_runtimes.py) only maps padded token ids to hidden states, so every
runtime cuts, counts and pools a sentence exactly alike: token counts and truncation
flags are identical across runtimes by construction, and vectors differ only by what the
runtimes compute (the bits of fp32 arithmetic, or int8 weights).

Tokenization is the ``tokenizers`` fast tokenizer for every runtime: no torch or
transformers import is needed to tokenize, so an ONNX replica stays light.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from docintel.pipeline.errors import ModelError
from docintel.pipeline.stages.embed_settings import EmbedConfig

# Sentences per tokenizer call and forward-pass plan: bounds the token ids and padding held
# at once (a batch of long documents can hold tens of thousands of sentences).
ENCODE_CHUNK = 4096
# Characters kept per token of max_length before tokenizing (256 tokens -> 16,384 chars):
# English averages ~4-5 characters per token, so this never cuts what the model would read,
# while a 1,000,000-character "sentence" is not tokenized whole.
MAX_CHARS_PER_TOKEN = 64

TOKENIZER_FILE = "tokenizer.json"  # the fast tokenizer, serialised by `tokenizers`
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # model_max_length, pad_token

# A runtime's forward pass: (input_ids int64 [b, w], attention_mask int64 [b, w]) ->
# last hidden state float32 [b, w, dim].
Forward = Callable[[np.ndarray, np.ndarray], np.ndarray]
Encoded = tuple[np.ndarray, np.ndarray, np.ndarray]  # (vectors, n_tokens, truncated)


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


def mean_pool_normalize(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over unmasked tokens, then L2 normalisation (sentence-transformers recipe)."""
    m = mask[..., None].astype(np.float32)
    pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    norm = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return (pooled / norm).astype(np.float32)


def empty_encoding(dim: int) -> Encoded:
    """What encoding no texts gives (a batch whose documents have no sentences)."""
    return np.zeros((0, dim), np.float32), np.zeros(0, np.int32), np.zeros(0, bool)


def _token_name(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_fast_tokenizer(tok_dir: Path) -> tuple[Any, int | None, int | None]:
    """``(tokenizers.Tokenizer, model_max_length or None, pad id or None)`` of ``tok_dir``.

    From tokenizer.json when the folder has one (what every runtime's folder holds), else
    from the fast tokenizer transformers builds from the folder's other files, so any
    local Hugging Face model folder still works.
    """
    try:
        if (tok_dir / TOKENIZER_FILE).is_file():
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tok_dir / TOKENIZER_FILE))
            cfg_file = tok_dir / TOKENIZER_CONFIG_FILE
            tcfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
            limit = tcfg.get("model_max_length")
            pad_token = _token_name(tcfg.get("pad_token", "[PAD]"))
            pad = tok.token_to_id(pad_token) if pad_token else None
            return tok, (int(limit) if limit is not None else None), pad
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(tok_dir))
        return hf.backend_tokenizer, int(hf.model_max_length), hf.pad_token_id
    except Exception as e:  # tokenizers raises plain Exception on a malformed file
        raise ModelError(
            f"could not load the tokenizer of {tok_dir}: {e}; expected a fast tokenizer "
            f"({TOKENIZER_FILE}, or files transformers can build one from)"
        ) from e


class EncoderFrontend:
    """Tokenization, truncation, packing and pooling for any encoder runtime.

    ``__init__`` loads the tokenizer (cheap: no model); ``encode`` runs a runtime's
    forward pass over the packed micro-batches. Budgets are arguments, not state, so one
    front end serves replicas (or tests) that pack differently.
    """

    def __init__(self, tok_dir: Path, cfg: EmbedConfig) -> None:
        self.cfg = cfg
        self.tok, limit, pad = load_fast_tokenizer(tok_dir)
        self.tok.no_truncation()  # truncation is ours, flagged per sentence
        self.tok.no_padding()
        # never beyond what the tokenizer (and so the position table) was built for
        self.max_length = min(cfg.max_length, limit or cfg.max_length)
        # how many special tokens the tokenizer puts before and after a text ([CLS] … [SEP])
        probe = self.tok.encode("a").special_tokens_mask
        self.n_lead = probe.index(0)
        self.n_tail = list(reversed(probe)).index(0)
        self.pad = pad or 0  # masked out: any id gives the same vectors

    def prepare(self, texts: list[str]) -> tuple[list[list[int]], np.ndarray]:
        """Token ids cut to ``max_length`` (keeping [CLS] … [SEP] around a cut body), and
        which texts were cut."""
        full = [e.ids for e in self.tok.encode_batch(texts)]
        limit = self.max_length
        truncated = np.array([len(x) > limit for x in full], dtype=bool)
        room = limit - self.n_lead - self.n_tail
        ids = [
            x if len(x) <= limit else x[: self.n_lead + room] + x[len(x) - self.n_tail :]
            for x in full
        ]
        return ids, truncated

    def batches(
        self, ids: list[list[int]], token_budget: int | None = None, max_items: int | None = None
    ) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
        """(row indices, input_ids int64 [b, w], attention_mask int64 [b, w]) per batch,
        packed longest first under ``token_budget`` padded tokens (default: the config's
        CPU budget) and ``max_items`` rows."""
        budget = token_budget or self.cfg.token_budget
        lengths = [len(x) for x in ids]
        out = []
        for group in pack_by_length(lengths, budget, max_items or self.cfg.max_microbatch):
            width = lengths[group[0]]
            input_ids = np.full((len(group), width), self.pad, dtype=np.int64)
            mask = np.zeros((len(group), width), dtype=np.int64)
            for row, i in enumerate(group):
                input_ids[row, : lengths[i]] = ids[i]
                mask[row, : lengths[i]] = 1
            out.append((group, input_ids, mask))
        return out

    def encode(
        self, texts: list[str], forward: Forward, dim: int, token_budget: int, max_items: int
    ) -> Encoded:
        """Embed ``texts``: (float32 [n, dim] unit vectors, token counts, truncated flags)."""
        if not texts:
            return empty_encoding(dim)
        ids, truncated = self.prepare(texts)
        out = np.zeros((len(texts), dim), dtype=np.float32)
        for group, input_ids, mask in self.batches(ids, token_budget, max_items):
            hidden = np.asarray(forward(input_ids, mask), dtype=np.float32)
            out[group] = mean_pool_normalize(hidden, mask)
        return out, np.array([len(x) for x in ids], dtype=np.int32), truncated

    def encode_chunked(
        self, texts: list[str], encode: Callable[[list[str]], Encoded], chunk: int = 0
    ) -> Encoded:
        """``encode`` (a stage's, over this front end) on any number of texts, ``chunk``
        (default ENCODE_CHUNK) per call, so memory for token ids and padding stays bounded
        however many sentences a batch holds; each text cut to MAX_CHARS_PER_TOKEN
        characters per token of max_length first: a text cut there is longer than the
        model reads anyway, and is flagged truncated."""
        step = chunk or ENCODE_CHUNK
        cap = self.cfg.max_length * MAX_CHARS_PER_TOKEN
        parts = []
        for a in range(0, max(len(texts), 1), step):
            part = texts[a : a + step]
            cut = np.array([len(t) > cap for t in part], dtype=bool)
            vectors, n_tokens, truncated = encode([t[:cap] for t in part])
            parts.append((vectors, n_tokens, truncated | cut))
        return (
            np.concatenate([v for v, _, _ in parts]),
            np.concatenate([n for _, n, _ in parts]),
            np.concatenate([t for _, _, t in parts]),
        )
