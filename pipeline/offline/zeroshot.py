"""Zero-shot classifier heads from label descriptions (`docintel train --descriptions`).

``LABELS.toml`` names the labels and describes them; no labelled data is needed::

    [labels]
    earnings = ["The company reported its quarterly results.", "Guidance was raised."]
    deals = "The company agreed to acquire a rival."

    [examples]                      # optional: a few sentences per label
    deals = ["Acme will buy Bolt for $2 billion."]

Each description (and example) is embedded with the run's encoder, by the embed stage's
own code, so the geometry is the one the classify stage will see. A label's prototype is
the normalised mean of its texts' unit vectors; the head is one Keras Dense layer whose
kernel is the prototypes times a scale, then softmax: ``softmax(scale * cos(x, p_k))``
(inputs are the embed stage's unit vectors, so the dot product is the cosine). It is a
head folder like any other (model.keras, labels.json, training.json, metrics.json) and
runs on Keras, fp32 ONNX and int8 ONNX.

Scale: 20 (``DEFAULT_SCALE``, a temperature of 0.05), the scale all-MiniLM-L6-v2 was
trained with (sentence-transformers' MultipleNegativesRankingLoss: softmax over 20 times
the cosines), so the scores are the encoder's own similarity distribution. They are not
calibrated probabilities; with ``[examples]`` a temperature is fitted on the examples by
leave-one-out (each example scored against prototypes built without it) and stored as the
head's calibration, the way `docintel train` stores the hold-out's.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from docintel.pipeline.artefacts.paths import (
    CLASSIFIER_MODEL_FILE,
    LABELS_FILE,
    METRICS_FILE,
    TRAINING_FILE,
)
from docintel.pipeline.errors import InputError
from docintel.pipeline.offline.metrics import metrics
from docintel.pipeline.stages.embed_settings import EmbedConfig

DEFAULT_SCALE = 20.0  # all-MiniLM-L6-v2's training scale (temperature 0.05)
ZERO_SHOT_KEY = "zero_shot"  # training.json: how the head was built and its scores scaled
_SECTIONS = ("labels", "examples", "template")
_PLACE = "{}"


@dataclass(frozen=True)
class LabelSpec:
    """A descriptions file read: each label's descriptions (``template`` applied) and
    examples, labels in the file's order."""

    path: Path
    descriptions: dict[str, list[str]]
    examples: dict[str, list[str]]
    template: str | None = None

    @property
    def names(self) -> list[str]:
        return list(self.descriptions)


def _strings(value: Any, where: str) -> list[str]:
    """A description (or example) value: one non-empty string or a non-empty list of them."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise InputError(f"{where}: expected a string or a non-empty list of strings")
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise InputError(f"{where}: a description or example is empty (or not a string)")
    return [item.strip() for item in items]


def _table(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise InputError(f"{path}: [{key}] must be a table of label = ... entries")
    for label in table:
        if not label.strip():
            raise InputError(f"{path}: [{key}] has an empty label name")
    return table


def _template(data: dict[str, Any], path: Path) -> str | None:
    template = data.get("template")
    if template is None:
        return None
    if not isinstance(template, str) or template.count(_PLACE) != 1:
        raise InputError(f"{path}: template must be a string with one {_PLACE} (the description)")
    return template


def read_labels(path: Path) -> LabelSpec:
    """Read and check a descriptions file; every problem is an InputError naming the file
    and the label: a missing or unparseable file, fewer than two labels, an empty
    description, examples of a label not in ``[labels]``, an unknown section."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"descriptions file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise InputError(f"cannot read descriptions file {path}: {e}") from e
    unknown = sorted(set(data) - set(_SECTIONS))
    if unknown:
        raise InputError(
            f"{path}: unknown section(s) {unknown}; expected [labels], optional [examples] "
            "and an optional template"
        )
    labels = _table(data, "labels", path)
    if len(labels) < 2:
        raise InputError(
            f"{path}: [labels] names {len(labels)} label(s); a classifier needs at least two"
        )
    template = _template(data, path)
    descriptions = {
        label: [template.format(d) if template else d for d in _strings(v, f"{path}: {label}")]
        for label, v in labels.items()
    }
    raw_examples = _table(data, "examples", path)
    strangers = sorted(set(raw_examples) - set(labels))
    if strangers:
        raise InputError(f"{path}: [examples] has label(s) {strangers} that [labels] does not name")
    examples = {
        label: _strings(v, f"{path}: [examples] {label}") for label, v in raw_examples.items()
    }
    return LabelSpec(path, descriptions, examples, template)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def prototypes(vectors: np.ndarray, owner: np.ndarray, n_labels: int) -> np.ndarray:
    """Each label's prototype: the normalised mean of its rows' unit vectors [n, dim]."""
    sums = np.zeros((n_labels, vectors.shape[1]), np.float64)
    np.add.at(sums, owner, vectors)
    return _unit(sums).astype(np.float32)


def scaled_softmax(x: np.ndarray, protos: np.ndarray, scale: float) -> np.ndarray:
    """What the head computes, in numpy: ``softmax(scale * x @ protos.T)``."""
    z = scale * (x.astype(np.float64) @ protos.T.astype(np.float64))
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def leave_one_out(
    vectors: np.ndarray, owner: np.ndarray, is_example: np.ndarray, n: int, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """The examples' scores against prototypes built without each of them in turn (the
    other labels' prototypes whole), and their labels: an honest check of the head."""
    sums = np.zeros((n, vectors.shape[1]), np.float64)
    np.add.at(sums, owner, vectors)
    rows = np.flatnonzero(is_example)
    probs = np.zeros((len(rows), n))
    for k, i in enumerate(rows):
        held = sums.copy()
        held[owner[i]] -= vectors[i]
        probs[k] = scaled_softmax(vectors[i : i + 1], _unit(held), scale)[0]
    return probs.astype(np.float32), owner[rows]


def zeroshot_model(protos: np.ndarray, scale: float) -> Any:
    """The Keras head: one softmax Dense layer, kernel ``scale * protos.T``, bias 0 (the
    one-layer network `docintel train --head linear` builds, so every runtime runs it)."""
    from docintel.pipeline.offline.train import joint_head

    bias = np.zeros(len(protos), np.float32)
    return joint_head({"weight": protos, "scale": scale, "bias": bias})


def _texts(spec: LabelSpec) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Every description then every example, the label id of each, and which are examples."""
    texts: list[str] = []
    owner: list[int] = []
    example: list[bool] = []
    for k, name in enumerate(spec.names):
        for group, is_ex in ((spec.descriptions[name], False), (spec.examples.get(name, []), True)):
            texts += group
            owner += [k] * len(group)
            example += [is_ex] * len(group)
    return texts, np.array(owner, np.int64), np.array(example, bool)


def _calibration(
    vectors: np.ndarray, owner: np.ndarray, example: np.ndarray, names: list[str], scale: float
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """With examples of at least two labels: the temperature fitted on their
    leave-one-out scores and their metrics; else no calibration and no metrics."""
    from docintel.pipeline.offline.calibration import calibration_record

    if len(set(owner[example].tolist())) < 2:
        return None, {"split": None, "note": "zero-shot head: no labelled data to score"}
    probs, y = leave_one_out(vectors, owner, example, len(names), scale)
    record = calibration_record(probs, y, "examples, leave-one-out")
    result = metrics(y, probs.argmax(axis=1), names)
    return record, {"split": "examples, leave-one-out", **result, "ece": record["ece_after"]}


def build_zeroshot(
    labels_file: Path,
    out: Path,
    embed_cfg: EmbedConfig,
    languages: list[str],
    scale: float = DEFAULT_SCALE,
) -> dict[str, Any]:
    """Write the zero-shot head of ``labels_file`` to ``out``; return its training record."""
    from docintel.pipeline.offline.train import embed_texts, save_pinned
    from docintel.pipeline.stages.classify import CALIBRATION_KEY, LANGUAGES_KEY

    spec = read_labels(labels_file)
    texts, owner, example = _texts(spec)
    vectors, embedder = embed_texts(texts, embed_cfg)
    protos = prototypes(vectors, owner, len(spec.names))
    calibration, result = _calibration(vectors, owner, example, spec.names, scale)
    out.mkdir(parents=True, exist_ok=True)
    save_pinned(zeroshot_model(protos, scale), out / CLASSIFIER_MODEL_FILE)
    (out / LABELS_FILE).write_text(json.dumps(spec.names) + "\n")
    record: dict[str, Any] = {
        "data": labels_file.name,
        "embedder": embedder,
        "embedding_dim": int(vectors.shape[1]),
        ZERO_SHOT_KEY: {
            "descriptions": {n: len(spec.descriptions[n]) for n in spec.names},
            "examples": {n: len(spec.examples.get(n, [])) for n in spec.names},
            "template": spec.template,
            "prototype": "normalised mean of the label's description and example embeddings",
            "scale": scale,
            "scores": f"softmax({scale:g} * cosine to each label's prototype)"
            + ("; temperature fitted on the examples" if calibration else "; not calibrated"),
        },
        LANGUAGES_KEY: languages,
    }
    if calibration is not None:
        record[CALIBRATION_KEY] = calibration
    (out / TRAINING_FILE).write_text(json.dumps(record, indent=2) + "\n")
    (out / METRICS_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return record
