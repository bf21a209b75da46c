"""Sentence labels from a Keras classifier over the embeddings: Keras itself (TensorFlow
backend; GPU replicas, or ``[classify] cpu_runtime = "keras"``), or the same head as an ONNX
graph on ONNX Runtime without TensorFlow in the process: fp32 on CPU replicas (the
default), int8 on CPU spill replicas. Every runtime applies the head's temperature (its
training.json, ``calibration``) to what its graph outputs, with the same numpy code.

Extra heads (``[classify.heads]``, ``docintel run --classifier NAME=DIR``) run beside the
default one in the same call per batch, on the same runtime and embeddings: each is a copy
of the stage loading its own folder (labels, calibration, languages, weights or cached
ONNX graph), and writes ``NAME_label``, ``NAME_score`` and its internal probabilities
(``probs:NAME``, its labels in the field's metadata: the documents table averages them)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator, model_validator

from docintel.pipeline.artefacts.paths import (
    CLASSIFIER_MODEL_FILE,
    LABELS_FILE,
    META_SOURCE_FINGERPRINT,
    TRAINING_FILE,
    classifier_fp32_path,
    classifier_int8_path,
)
from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.errors import ConfigError, ModelError
from docintel.pipeline.schema import (
    CONTENT,
    DOCUMENT_META_SCHEMA,
    EMBEDDING,
    ENTITIES,
    KERAS,
    LABEL,
    LANGUAGE,
    ONNX_FP32,
    ONNX_INT8,
    PROBS,
    SCORE,
    backend_label,
    documents_schema,
    head_columns,
    head_probs_field,
    sentences_schema,
)
from docintel.pipeline.settings import DEFAULT_MODEL_NAME, Settings, onnx_alias
from docintel.pipeline.stages.base import Placement, Stage
from docintel.pipeline.stages.onnx_session import onnx_session

# "" means the head trained with the default encoder, docintel.models/finsent_ft;
# "stock" = docintel.models/finsent, the head trained on the stock MiniLM (both trained on
# the vendored finance sentiment data with `docintel train`).
DEFAULT_CLASSIFIER_DIR = ""
DEFAULT_CLASSIFY_BATCH = 1024  # rows per Keras call; a small MLP, so one call per batch


class ClassifyConfig(Settings):
    """The ``[classify]`` config section (the stage's registry declaration names it)."""

    model_dir: str = DEFAULT_CLASSIFIER_DIR
    batch_size: int = Field(DEFAULT_CLASSIFY_BATCH, ge=1)
    # Runtime of fp32 CPU replicas, a backend key: "onnx-fp32" (or "onnx") = the Keras
    # head's weights as an ONNX graph on ONNX Runtime (built once per head version into the
    # cache; identical labels, and no TensorFlow import in the replica: ~4.5 CPU-s and
    # ~0.6 GiB less per replica); "keras" = Keras on TensorFlow. GPU replicas always run
    # Keras.
    cpu_runtime: Literal["onnx-fp32", "keras"] = ONNX_FP32

    # Extra heads beside the default one ([classify.heads] NAME = "DIR", `docintel run
    # --classifier NAME=DIR`): each adds NAME_label and NAME_score to sentences/ and
    # documents/, computed in the same classify call per batch; the default head's columns
    # are unchanged. Each must be trained on the run's encoder.
    heads: dict[str, str] = Field(default_factory=dict)

    _onnx_alias = field_validator("cpu_runtime", mode="before")(onnx_alias)

    @model_validator(mode="after")
    def _check_heads(self) -> ClassifyConfig:
        check_head_names(list(self.heads), "[classify.heads]")
        for name, folder in self.heads.items():
            if not isinstance(folder, str) or not folder.strip():
                raise ValueError(f"[classify.heads] {name} must name a head folder")
        return self

    def resolved_model_dir(self) -> Path:
        return resolve_head_dir(self.model_dir)

    def head_dirs(self) -> dict[str, Path]:
        """Each extra head's folder, by name, in declaration order."""
        return {name: resolve_head_dir(folder) for name, folder in self.heads.items()}

    def for_head(self, name: str) -> ClassifyConfig:
        """This section as if the extra head ``name`` were the only head."""
        return self.model_copy(update={"model_dir": self.heads[name], "heads": {}})


def resolve_head_dir(model_dir: str) -> Path:
    """A classifier folder as the config names it ("" / "default": the bundled head on the
    default encoder; "stock": the bundled head on the stock MiniLM; else a path)."""
    from docintel.pipeline.artefacts.paths import (
        BUNDLED_STOCK_CLASSIFIER_NAME,
        STOCK,
        bundled_classifier_dir,
    )

    if model_dir == STOCK:
        return bundled_classifier_dir(BUNDLED_STOCK_CLASSIFIER_NAME)
    if model_dir and model_dir != DEFAULT_MODEL_NAME:
        return Path(model_dir).expanduser()
    return bundled_classifier_dir()


HEAD_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
HEAD_NAME_MAX = 40
# Names an extra head may not take: a contract column (its NAME.label and the NAME_label
# columns would be ambiguous), "n" and "n_..." (the default head's per-label counts are
# n_<label>), and the words the output speaks of.
_RESERVED_HEAD_NAMES = frozenset({"n", "document", "documents", "sentence", "sentences"})


def contract_columns() -> frozenset[str]:
    """Every column the output contract names (sentences and documents, without the
    default head's n_<label> counts), and the built-in stages' internal ones."""
    docs = documents_schema([], entities=True).names
    return frozenset(
        {*sentences_schema(1, ()).names, *docs, *DOCUMENT_META_SCHEMA.names, PROBS, CONTENT}
        | {ENTITIES, "pii"}
    )


def check_head_names(names: list[str], where: str, taken: frozenset[str] = frozenset()) -> None:
    """Refuse (ConfigError) an extra head's name that is not a lower-case identifier, is
    given twice (case-insensitively), or whose columns clash with a contract column or one
    of ``taken`` (other stages' columns)."""
    seen: dict[str, str] = {}
    columns = contract_columns() | taken
    for name in names:
        if name.lower() in seen:
            raise ConfigError(
                f"{where}: two heads are named {name!r} (names are case-insensitive); give "
                "each head its own name"
            )
        seen[name.lower()] = name
        if not HEAD_NAME.match(name) or len(name) > HEAD_NAME_MAX:
            raise ConfigError(
                f"{where}: head name {name!r} is not a lower-case identifier (letters, "
                f"digits and _, starting with a letter, at most {HEAD_NAME_MAX} characters)"
            )
        made = head_columns(name)
        clash = sorted(c for c in (name, *made) if c in columns)
        if clash or name in _RESERVED_HEAD_NAMES or name.startswith("n_"):
            said = f"its column {clash[-1]!r} is" if clash else "it is reserved, and"
            raise ConfigError(
                f"{where}: head name {name!r} clashes with the output contract ({said} "
                f"already a column or name); choose another name (it makes {made[0]} and "
                f"{made[1]})"
            )


def parse_head_options(options: list[str], configured: dict[str, str]) -> dict[str, str]:
    """``--classifier NAME=DIR`` options merged after the config's ``[classify.heads]``;
    a name given twice (in either, case-insensitively) is refused (ConfigError)."""
    heads = dict(configured)
    for option in options:
        name, sep, folder = option.partition("=")
        name, folder = name.strip(), folder.strip()
        if not sep or not name or not folder:
            raise ConfigError(f"--classifier {option!r}: expected NAME=DIR, e.g. topic=heads/topic")
        if name.lower() in {n.lower() for n in heads}:
            raise ConfigError(
                f"--classifier {name}: a head named {name!r} is already declared (by "
                "[classify.heads] or another --classifier; names are case-insensitive)"
            )
        heads[name] = folder
    check_head_names(list(heads), "--classifier")
    return heads


CALIBRATION_KEY = "calibration"  # training.json: {"method": "temperature", "temperature": T}
_EPS = 1e-12  # log(0) guard


def apply_temperature(probs: np.ndarray, temperature: float) -> np.ndarray:
    """``softmax(log(probs) / temperature)`` row by row (float32); T = 1 returns probs."""
    if temperature == 1.0 or len(probs) == 0:
        return probs
    logits = np.log(np.clip(probs.astype(np.float64), _EPS, None)) / temperature
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def temperature_of(training: dict[str, Any], where: str = "training.json") -> float:
    """The temperature a head's training record stores (1.0 when uncalibrated)."""
    cal = training.get(CALIBRATION_KEY) or {}
    t = cal.get("temperature", 1.0)
    if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < float("inf"):
        raise ModelError(f"{where}: calibration temperature {t!r} is not a positive number")
    return float(t)


LANGUAGES_KEY = "languages"  # training.json: the ISO 639-1 codes the head was trained on
DEFAULT_HEAD_LANGUAGES = ("en",)  # a head whose training.json has no "languages"


def head_languages(training: dict[str, Any], where: str = "training.json") -> list[str]:
    """The languages a head was trained on (its training record's ``languages``; a head
    without the key was trained on English: ``["en"]``)."""
    langs = training.get(LANGUAGES_KEY, list(DEFAULT_HEAD_LANGUAGES))
    ok = isinstance(langs, list) and langs and all(isinstance(c, str) for c in langs)
    if not ok or any(len(c) != 2 or not c.isalpha() for c in langs):
        raise ModelError(
            f'{where}: languages {langs!r} is not a list of ISO 639-1 codes such as ["en"]'
        )
    return [c.lower() for c in langs]


def unlabelled_mask(table: pa.Table, languages: list[str]) -> np.ndarray | None:
    """Rows whose ``language`` the head was not trained on (None: every row is labelled,
    or the table has no ``language`` column: a chain without the language stage)."""
    if LANGUAGE not in table.column_names or table.num_rows == 0:
        return None
    known = pc.is_in(table[LANGUAGE], value_set=pa.array(languages, pa.string()))
    other = pc.invert(pc.fill_null(known, True)).to_numpy(zero_copy_only=False)
    return other if other.any() else None


def label_columns(
    probs: np.ndarray, labels: list[str], unlabelled: np.ndarray | None
) -> tuple[pa.Array, pa.Array]:
    """The arg-max label and its probability of each row; null for ``unlabelled`` rows."""
    best = probs.argmax(axis=1) if len(probs) else np.zeros(0, dtype=np.int64)
    names = np.asarray(labels, dtype=object)[best]
    score = probs[np.arange(len(probs)), best]
    label = pa.array(names.tolist(), pa.string(), mask=unlabelled)
    return label, pa.array(score, pa.float32(), mask=unlabelled)


def read_classifier_meta(model_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """Label names and training record of a classifier folder, without importing TF."""
    for f in (CLASSIFIER_MODEL_FILE, LABELS_FILE, TRAINING_FILE):
        if not (model_dir / f).is_file():
            raise ModelError(
                f"classifier folder {model_dir} has no {f}; expected {CLASSIFIER_MODEL_FILE}, "
                f"{LABELS_FILE} and {TRAINING_FILE} as written by `docintel train`"
            )
    try:
        labels = json.loads((model_dir / LABELS_FILE).read_text())
        training = json.loads((model_dir / TRAINING_FILE).read_text())
    except json.JSONDecodeError as e:
        raise ModelError(f"classifier metadata in {model_dir} is not valid JSON: {e}") from e
    if not (isinstance(labels, list) and labels and all(isinstance(x, str) for x in labels)):
        raise ModelError(f"{model_dir / LABELS_FILE} must be a JSON list of label names")
    return labels, training


def check_head_encoder(model_dir: Path, encoder_dir: Path) -> None:
    """Refuse a head trained on another encoder's embeddings (its ``training.json`` records
    the encoder's version; versions are fingerprints of the weights): the vectors would
    have the right shape and the labels no meaning. Heads without a record pass."""
    _, training = read_classifier_meta(model_dir)
    trained_on = training.get("embedder")
    if not trained_on:
        return
    version = fingerprint(encoder_dir)
    if trained_on != version:
        raise ModelError(
            f"classifier {model_dir} was trained on embeddings of the encoder {trained_on} "
            f"(its {TRAINING_FILE}), but the encoder {encoder_dir} is {version}: the labels "
            "would mean nothing. Set [embed] model_path to the encoder it was trained with "
            '(MODEL_DIR/encoder for a head from `docintel train --fine-tune`, "stock" for the '
            "stock MiniLM), or train a head on this encoder: `docintel train DATA --out DIR`"
        )


def configure_tf(placement: Placement) -> str:
    """Before any TF op: cap a GPU replica at its fraction of the card (TF otherwise maps
    all of it), or hide GPUs from a CPU replica. Returns the backend name."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not placement.wants_gpu:
        if gpus:
            tf.config.set_visible_devices([], "GPU")
        return backend_label(KERAS)
    if not gpus:
        return backend_label(KERAS, gpu=True)
    import torch  # only to read the card's size; TF has no portable query for it

    total_mb = torch.cuda.get_device_properties(0).total_memory // (1024 * 1024)
    limit = int(total_mb * placement.gpu_fraction)
    tf.config.set_visible_devices(gpus[0], "GPU")
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=limit)]
    )
    return backend_label(KERAS, gpu=True, cuda=True)


def load_keras(path: Path, threads: int = 0) -> Any:
    """Load a ``.keras`` file with the TensorFlow backend (imports TF)."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    import keras

    try:
        return keras.saving.load_model(str(path), compile=False)
    except (OSError, ValueError) as e:
        raise ModelError(f"could not load the Keras classifier {path}: {e}") from e


class Classifier(Stage):
    name: ClassVar[str] = "classify"
    input_columns: ClassVar[tuple[str, ...]] = (EMBEDDING,)
    output_columns: ClassVar[tuple[str, ...]] = (LABEL, SCORE, PROBS)

    def __init__(
        self, cfg: ClassifyConfig, threads: int = 0, placement: Placement | None = None
    ) -> None:
        self.cfg = cfg
        self.threads = threads
        self.placement = placement or Placement()
        self.model: Any = None
        self.labels: list[str] = []
        self.temperature = 1.0  # the head's calibration (training.json), read by setup
        self.languages: list[str] = list(DEFAULT_HEAD_LANGUAGES)  # training.json, by setup
        # the extra heads ([classify.heads]), by name: loaded by setup on the same runtime
        self.heads: dict[str, Classifier] = {}

    def setup(self) -> None:
        self.backend = configure_tf(self.placement)
        self._load()
        self.heads = self._extra_heads()

    def _extra_heads(self) -> dict[str, Classifier]:
        """Each extra head as a copy of this stage (same runtime, threads, cache folder)
        that loads its own folder: its labels, calibration, languages and weights."""
        heads: dict[str, Classifier] = {}
        for name in self.cfg.heads:
            head = copy.copy(self)
            head.cfg, head.heads = self.cfg.for_head(name), {}
            if hasattr(head, "artefact"):
                head.artefact = None  # a benchmark's variant is the default head's only
            head._load(first=False)
            heads[name] = head
        return heads

    def _load(self, first: bool = True) -> None:
        """Load the head ``self.cfg`` names (the runtime is configured; ``first``: TF's
        threads are set by the first head's load, before TF runs anything)."""
        model_dir = self.cfg.resolved_model_dir()
        self.labels, training = read_classifier_meta(model_dir)
        self.temperature = temperature_of(training, str(model_dir / TRAINING_FILE))
        self.languages = head_languages(training, str(model_dir / TRAINING_FILE))
        self.model = load_keras(model_dir / CLASSIFIER_MODEL_FILE, self.threads if first else 0)
        n_out = int(self.model.output_shape[-1])
        if n_out != len(self.labels):
            raise ModelError(
                f"{model_dir / CLASSIFIER_MODEL_FILE} outputs {n_out} classes but "
                f"{LABELS_FILE} names {len(self.labels)}"
            )
        self.input_dim = int(self.model.input_shape[-1])
        self.version = fingerprint(model_dir)

    def predict(self, x: np.ndarray) -> np.ndarray:
        if x.shape[1] != self.input_dim:
            raise ModelError(f"classifier expects {self.input_dim}-d embeddings, got {x.shape[1]}")
        parts = [
            np.asarray(self.model(x[i : i + self.cfg.batch_size], training=False))
            for i in range(0, len(x), self.cfg.batch_size)
        ]
        return self._calibrated(parts)

    def _calibrated(self, parts: list[np.ndarray]) -> np.ndarray:
        """The graph's probabilities of every batch, with the head's temperature applied
        (the same numpy code after every runtime: arg-max unchanged)."""
        if not parts:
            return np.zeros((0, len(self.labels)), np.float32)
        return apply_temperature(np.concatenate(parts), self.temperature)

    def __call__(self, table: pa.Table) -> pa.Table:
        emb = table[EMBEDDING].combine_chunks()
        dim = emb.type.list_size
        x = emb.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
        label, score, probs = self._columns(table, x)
        table = table.append_column(LABEL, label).append_column(SCORE, score)
        table = table.append_column(PROBS, probs)
        for name, head in self.heads.items():  # the extra heads, on the same embeddings
            label, score, probs = head._columns(table, x)
            label_col, score_col = head_columns(name)
            table = table.append_column(label_col, label).append_column(score_col, score)
            table = table.append_column(head_probs_field(name, head.labels), probs)
        return table

    def _columns(self, table: pa.Table, x: np.ndarray) -> tuple[pa.Array, pa.Array, pa.Array]:
        """This head's label, score and probabilities of each row of ``x``."""
        probs = self.predict(x).astype(np.float32)
        # a sentence in a language the head was not trained on: null label and score (its
        # probabilities stay in the internal probs column, which no table writes)
        unlabelled = unlabelled_mask(table, self.languages)
        labels, score = label_columns(probs, self.labels, unlabelled)
        flat = pa.array(probs.reshape(-1), pa.float32())
        return labels, score, pa.FixedSizeListArray.from_arrays(flat, len(self.labels))

    def teardown(self) -> None:
        self.model = None
        self.heads = {}


class OnnxClassifier(Classifier):
    """The classifier head as an ONNX graph on ONNX Runtime, built from the Keras weights
    (``docintel quantize``, or a run's first need; cached by the head's version).

    fp32 (this class) is the default CPU path: identical labels to Keras on the validation
    set and no TensorFlow in the process, which saves a CPU replica ~4.5 CPU-s of import
    and ~0.6 GiB. Same contract as ``Classifier`` (it reuses ``__call__``): labels from the
    source folder's labels.json, probabilities in the same order. Loads a prebuilt file;
    nothing is converted here.
    """

    precision: ClassVar[str] = "fp32"
    # how to get the artefact when it is missing
    built_by: ClassVar[str] = (
        '`docintel quantize` or a run (or set [classify] cpu_runtime = "keras")'
    )

    def __init__(
        self,
        cfg: ClassifyConfig,
        int8_dir: Path,
        threads: int = 0,
        artefact: Path | None = None,
    ) -> None:
        super().__init__(cfg, threads=threads, placement=Placement())
        self.int8_dir = int8_dir
        self.artefact = artefact  # benchmarks load other variants; None = the shipped one
        self.session: Any = None

    def artefact_path(self) -> Path:
        return self.artefact or classifier_fp32_path(self.int8_dir, self.cfg.resolved_model_dir())

    def setup(self) -> None:
        self._load()
        self.heads = self._extra_heads()

    def _load(self, first: bool = True) -> None:  # noqa: ARG002 (no process-wide setup)
        model_dir = self.cfg.resolved_model_dir()
        self.labels, training = read_classifier_meta(model_dir)
        self.temperature = temperature_of(training, str(model_dir / TRAINING_FILE))
        self.languages = head_languages(training, str(model_dir / TRAINING_FILE))
        path = self.artefact_path()
        what = f"the {self.precision} classifier {path}"
        if not path.is_file():
            raise ModelError(
                f"{what} (for {model_dir}) does not exist; build it with {self.built_by}"
            )
        try:  # one intra-op thread unless told: a head is small next to the encoder
            self.session = onnx_session(path, self.threads or 1)
        except Exception as e:  # ORT's InvalidProtobuf/Fail/... derive from Exception only
            raise ModelError(
                f"could not load {what}: {e}; rebuild it with `docintel quantize`"
            ) from e
        meta = self.session.get_modelmeta().custom_metadata_map
        built_from = meta.get(META_SOURCE_FINGERPRINT, "unrecorded")
        version = fingerprint(model_dir)
        if self.artefact is None and built_from != version:
            raise ModelError(
                f"{what} was built from {built_from}, not {version} ({model_dir}); rebuild "
                "it with `docintel quantize`"
            )
        (inp,) = self.session.get_inputs()
        (out,) = self.session.get_outputs()
        self.input_name, self.output_name = inp.name, out.name
        self.input_dim = int(inp.shape[-1])
        n_out = int(out.shape[-1])
        if n_out != len(self.labels):
            raise ModelError(
                f"{path} outputs {n_out} classes but {model_dir / LABELS_FILE} names "
                f"{len(self.labels)}; rebuild it with `docintel quantize`"
            )
        if self.precision == "int8":
            self.backend = backend_label(ONNX_INT8)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
            self.version = f"{version}+int8@{digest}"
        else:  # the same weights, as the ONNX encoder says it: <version>+onnx
            self.backend = backend_label(ONNX_FP32)
            self.version = f"{version}+onnx"

    def predict(self, x: np.ndarray) -> np.ndarray:
        if x.shape[1] != self.input_dim:
            raise ModelError(f"classifier expects {self.input_dim}-d embeddings, got {x.shape[1]}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        step = self.cfg.batch_size
        parts = [
            self.session.run([self.output_name], {self.input_name: x[i : i + step]})[0]
            for i in range(0, len(x), step)
        ]
        return self._calibrated(parts)

    def teardown(self) -> None:
        self.session = None
        self.heads = {}


class Int8Classifier(OnnxClassifier):
    """The classifier's int8 copy (built by `docintel quantize`, or a run's first need) on
    ONNX Runtime: the CPU spill replicas' head. A process holding it is ~0.16 GiB instead
    of ~0.78 GiB with Keras, and a 1,024-row batch runs 5x faster on one thread
    (bench/quantize_classifier.md)."""

    precision: ClassVar[str] = "int8"
    built_by: ClassVar[str] = '`docintel quantize` (or set [embed] cpu_precision = "fp32")'

    def artefact_path(self) -> Path:
        return self.artefact or classifier_int8_path(self.int8_dir, self.cfg.resolved_model_dir())
