"""Fine-tune the encoder end to end on labelled sentences (PyTorch): `docintel train
--fine-tune`.

The recipe: mean pooling over the attention mask (the embed stage's own pooling) and one
linear layer on top, class-weighted cross-entropy, AdamW with linear warm-up and decay,
batches of 32 sentences cut at 64 tokens, a fixed number of epochs. After every epoch the
held-out split (carved from the training file by the caller, never the validation file) is
scored, and the epoch with the best held-out macro-F1 is the one kept. Two methods:

* ``full``: every weight of the encoder is trained; writes a merged Hugging Face folder
  (fp16 safetensors: 45 MB for MiniLM) that any transformers loader opens;
* ``lora``: low-rank adapters (``peft``) on every linear layer of the encoder, the base
  frozen; writes the adapter only (a few MB) with ``base.json`` naming the base, merged
  into the base's weights when the embed stage loads it (no cost at inference).

By default the linear layer is a training device only: the classifier the pipeline runs is
the Keras head that :func:`docintel.pipeline.offline.train.train` fits afterwards on
embeddings of the saved encoder, computed by the embed stage itself. With ``keep_layer``
(``--head joint``) the best epoch's layer is kept instead: returned under
:data:`JOINT_LAYER` and exported to Keras. It was trained on the mean-pooled vector, the
embed stage emits that vector's unit vector, so the export multiplies the unit vector by
one constant, the median norm of the held-out mean-pooled vectors (the fine-tuned MiniLM's
norms lie within +-12% of it, and the labels on the unit vectors agree with the layer's own
on 99.9-100% of sentences: BENCHMARKS.md). With ``cosine_scale`` > 0 (``--head cosine``)
the layer is trained on what the embed stage emits, the unit vector times that fixed scale
(a cosine classifier), and kept likewise.
Seeds are fixed (weights, order, dropout): the same data, seed and machine give the same
encoder.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from docintel.pipeline.artefacts.paths import (
    ADAPTER_BASE_FILE,
    ADAPTER_CONFIG_FILE,
    STOCK,
    stock_encoder_dir,
)
from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.errors import ModelError
from docintel.pipeline.offline.metrics import metrics
from docintel.pipeline.stages.base import usable_cores
from docintel.pipeline.stages.embed import check_encoder_dir, load_encoder

Method = Literal["full", "lora"]
# LoRA won on macro-F1 per minute of training and per MB shipped (BENCHMARKS.md,
# "Fine-tuned encoder"): see DEFAULT_METHOD's measurement there.
DEFAULT_METHOD: Method = "lora"
# AdamW peak learning rates: 5e-5 is the usual rate for fully fine-tuning a BERT; adapters
# start from zero and train a hundredth of the weights, so they take a 10x higher one.
FULL_LEARNING_RATE = 5e-5
LORA_LEARNING_RATE = 5e-4
# Files of a tokenizer, copied byte for byte from the base into the written encoder.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
# --head cosine: the scale s of the cosine classifier. 16 = about 4x the norm of the stock
# MiniLM's unnormalised mean-pooled vector (4.2 +- 1.1 on sent_valid), which the usual
# recipe's linear layer sees: headroom for confident logits now that the encoder cannot
# grow the norm, the low end of the scales cosine-softmax classifiers use (16-30).
COSINE_SCALE = 16.0
JOINT_LAYER = "joint_layer"  # fine_tune's record: the kept layer (removed before writing)
EVAL_BATCH = 128  # held-out sentences per forward pass (no gradients: memory is small)


@dataclass(frozen=True)
class FineTuneParams:
    """Hyperparameters of the fine-tuning (the defaults are the shipped model's)."""

    method: Method = DEFAULT_METHOD
    epochs: int = 2
    batch_size: int = 32
    max_length: int = 64  # tokens; financial headlines are ~20-30, the longest ~60
    learning_rate: float = 0.0  # 0 = the method's default (FULL_ / LORA_LEARNING_RATE)
    warmup_fraction: float = 0.1  # of all steps, linear warm-up, then linear decay to 0
    weight_decay: float = 0.01  # not on biases and LayerNorm weights
    max_grad_norm: float = 1.0
    lora_rank: int = 16
    lora_alpha: int = 32  # scaling alpha / rank = 2
    lora_dropout: float = 0.1
    fp16_weights: bool = True  # method full: save fp16 safetensors (half the MB)
    cosine_scale: float = 0.0  # > 0: the layer sees the unit vector times this; kept
    keep_layer: bool = False  # the layer (on the mean-pooled vector) is kept as the head
    # > 0: geometry kept (`--preserve`): the loss adds this weight times the mean of
    # 1 - cos(tuned unit vector, the base encoder's unit vector of the same text), the
    # base's vectors computed once before the first step; the encoder learns the labels
    # while staying close to the base's general-purpose geometry (search, zero-shot, heads)
    preserve: float = 0.0
    # with preserve: the drift is measured outside the span of the linear layer's class
    # directions (n_classes of the hidden size), which the encoder may use freely
    preserve_free: bool = False
    # > 0: only the encoder's top K transformer layers learn (LoRA: adapters on their
    # linear layers alone; full: the other weights frozen): the layers below keep the
    # base's weights, so a branch (the base's vector and the tuned one) can share them
    top_layers: int = 0
    device: str = "cpu"  # "cuda": train on the GPU (not bitwise the CPU's result)

    def lr(self) -> float:
        if self.learning_rate:
            return self.learning_rate
        return FULL_LEARNING_RATE if self.method == "full" else LORA_LEARNING_RATE


class Monitor(Protocol):
    """What the caller shows while fine-tuning (the CLI: a rich progress bar)."""

    def start(self, total_steps: int, steps_per_epoch: int) -> None: ...

    def step(self, epoch: int, loss: float, examples_per_s: float) -> None: ...

    def epoch(self, record: dict[str, Any]) -> None: ...


class _Quiet:
    def start(self, total_steps: int, steps_per_epoch: int) -> None:
        pass

    def step(self, epoch: int, loss: float, examples_per_s: float) -> None:
        pass

    def epoch(self, record: dict[str, Any]) -> None:
        pass


def base_reference(base: Path) -> str:
    """How an adapter's base.json names its base: "stock" for the stock MiniLM (portable
    across machines and installs), else the base folder's absolute path."""
    with contextlib.suppress(OSError):
        if base.resolve() == stock_encoder_dir().resolve():
            return STOCK
    return str(base.resolve())


@contextlib.contextmanager
def _deterministic(seed: int, threads: int) -> Iterator[None]:
    """Fixed seeds and deterministic kernels for the duration; restores the settings."""
    import random

    import torch

    was = torch.are_deterministic_algorithms_enabled()
    old_threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed)  # for libraries that draw from numpy's global generator
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)
        torch.set_num_threads(old_threads)


def _tokenize(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[list[int]]:
    return tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]


def _pad(ids: list[list[int]], pad: int) -> tuple[Any, Any]:
    import torch

    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, x in enumerate(ids):
        input_ids[row, : len(x)] = torch.tensor(x)
        mask[row, : len(x)] = 1
    return input_ids, mask


class _Tuner:
    """The encoder with mean pooling and a linear layer: what gets trained."""

    def __init__(
        self,
        encoder: Any,
        n_classes: int,
        pad: int,
        seed: int,
        scale: float = 0.0,
        device: str = "cpu",
    ) -> None:
        import torch

        self.encoder = encoder.to(device)
        self.device = device
        self.pad = pad
        self.scale = scale  # > 0: a cosine classifier on the embed stage's unit vectors
        gen = torch.Generator().manual_seed(seed)
        hidden = int(encoder.config.hidden_size)
        self.linear = torch.nn.Linear(hidden, n_classes)
        with torch.no_grad():  # seeded init, independent of anything run before
            bound = 1 / math.sqrt(hidden)
            self.linear.weight.uniform_(-bound, bound, generator=gen)
            self.linear.bias.uniform_(-bound, bound, generator=gen)
        self.linear.to(device)

    def pooled(self, ids: list[list[int]]) -> Any:
        """The mean-pooled vectors (not normalised) of the token id lists."""
        import torch

        input_ids, mask = (t.to(self.device) for t in _pad(ids, self.pad))
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=mask, token_type_ids=torch.zeros_like(input_ids)
        ).last_hidden_state
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)

    def logits(self, ids: list[list[int]]) -> Any:
        return self.head(self.pooled(ids))

    def head(self, pooled: Any) -> Any:
        """The linear layer's logits of mean-pooled vectors."""
        import torch

        if self.scale > 0:
            pooled = torch.nn.functional.normalize(pooled, dim=1) * self.scale
        return self.linear(pooled)

    def layer(self) -> dict[str, Any]:
        """The linear layer as the classify stage needs it: weight [classes, dim], bias,
        and the scale the unit vector is multiplied by (0 until :func:`_median_norm` sets
        it, for a layer trained on the mean-pooled vector)."""
        weight = self.linear.weight.detach().cpu().numpy().astype(np.float32)
        bias = self.linear.bias.detach().cpu().numpy().astype(np.float32)
        return {"weight": weight.copy(), "bias": bias.copy(), "scale": self.scale}

    def trainable(self) -> list[tuple[str, Any]]:
        named = [(f"encoder.{n}", p) for n, p in self.encoder.named_parameters()]
        named += [(f"linear.{n}", p) for n, p in self.linear.named_parameters()]
        return [(n, p) for n, p in named if p.requires_grad]

    def train(self, on: bool) -> None:
        self.encoder.train(on)
        self.linear.train(on)


def _hidden_layers(encoder: Any, top: int) -> tuple[str, Any]:
    """The name and the module list of the encoder's transformer layers (the list with
    ``num_hidden_layers`` entries: ``encoder.layer`` in a BERT); ``top`` is checked
    against their number."""
    import torch

    n = int(encoder.config.num_hidden_layers)
    if not 0 < top <= n:
        raise ModelError(f"top_layers {top}: the encoder has {n} transformer layers (1-{n})")
    for name, module in encoder.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return name, module
    raise ModelError(f"found no list of {n} transformer layers in {type(encoder).__name__}")


def _lora_targets(encoder: Any, top: int) -> dict[str, Any]:
    """LoraConfig's target arguments: every linear layer but the pooler's; with ``top``,
    those of the top ``top`` transformer layers only (peft needs their names listed)."""
    import torch

    if not top:  # attention q/k/v/output and both FFN projections; the pooler is unused
        return {"target_modules": "all-linear", "exclude_modules": r".*pooler.*"}
    name, layers = _hidden_layers(encoder, top)
    linear = {n for n, m in layers[0].named_modules() if isinstance(m, torch.nn.Linear)}
    n = len(layers)
    return {
        "target_modules": sorted(linear),
        "layers_to_transform": list(range(n - top, n)),
        "layers_pattern": name.rsplit(".", 1)[-1],
    }


def _freeze_below(encoder: Any, top: int) -> None:
    """Full fine-tuning of the top ``top`` layers: every other weight stops learning."""
    _, layers = _hidden_layers(encoder, top)
    learning = {id(p) for layer in layers[len(layers) - top :] for p in layer.parameters()}
    for p in encoder.parameters():
        p.requires_grad_(id(p) in learning)


def _with_lora(encoder: Any, params: FineTuneParams, base_ref: str) -> Any:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=params.lora_rank,
        lora_alpha=params.lora_alpha,
        lora_dropout=params.lora_dropout,
        bias="none",
        **_lora_targets(encoder, params.top_layers),
    )
    with warnings.catch_warnings():  # peft calls a transformers API deprecated for v6
        warnings.simplefilter("ignore", FutureWarning)
        model = get_peft_model(encoder, config)
    # what adapter_config.json names as base (informational: base.json is what loads it),
    # never this machine's path of the stock MiniLM
    model.peft_config["default"].base_model_name_or_path = base_ref
    return model


def _length_batches(ids: list[list[int]]) -> Iterator[list[int]]:
    """Row indices of ``ids`` in batches of EVAL_BATCH, shortest first (little padding)."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for a in range(0, len(order), EVAL_BATCH):
        yield order[a : a + EVAL_BATCH]


def _median_norm(tuner: _Tuner, ids: list[list[int]]) -> float:
    """The median norm of the mean-pooled vectors of ``ids`` (the held-out sentences):
    the constant a layer trained on those vectors is exported with (``keep_layer``)."""
    import torch

    tuner.train(False)
    norms = []
    with torch.inference_mode():
        for rows in _length_batches(ids):
            pooled = tuner.pooled([ids[i] for i in rows])
            norms.append(torch.linalg.vector_norm(pooled.float(), dim=1).cpu().numpy())
    return float(np.median(np.concatenate(norms)))


def _optimizer(tuner: _Tuner, params: FineTuneParams, total_steps: int) -> tuple[Any, Any]:
    import torch
    from transformers import get_linear_schedule_with_warmup

    decay, no_decay = [], []
    for name, p in tuner.trainable():
        (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": params.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=params.lr(),
    )
    warmup = max(1, round(total_steps * params.warmup_fraction))
    return opt, get_linear_schedule_with_warmup(opt, warmup, total_steps)


def _evaluate(
    tuner: _Tuner, ids: list[list[int]], y: np.ndarray, weight: Any, names: list[str]
) -> dict[str, float]:
    """Held-out loss (class-weighted, as trained), macro-F1 and accuracy of the linear layer."""
    import torch

    tuner.train(False)
    logits = torch.zeros((len(ids), tuner.linear.out_features))
    with torch.inference_mode():
        for rows in _length_batches(ids):
            logits[rows] = tuner.logits([ids[i] for i in rows]).float().cpu()
    target = torch.as_tensor(y)
    loss = torch.nn.functional.cross_entropy(logits, target, weight=weight.cpu())
    m = metrics(y, logits.argmax(1).numpy(), names)
    tuner.train(True)
    return {"loss": float(loss), "macro_f1": m["macro_f1"], "accuracy": m["accuracy"]}


@dataclass
class _Loop:
    """What every training step needs: the model, its optimiser, the data."""

    tuner: _Tuner
    opt: Any
    schedule: Any
    ids: list[list[int]]
    y: Any  # int64 tensor of every row's class
    weight: Any  # per-class loss weights
    params: FineTuneParams
    monitor: Monitor
    teacher: Any = None  # params.preserve > 0: the base's unit vectors of every row

    def loss(self, rows: np.ndarray) -> Any:
        """The step's loss: class-weighted cross-entropy, plus the geometry term."""
        import torch

        pooled = self.tuner.pooled([self.ids[i] for i in rows])
        index = torch.as_tensor(rows, device=self.tuner.device)
        loss = torch.nn.functional.cross_entropy(
            self.tuner.head(pooled), self.y[index], weight=self.weight
        )
        if self.teacher is None:
            return loss
        moved = torch.nn.functional.normalize(pooled.float(), dim=1) - self.teacher[index]
        if self.params.preserve_free:  # the layer's own directions may move freely
            basis, _ = torch.linalg.qr(self.tuner.linear.weight.detach().float().T)
            moved = moved - (moved @ basis) @ basis.T
        # for unit vectors 1 - cos = |u - t|^2 / 2
        return loss + self.params.preserve * (moved.square().sum(1) / 2).mean()

    def epoch(self, epoch: int, order: np.ndarray) -> tuple[list[float], float]:
        """One pass over ``order`` (row indices); the step losses and examples/s."""
        import torch

        t0, seen, losses = time.perf_counter(), 0, []
        trainable = [p for _, p in self.tuner.trainable()]
        for a in range(0, len(order), self.params.batch_size):
            rows = order[a : a + self.params.batch_size]
            loss = self.loss(rows)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, self.params.max_grad_norm)
            self.opt.step()
            self.schedule.step()
            seen += len(rows)
            losses.append(float(loss.detach()))
            self.monitor.step(epoch, losses[-1], seen / (time.perf_counter() - t0))
        return losses, seen / (time.perf_counter() - t0)


def _build_loop(
    texts: Sequence[str],
    y: np.ndarray,
    train_idx: np.ndarray,
    names: list[str],
    base: Path,
    params: FineTuneParams,
    seed: int,
    monitor: Monitor | None,
) -> tuple[_Loop, str]:
    """Load the tokenizer and the encoder (wrapped in adapters for LoRA), put the linear
    layer on top, tokenize every text; the training loop and how base.json names the base."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    encoder = load_encoder(base)
    base_ref = base_reference(base)
    if params.method == "lora":
        encoder = _with_lora(encoder, params, base_ref)
    elif params.top_layers:
        _freeze_below(encoder, params.top_layers)
    pad = tokenizer.pad_token_id or 0
    tuner = _Tuner(encoder, len(names), pad, seed, params.cosine_scale, params.device)
    counts = np.bincount(y[train_idx], minlength=len(names))
    total = math.ceil(len(train_idx) / params.batch_size) * params.epochs
    ids = _tokenize(tokenizer, texts, params.max_length)
    loop = _Loop(
        tuner,
        *_optimizer(tuner, params, total),
        ids=ids,
        y=torch.as_tensor(y, device=params.device),
        weight=torch.as_tensor(  # "balanced", as the Keras head
            len(train_idx) / (len(names) * np.maximum(counts, 1)),
            dtype=torch.float32,
            device=params.device,
        ),
        params=params,
        monitor=monitor or _Quiet(),
        teacher=_teacher(tuner, ids, train_idx) if params.preserve > 0 else None,
    )
    return loop, base_ref


def _teacher(tuner: _Tuner, ids: list[list[int]], train_idx: np.ndarray) -> Any:
    """The unit vectors of the training texts (rows ``train_idx``; the others stay zero)
    before the first step: the base encoder's own (new LoRA adapters start at zero; a full
    fine-tune starts from the base's weights)."""
    import torch

    tuner.train(False)
    out = torch.zeros((len(ids), tuner.linear.in_features), device=tuner.device)
    rows_of = np.asarray(train_idx)
    with torch.inference_mode():
        for batch in _length_batches([ids[i] for i in rows_of]):
            pooled = tuner.pooled([ids[rows_of[j]] for j in batch]).float()
            index = torch.as_tensor(rows_of[batch], device=tuner.device)
            out[index] = torch.nn.functional.normalize(pooled, dim=1)
    tuner.train(True)
    return out.clone()  # outside inference mode: usable in the autograd graph


def _epoch_record(
    epoch: int, losses: list[float], speed: float, held: dict[str, float], t_epoch: float
) -> dict[str, Any]:
    """One epoch's entry of the training record (``t_epoch``: when the epoch started)."""
    return {
        "epoch": epoch,
        "train_loss": float(np.mean(losses)),
        "step_losses": [round(v, 5) for v in losses],
        "holdout_loss": held["loss"],
        "holdout_macro_f1": held["macro_f1"],
        "holdout_accuracy": held["accuracy"],
        "examples_per_s": round(speed, 1),
        "seconds": round(time.perf_counter() - t_epoch, 1),
    }


def _train_epochs(
    loop: _Loop,
    y: np.ndarray,
    train_idx: np.ndarray,
    hold_idx: np.ndarray,
    names: list[str],
    seed: int,
) -> tuple[list[dict[str, Any]], int]:
    """Every epoch: a shuffled pass over ``train_idx``, then the held-out scores; leaves the
    weights of the epoch with the best held-out macro-F1 in the model. Returns the epochs'
    records and the best epoch."""
    import torch

    tuner, params = loop.tuner, loop.params
    hold_ids = [loop.ids[i] for i in hold_idx]
    order_gen = torch.Generator().manual_seed(seed)
    records: list[dict[str, Any]] = []
    best: dict[str, Any] = {"f1": -1.0, "epoch": 0, "state": None}
    steps_per_epoch = math.ceil(len(train_idx) / params.batch_size)
    loop.monitor.start(steps_per_epoch * params.epochs, steps_per_epoch)
    tuner.train(True)
    for epoch in range(1, params.epochs + 1):
        t_epoch = time.perf_counter()
        order = train_idx[torch.randperm(len(train_idx), generator=order_gen).numpy()]
        losses, speed = loop.epoch(epoch, order)
        held = _evaluate(tuner, hold_ids, y[hold_idx], loop.weight, names)
        rec = _epoch_record(epoch, losses, speed, held, t_epoch)
        records.append(rec)
        loop.monitor.epoch(rec)
        if held["macro_f1"] > best["f1"]:
            state = {n: p.detach().clone() for n, p in tuner.trainable()}
            best.update(f1=held["macro_f1"], epoch=epoch, state=state)
    with torch.no_grad():  # the best epoch's weights back, the linear layer's included
        for n, p in tuner.trainable():
            p.copy_(best["state"][n])
    tuner.train(False)
    return records, best["epoch"]


def fine_tune(
    texts: Sequence[str],
    y: np.ndarray,
    train_idx: np.ndarray,
    hold_idx: np.ndarray,
    names: list[str],
    base: Path,
    out: Path,
    params: FineTuneParams | None = None,
    seed: int = 0,
    monitor: Monitor | None = None,
) -> dict[str, Any]:
    """Fine-tune ``base`` on ``texts[train_idx]``, select the epoch on ``texts[hold_idx]``,
    write the encoder folder ``out`` (replaced whole); return the training record (with
    ``params.keep_layer`` or ``params.cosine_scale`` > 0 also the kept linear layer, under
    :data:`JOINT_LAYER`)."""
    import transformers

    transformers.logging.set_verbosity_error()  # the caller shows progress, not the loaders
    transformers.logging.disable_progress_bar()
    params = params or FineTuneParams()
    if params.method not in ("full", "lora"):
        raise ModelError(f"fine-tuning method {params.method!r}: expected 'full' or 'lora'")
    check_encoder_dir(base)
    t0 = time.perf_counter()
    with _deterministic(seed, usable_cores()):
        loop, base_ref = _build_loop(texts, y, train_idx, names, base, params, seed, monitor)
        epochs, best_epoch = _train_epochs(loop, y, train_idx, hold_idx, names, seed)
        trainable = loop.tuner.trainable()
        n_trainable = sum(p.numel() for n, p in trainable if n.startswith("encoder."))
        joint = _kept_layer(loop.tuner, params, [loop.ids[i] for i in hold_idx])
        _save(loop.tuner.encoder, params, base, base_ref, out)
    return {
        **joint,
        "epochs": epochs,
        "method": params.method,
        "base": base_ref,
        "base_version": fingerprint(base),
        "params": {**asdict(params), "learning_rate": params.lr()},
        "seed": seed,
        "best_epoch": best_epoch,
        "trainable_parameters": int(n_trainable),
        "encoder_mb": round(sum(p.stat().st_size for p in out.iterdir()) / 1e6, 2),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _sort_target_modules(config: Path) -> None:
    """peft writes ``target_modules`` from a set, in an order that changes with the
    interpreter's hash seed; sorted, the same training writes the same bytes (and so the
    same model version)."""
    record = json.loads(config.read_text())
    if isinstance(record.get("target_modules"), list):
        record["target_modules"] = sorted(record["target_modules"])
        config.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _kept_layer(tuner: _Tuner, params: FineTuneParams, hold: list[list[int]]) -> dict[str, Any]:
    """``{JOINT_LAYER: layer}`` when the layer is kept (a layer trained on the mean-pooled
    vector gets the held-out median norm as its scale), else nothing."""
    if params.cosine_scale > 0:
        return {JOINT_LAYER: tuner.layer()}
    if params.keep_layer:
        return {JOINT_LAYER: {**tuner.layer(), "scale": _median_norm(tuner, hold)}}
    return {}


def _save(encoder: Any, params: FineTuneParams, base: Path, base_ref: str, out: Path) -> None:
    """Write the encoder folder beside ``out`` under a temporary name, then swap it in."""
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as tmp:
        staged = Path(tmp) / out.name
        encoder = encoder.to("cpu")
        if params.method == "full":
            if params.fp16_weights:
                encoder = encoder.to(torch.float16)
            encoder.save_pretrained(str(staged))
        else:
            # adapter_config.json + adapter weights; the embeddings are not adapted, and
            # "auto" would look the base up on a model hub to find out
            encoder.save_pretrained(str(staged), save_embedding_layers=False)
            (staged / "README.md").unlink(missing_ok=True)  # peft's model card stub
            _sort_target_modules(staged / ADAPTER_CONFIG_FILE)
            shutil.copy2(base / "config.json", staged / "config.json")
            (staged / ADAPTER_BASE_FILE).write_text(
                json.dumps({"base": base_ref, "base_version": fingerprint(base)}, indent=2) + "\n"
            )
        for name in TOKENIZER_FILES:
            if (base / name).is_file():
                shutil.copy2(base / name, staged / name)
        for f in staged.iterdir():
            f.chmod(0o644)  # some writers make 0600 files; readers may be other users
        if out.exists():
            shutil.rmtree(out)
        staged.replace(out)
