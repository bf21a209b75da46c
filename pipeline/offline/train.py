"""Train and evaluate the Keras classifier head over sentence embeddings.

`docintel train DATA --out DIR` embeds the texts with the configured embedder (the same
Embedder stage the pipeline runs), fits a small Keras MLP with class weighting, and writes
``model.keras``, ``labels.json``, ``training.json`` and ``metrics.json`` (held-out split).
With ``--fine-tune`` it first fine-tunes the encoder on the same training split
(:mod:`docintel.pipeline.offline.finetune`) into ``DIR/encoder/`` and trains the head on
that encoder's embeddings; ``training.json`` then also holds the fine-tuning curve. With
``--head joint`` the head is instead the fine-tuning's own linear layer, exported to Keras.
The head's temperature is fitted on the hold-out and kept in ``training.json``
(``calibration``; :mod:`docintel.pipeline.offline.calibration`); ``score_on`` files
are scored with it and their metrics and ECE go into ``metrics.json``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from docintel.pipeline.artefacts.paths import (
    CLASSIFIER_MODEL_FILE,
    ENCODER_SUBDIR,
    LABELS_FILE,
    METRICS_FILE,
    TRAINING_FILE,
)
from docintel.pipeline.errors import InputError
from docintel.pipeline.offline.metrics import metrics
from docintel.pipeline.stages.classify import (
    CALIBRATION_KEY,
    DEFAULT_HEAD_LANGUAGES,
    LANGUAGES_KEY,
    head_languages,
    read_classifier_meta,
)
from docintel.pipeline.stages.embed import Embedder
from docintel.pipeline.stages.embed_settings import EmbedConfig

if TYPE_CHECKING:
    from docintel.pipeline.offline.finetune import FineTuneParams, Monitor

HOLDOUT_FRACTION = 0.1  # of the training file, stratified: early stopping + reported metrics
SEED = 0
NORMALISE_KEY = "normalise_text"  # training.json: the texts were rewritten by normalise_text

_URL = re.compile(r"(?:https?://|www\.)\S+", re.IGNORECASE)
_CASHTAG = re.compile(r"(?<![\w$])\$[A-Za-z][A-Za-z0-9]*(?:[._][A-Za-z]+)?\b")
_MENTION = re.compile(r"(?<![\w@])@\w+")
_SPACES = re.compile(r"[ \t]{2,}")


@dataclass(frozen=True)
class HeadParams:
    """Hyperparameters of the classifier head, chosen on the held-out split (BENCHMARKS.md,
    "Classifier"): an ensemble of MLPs trained jointly and averaged inside one model gave
    +0.015-0.02 macro-F1 over a single MLP and far less seed variance; 5 members of
    384-192 units matched 5 of 512-256 on the hold-out at two thirds of the size (4.4 MB)."""

    members: int = 5
    hidden: tuple[int, ...] = (384, 192)
    dropout: float = 0.5
    learning_rate: float = 2e-3
    batch_size: int = 256
    max_epochs: int = 100
    patience: int = 20  # epochs without a better hold-out macro-F1 before stopping


def load_labelled(
    path: Path, text_column: str = "text", label_column: str = "label"
) -> tuple[list[str], list[str]]:
    """Texts and string labels from a CSV or Parquet file."""
    try:
        if path.suffix.lower() == ".csv":
            table = pacsv.read_csv(
                path,
                convert_options=pacsv.ConvertOptions(
                    column_types={text_column: pa.string(), label_column: pa.string()}
                ),
            )
        else:
            table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise InputError(f"cannot read labelled data {path}: {e}") from e
    for col in (text_column, label_column):
        if col not in table.column_names:
            raise InputError(
                f"labelled data {path} has no column {col!r}; its columns are: "
                f"{', '.join(table.column_names)}"
            )
    texts = table[text_column].cast(pa.string()).to_pylist()
    labels = table[label_column].cast(pa.string()).to_pylist()
    keep = [i for i, (t, y) in enumerate(zip(texts, labels, strict=True)) if t and y]
    return [texts[i] for i in keep], [labels[i] for i in keep]


def normalise_text(text: str) -> str:
    """Tweet artefacts rewritten (``docintel train --normalise-text``): links removed,
    cashtags (``$AAPL``, ``$BRK.B``) -> ``$TICKER``, mentions (``@user``) -> ``@USER``;
    dollar amounts (``$5``) and e-mail addresses are kept."""
    text = _URL.sub("", text)
    text = _CASHTAG.sub("$TICKER", text)
    text = _MENTION.sub("@USER", text)
    return _SPACES.sub(" ", text).strip()


def apply_label_names(labels: list[str], names: list[str] | None) -> list[str]:
    """Map integer label ids to names (``--label-names``); string labels pass through."""
    if not names:
        return labels
    try:
        return [names[int(y)] for y in labels]
    except (ValueError, IndexError) as e:
        raise InputError(
            f"--label-names gives {len(names)} names but the data has label "
            f"values {sorted(set(labels))[:10]}"
        ) from e


def embed_texts(texts: list[str], cfg: EmbedConfig) -> tuple[np.ndarray, str]:
    """Embeddings of whole texts with the pipeline's Embedder, and the embedder version."""
    emb = Embedder(cfg)
    emb.setup()
    vectors, _, _ = emb.encode(texts)
    return vectors, emb.version


def stratified_split(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    hold = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        hold.extend(idx[: max(1, round(len(idx) * fraction))])
    mask = np.zeros(len(y), dtype=bool)
    mask[hold] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


@dataclass
class _KeepBest:
    """Hold-out bookkeeping of :func:`fit_head`: the best macro-F1 so far, the weights that
    reached it, and the epochs since; ``curve``, if given, receives every epoch's macro-F1."""

    patience: int
    curve: list[float] | None
    f1: float = -1.0
    weights: Any = None
    wait: int = 0

    def after_epoch(self, f1: float, weights: Callable[[], Any]) -> bool:
        """Record one epoch's hold-out macro-F1 (``weights`` read only if it is the best);
        whether training should stop (``patience`` epochs without a better one)."""
        if self.curve is not None:
            self.curve.append(round(f1, 5))
        if f1 > self.f1:
            self.f1, self.weights, self.wait = f1, weights(), 0
            return False
        self.wait += 1
        return self.wait >= self.patience


def _ensemble(keras: Any, dim: int, n_classes: int, params: HeadParams) -> tuple[Any, Any]:
    """The compiled trainer (one softmax output, one loss per member) and the model that
    averages the members' outputs; both share the members' layers."""
    inputs = keras.Input(shape=(dim,), dtype="float32", name="embedding")
    heads = []
    for k in range(params.members):
        h = inputs
        for j, units in enumerate(params.hidden):
            h = keras.layers.Dense(units, activation="relu", name=f"m{k}_dense{j}")(h)
            h = keras.layers.Dropout(params.dropout, name=f"m{k}_drop{j}")(h)
        heads.append(keras.layers.Dense(n_classes, activation="softmax", name=f"m{k}_probs")(h))
    trainer = keras.Model(inputs, heads)  # trains every member on its own loss
    model = keras.Model(inputs, keras.layers.Average(name="probs")(heads), name="head")
    trainer.compile(
        optimizer=keras.optimizers.Adam(params.learning_rate),
        loss=[keras.losses.CategoricalCrossentropy() for _ in heads],
    )
    return trainer, model


def _balanced_sample_weights(y: np.ndarray, n_classes: int) -> np.ndarray:
    """Each row's weight: its class's "balanced" weight, rows / (classes * class count)."""
    counts = np.bincount(y, minlength=n_classes)
    class_weight = len(y) / (n_classes * np.maximum(counts, 1))  # "balanced"
    return class_weight[y].astype(np.float32)


def fit_head(
    x: np.ndarray,
    y: np.ndarray,
    x_hold: np.ndarray,
    y_hold: np.ndarray,
    n_classes: int,
    params: HeadParams,
    seed: int,
    curve: list[float] | None = None,
    sample_weight: np.ndarray | None = None,
) -> Any:
    """An ensemble of ReLU MLPs, each with its own class-weighted cross-entropy, averaged in
    one Keras model; the weights with the best hold-out macro-F1 are kept. ``curve``, if
    given, receives the hold-out macro-F1 after every epoch; ``sample_weight``, if given,
    replaces the class weighting (one weight per training row)."""
    import os

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()  # same seed, same weights
    trainer, model = _ensemble(keras, x.shape[1], n_classes, params)
    weights = _balanced_sample_weights(y, n_classes) if sample_weight is None else sample_weight
    onehot = keras.utils.to_categorical(y, n_classes)
    names = [str(i) for i in range(n_classes)]
    best = _KeepBest(params.patience, curve)

    class KeepBestMacroF1(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:  # noqa: ARG002 - Keras callback signature
            pred = np.asarray(model(x_hold, training=False)).argmax(axis=1)
            if best.after_epoch(metrics(y_hold, pred, names)["macro_f1"], model.get_weights):
                trainer.stop_training = True

    trainer.fit(
        x,
        [onehot] * params.members,
        sample_weight=[weights] * params.members,
        batch_size=params.batch_size,
        epochs=params.max_epochs,
        shuffle=True,
        callbacks=[KeepBestMacroF1()],
        verbose=0,
    )
    model.set_weights(best.weights)
    return model


def _inference_copy(model: Any) -> Any:
    """The same network without optimizer state: a third of the file size."""
    import keras

    clean = keras.Model.from_config(model.get_config())
    clean.set_weights(model.get_weights())
    return clean


def save_pinned(model: Any, path: Path) -> None:
    """``model.save(path)`` with the archive's two clocks stopped: Keras writes the save
    time into ``metadata.json`` and the zip entries' dates, so two identical trainings
    wrote different bytes, and so different model versions. Both are set to the zip
    epoch (1980-01-01); the weights and the config are Keras's own bytes."""
    import zipfile

    model.save(path)
    with zipfile.ZipFile(path) as z:
        entries = [(info, z.read(info.filename)) for info in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for info, data in entries:
            body = data
            if info.filename == "metadata.json":
                meta = json.loads(data)
                meta["date_saved"] = "1980-01-01@00:00:00"
                body = json.dumps(meta).encode()
            pinned = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            pinned.compress_type = info.compress_type
            pinned.external_attr = info.external_attr
            z.writestr(pinned, body)


@dataclass(frozen=True)
class _Classes:
    """A labelled file as classes: its texts, their class ids, the class names (id order)
    and the stratified split into training rows and hold-out rows."""

    texts: list[str]
    y: np.ndarray
    names: list[str]
    train: np.ndarray
    hold: np.ndarray
    added: np.ndarray | None = None  # True for the rows of the --add-data files


def _classes(
    data: Path,
    label_names: list[str] | None,
    seed: int,
    normalise: bool = False,
    more: Sequence[Path] = (),
) -> _Classes:
    """Read ``data`` and then each of ``more`` (their texts rewritten by
    :func:`normalise_text` if ``normalise``), name the labels, number the classes and
    split off the hold-out (stratified over all the rows)."""
    texts, raw = load_labelled(data)
    n_data = len(texts)
    for extra in more:
        t, r = load_labelled(extra)
        texts, raw = texts + t, raw + r
    if normalise:
        texts = [normalise_text(t) for t in texts]
    if not texts:
        raise InputError(f"labelled data {data} has no rows with both text and label")
    labels = apply_label_names(raw, label_names)
    names = label_names or sorted(set(labels))
    index = {n: i for i, n in enumerate(names)}
    y = np.array([index[lb] for lb in labels], dtype=np.int64)
    tr, ho = stratified_split(y, HOLDOUT_FRACTION, seed)
    added = np.arange(len(texts)) >= n_data if more else None
    return _Classes(texts, y, names, tr, ho, added)


def _fine_tune_encoder(
    c: _Classes,
    out: Path,
    embed_cfg: EmbedConfig,
    params: FineTuneParams,
    seed: int,
    monitor: Monitor | None,
) -> tuple[dict[str, Any], EmbedConfig]:
    """Fine-tune the configured encoder into ``out/encoder/``: the fine-tuning record, and
    the embed config that runs the fine-tuned encoder."""
    from docintel.pipeline.offline.finetune import fine_tune as do_fine_tune

    encoder_dir = out / ENCODER_SUBDIR
    base = embed_cfg.resolved_model_path()
    tuned = do_fine_tune(
        c.texts, c.y, c.train, c.hold, c.names, base, encoder_dir, params, seed, monitor
    )
    return tuned, embed_cfg.model_copy(update={"model_path": str(encoder_dir)})


def _training_record(
    data: Path,
    c: _Classes,
    embedder: str,
    embedding_dim: int,
    params: HeadParams,
    seed: int,
    curve: list[float],
    seconds: dict[str, float],
    tuned: dict[str, Any] | None,
) -> dict[str, Any]:
    """What ``training.json`` holds: the data, the embedder, the head's curve, the times."""
    record: dict[str, Any] = {
        "data": data.name,
        "rows": len(c.texts),
        "train_rows": len(c.train),
        "holdout_rows": len(c.hold),
        "embedder": embedder,
        "embedding_dim": embedding_dim,
        "seed": seed,
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in params.__dict__.items()},
        "head_curve": {
            "holdout_macro_f1_per_epoch": curve,
            "best_epoch": int(np.argmax(curve)) + 1 if curve else 0,
        },
        "seconds": seconds,
    }
    if tuned is not None:
        record["encoder"] = ENCODER_SUBDIR  # relative to this folder
        record["fine_tune"] = tuned
    return record


def joint_head(layer: dict[str, Any]) -> Any:
    """The linear layer trained jointly with the encoder (``--head joint``) as the Keras
    head the classify stage loads: the linear head's network (``HeadParams(members=1,
    hidden=())``), kernel ``(scale * weight).T`` and the bias. On the embed stage's unit
    vectors it gives the softmax of the fine-tuning model's logits: exactly for a cosine
    layer, and for a layer trained on the mean-pooled vector (scale: the held-out median
    norm) as if every vector had that norm."""
    import os

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    weight = np.asarray(layer["weight"], np.float32)
    n_classes, dim = weight.shape
    _, model = _ensemble(keras, dim, n_classes, HeadParams(members=1, hidden=()))
    kernel = (np.float32(layer["scale"]) * weight).T
    model.set_weights([kernel, np.asarray(layer["bias"], np.float32)])
    return model


def _fit_and_save(
    x: np.ndarray,
    c: _Classes,
    out: Path,
    params: HeadParams,
    seed: int,
    curve: list[float],
    add_weight: float = 1.0,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fit the head (the --add-data rows weighing ``add_weight`` times a row of DATA,
    within the classes' balanced weights), then :func:`_save_head`."""
    tr, ho, y = c.train, c.hold, c.y
    weight = row_weights(c, add_weight)
    model = fit_head(
        x[tr], y[tr], x[ho], y[ho], len(c.names), params, seed, curve, sample_weight=weight
    )
    return _save_head(model, x[ho], c, out)


def row_weights(c: _Classes, add_weight: float) -> np.ndarray | None:
    """The training rows' weights in the head's loss when the --add-data rows weigh
    ``add_weight`` times a row of DATA: each class's balanced weight times
    ``add_weight`` for an added row, scaled to mean 1; None (the plain balanced weights)
    without added rows or at weight 1."""
    if c.added is None or add_weight == 1.0:
        return None
    y = c.y[c.train]
    weight = _balanced_sample_weights(y, len(c.names))
    weight = weight * np.where(c.added[c.train], add_weight, 1.0)
    return (weight / weight.mean()).astype(np.float32)


def _save_head(
    model: Any, x_hold: np.ndarray, c: _Classes, out: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fit the head's temperature on the hold-out, write model.keras and labels.json; the
    hold-out metrics (with the calibrated ECE) and the calibration record."""
    from docintel.pipeline.offline.calibration import calibration_record

    y = c.y[c.hold]
    raw = np.asarray(model(x_hold, training=False))
    calibration = calibration_record(raw, y, "holdout")
    result = {**metrics(y, raw.argmax(axis=1), c.names), "ece": calibration["ece_after"]}
    out.mkdir(parents=True, exist_ok=True)
    save_pinned(_inference_copy(model), out / CLASSIFIER_MODEL_FILE)
    (out / LABELS_FILE).write_text(json.dumps(c.names) + "\n")
    return result, calibration


def _scored_files(
    out: Path, files: list[Path], embed_cfg: EmbedConfig, label_names: list[str] | None
) -> dict[str, Any]:
    """The written model's metrics (ECE included) on each of ``files``, by file name."""
    return {f.name: evaluate(out, f, embed_cfg, label_names) for f in files}


def write_metrics(out: Path, holdout: dict[str, Any], scored: dict[str, Any]) -> None:
    """metrics.json: the hold-out metrics; with scored files also their metrics, and the
    top-level ``ece`` is the first scored file's (``ece_split`` says which)."""
    record: dict[str, Any] = {"split": "holdout", **holdout, "ece_split": "holdout"}
    if scored:
        first = next(iter(scored))
        record.update(ece=scored[first]["ece"], ece_split=first, ece_holdout=holdout["ece"])
        record["evaluations"] = scored
    (out / METRICS_FILE).write_text(json.dumps(record, indent=2) + "\n")


def _how_trained(
    normalise: bool,
    more_data: Sequence[Path],
    layer: dict[str, Any] | None,
    tuned: dict[str, Any] | None,
    add_weight: float = 1.0,
) -> dict[str, Any]:
    """The training record's optional keys: text normalisation, the added files, and for
    a kept layer what it was trained on and the scale its export folded in."""
    extra: dict[str, Any] = {NORMALISE_KEY: True} if normalise else {}
    if more_data:
        extra["more_data"] = [f.name for f in more_data]
        extra["more_data_weight"] = add_weight
    if layer is not None and tuned is not None:
        cosine = tuned["params"]["cosine_scale"]
        trained_on = "unit vector" if cosine else "mean-pooled vector"
        extra["head"] = {"joint": True, "trained_on": trained_on, "scale": layer["scale"]}
    return extra


def _seconds(tuned: dict[str, Any] | None, t_embed: float, t0: float) -> dict[str, float]:
    """The training record's timings: fine-tuning, embedding, and the whole run since ``t0``."""
    return {
        "fine_tune": tuned["seconds"] if tuned else 0.0,
        Embedder.name: round(t_embed, 1),  # the embed stage's time, keyed by its name
        "total": round(time.perf_counter() - t0, 1),
    }


def _check_add_weight(add_weight: float) -> None:
    if not (math.isfinite(add_weight) and add_weight > 0):
        raise InputError(f"the added data's weight must be a positive number, not {add_weight}")


def train(
    data: Path,
    out: Path,
    embed_cfg: EmbedConfig,
    label_names: list[str] | None = None,
    params: HeadParams | None = None,
    seed: int = SEED,
    fine_tune: FineTuneParams | None = None,
    monitor: Monitor | None = None,
    score_on: list[Path] | None = None,
    normalise: bool = False,
    more_data: Sequence[Path] = (),
    languages: Sequence[str] = DEFAULT_HEAD_LANGUAGES,
    add_weight: float = 1.0,
) -> dict[str, Any]:
    """Train a head on ``data`` and write the classifier folder ``out``; return metrics.

    With ``fine_tune``, the configured encoder is first fine-tuned on the training split
    into ``out/encoder/`` and the head is trained on that encoder's embeddings; the
    hold-out (a stratified part of ``data``) selects the encoder's epoch and the head's,
    and fits the head's temperature. With ``fine_tune.keep_layer`` (or
    ``fine_tune.cosine_scale`` > 0) the head is the fine-tuning's own linear layer
    (:func:`joint_head`), nothing is fitted after it, and only the hold-out is embedded.
    ``score_on``: labelled files the written model is scored on too. ``normalise``: the
    texts of ``data`` are rewritten by :func:`normalise_text` (not those of ``score_on``).
    ``more_data``: labelled files trained on with ``data`` (rows appended to its rows),
    each row weighing ``add_weight`` times one of ``data`` in the head's loss.
    ``languages``: the ISO 639-1 codes of the texts' languages (training.json): a run gives
    sentences in any other language a null label.
    """
    from docintel.pipeline.offline.finetune import JOINT_LAYER

    langs = head_languages({LANGUAGES_KEY: list(languages)}, "the head's languages")
    _check_add_weight(add_weight)
    params = params or HeadParams()
    t0 = time.perf_counter()
    c = _classes(data, label_names, seed, normalise, more_data)
    tuned: dict[str, Any] | None = None
    if fine_tune is not None:
        tuned, embed_cfg = _fine_tune_encoder(c, out, embed_cfg, fine_tune, seed, monitor)
    layer = tuned.pop(JOINT_LAYER, None) if tuned else None
    t_embed0 = time.perf_counter()
    rows = c.hold if layer is not None else np.arange(len(c.texts))
    x, embedder = embed_texts([c.texts[i] for i in rows], embed_cfg)
    t_embed = time.perf_counter() - t_embed0
    curve: list[float] = []
    if layer is not None:
        params = HeadParams(members=1, hidden=())  # what joint_head builds
        result, calibration = _save_head(joint_head(layer), x, c, out)
    else:
        result, calibration = _fit_and_save(x, c, out, params, seed, curve, add_weight)
    seconds = _seconds(tuned, t_embed, t0)
    record = _training_record(
        data, c, embedder, int(x.shape[1]), params, seed, curve, seconds, tuned
    )
    extra = _how_trained(normalise, more_data, layer, tuned, add_weight)
    record |= {CALIBRATION_KEY: calibration, **extra, LANGUAGES_KEY: langs}
    (out / TRAINING_FILE).write_text(json.dumps(record, indent=2) + "\n")
    write_metrics(out, result, _scored_files(out, score_on or [], embed_cfg, c.names))
    return result


def encoder_for_head(model_dir: Path, embed_cfg: EmbedConfig) -> EmbedConfig:
    """The encoder config to run the head in ``model_dir`` with: the head's own fine-tuned
    encoder (``model_dir/encoder/``, from `docintel train --fine-tune`) when ``[embed]
    model_path`` is left at its default, else the configured encoder."""
    own = model_dir / ENCODER_SUBDIR
    if not embed_cfg.model_path and own.is_dir():
        return embed_cfg.model_copy(update={"model_path": str(own)})
    return embed_cfg


def evaluate(
    model_dir: Path, data: Path, embed_cfg: EmbedConfig, label_names: list[str] | None = None
) -> dict[str, Any]:
    """Metrics of the classifier in ``model_dir`` on a labelled file, with the encoder of
    :func:`encoder_for_head`; a head trained on another encoder's embeddings is refused."""
    from docintel.pipeline.offline.calibration import ece
    from docintel.pipeline.stages.classify import Classifier, ClassifyConfig, check_head_encoder

    texts, raw = load_labelled(data)
    embed_cfg = encoder_for_head(model_dir, embed_cfg)
    check_head_encoder(model_dir, embed_cfg.resolved_model_path())
    clf = Classifier(ClassifyConfig(model_dir=str(model_dir)))
    clf.setup()
    integer_ids = all(r.isdigit() for r in raw)
    labels = apply_label_names(raw, (label_names or clf.labels) if integer_ids else None)
    unknown = sorted(set(labels) - set(clf.labels))
    if unknown:
        raise InputError(
            f"{data} has labels {unknown} that {model_dir} does not know "
            f"({clf.labels}); pass --label-names to map integer ids"
        )
    index = {n: i for i, n in enumerate(clf.labels)}
    x, _ = embed_texts(texts, embed_cfg)
    probs = clf.predict(x)  # calibrated: the head's temperature applied
    y = np.array([index[lb] for lb in labels])
    return {**metrics(y, probs.argmax(axis=1), clf.labels), "ece": ece(probs, y)}


def recalibrate(
    model_dir: Path, data: Path, embed_cfg: EmbedConfig, label_names: list[str] | None = None
) -> dict[str, Any]:
    """Fit the temperature of an already trained head on its own hold-out (``data`` is the
    file it was trained on; the split is redrawn with its recorded seed) and store it in
    its training.json, as `docintel train` does for a new head; returns the record."""
    from docintel.pipeline.offline.calibration import calibration_record
    from docintel.pipeline.stages.classify import Classifier, ClassifyConfig, check_head_encoder

    clf = Classifier(ClassifyConfig(model_dir=str(model_dir)))
    clf.setup()
    _, training = read_classifier_meta(model_dir)
    normalise = bool(training.get(NORMALISE_KEY, False))  # the hold-out as it was trained
    c = _classes(data, label_names or clf.labels, int(training.get("seed", SEED)), normalise)
    if len(c.hold) != training.get("holdout_rows", len(c.hold)):
        raise InputError(f"{data} does not redraw the hold-out {model_dir} was trained with")
    embed_cfg = encoder_for_head(model_dir, embed_cfg)
    check_head_encoder(model_dir, embed_cfg.resolved_model_path())
    x, _ = embed_texts([c.texts[i] for i in c.hold], embed_cfg)
    clf.temperature = 1.0  # the head's own probabilities
    record = calibration_record(clf.predict(x), c.y[c.hold], "holdout")
    training[CALIBRATION_KEY] = record
    (model_dir / TRAINING_FILE).write_text(json.dumps(training, indent=2) + "\n")
    return record
