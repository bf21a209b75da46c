"""What a run is before any cluster work: the driver's checks and the plan they produce.

Every check that can fail on bad usage runs here, on the driver, before Ray starts
(exit code 2): the stage chain, the models (present, matching, int8 artefacts where a
pool needs them), the input files, their columns and ids. Nothing here imports Ray,
torch or TensorFlow.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from docintel.pipeline.artefacts import (
    BUILD_LOCK,
    FP32_MODEL_FILE,
    INT8_MODEL_FILE,
    classifier_fp32_path,
    classifier_int8_path,
)
from docintel.pipeline.config import Config
from docintel.pipeline.errors import ConfigError, ModelError
from docintel.pipeline.layout import (
    ClusterShape,
    Pool,
    chain_stages,
    check_declared_gpus,
    expected_shape,
    int8_stages,
    onnx_fp32_stages,
    stage_layout,
)
from docintel.pipeline.schema import DOC_ID, TEXT
from docintel.pipeline.source import (
    InputFile,
    WorkUnit,
    check_ids,
    plan,
    resolve_input,
    split_readable,
)
from docintel.pipeline.stages import check_chain
from docintel.pipeline.stages.classify import check_head_encoder, read_classifier_meta
from docintel.pipeline.stages.embed import check_encoder_dir, embedding_dim
from docintel.pipeline.versions import fingerprint


@dataclass
class Plan:
    """Everything the driver checked before any cluster work."""

    cfg: Config
    input_uri: str
    source_fs: pafs.FileSystem
    files: list[InputFile]
    units: list[WorkUnit]
    n_documents: int
    labels: list[str]
    versions: dict[str, str]
    warnings: list[str]
    skipped_files: list[dict[str, str]]  # unreadable inputs: the run is partial


def _check_spacy(name: str) -> None:
    if name.startswith("blank:"):
        return
    import spacy.util

    if not (spacy.util.is_package(name) or Path(name).is_dir()):
        raise ModelError(
            f"spaCy pipeline {name!r} is not installed; install its package "
            'or use [sentencize] spacy_model = "blank:en"'
        )


@dataclass(frozen=True)
class _Derived:
    """A model built from another one that this layout's replicas load."""

    what: str
    path: Path
    kind: str  # "fp32" | "int8" | "fp32-head" | "int8-head": how offline/quantize builds it
    stage: str


def _layouts(cfg: Config) -> list[dict[str, list[Pool]]]:
    """The layouts this run may start: the embedded Ray's, known before it starts; for a
    cluster joined by address (its shape is known only once connected), both what a CPU
    cluster and what a GPU cluster would run."""
    shape = expected_shape(cfg)
    if shape is not None:
        return [stage_layout(cfg, shape)]
    out = []
    for guess in (ClusterShape.of(64), ClusterShape.of(64, 1)):
        with contextlib.suppress(ConfigError):  # e.g. gpu-only on a CPU cluster
            out.append(stage_layout(cfg, guess))
    return out


def _derived(cfg: Config, layout: dict[str, list[Pool]] | None = None) -> list[_Derived]:
    """Every derived model the layout runs (default: any layout this run may start), where
    the cache keeps it (by model version)."""
    layouts = [layout] if layout is not None else _layouts(cfg)
    folder = cfg.embed.resolved_int8_dir()
    out = []
    onnx = {s for lay in layouts for s in onnx_fp32_stages(cfg, lay)}
    if "embed" in onnx:
        out.append(_Derived("fused fp32 ONNX encoder", folder / FP32_MODEL_FILE, "fp32", "embed"))
    if "classify" in onnx:
        head = classifier_fp32_path(folder, cfg.classify.resolved_model_dir())
        out.append(_Derived("fp32 ONNX classifier", head, "fp32-head", "classify"))
    int8 = {s for lay in layouts for s in int8_stages(lay)}
    if "embed" in int8:
        out.append(_Derived("int8 encoder", folder / INT8_MODEL_FILE, "int8", "embed"))
    if "classify" in int8:
        head = classifier_int8_path(folder, cfg.classify.resolved_model_dir())
        out.append(_Derived("int8 classifier", head, "int8-head", "classify"))
    return out


def _check_int8(cfg: Config) -> None:
    """The int8 artefacts exist for every stage whose layout runs them."""
    for d in _derived(cfg):
        if d.kind.startswith("int8") and not d.path.is_file():
            raise ModelError(
                f"the {d.stage} stage's CPU replicas run the {d.what}, but {d.path} (keyed "
                "by the source model's version) does not exist: build it once with "
                "`docintel quantize` (a run builds it itself), or set [embed] cpu_precision "
                '= "fp32"'
            )


def _say(line: str) -> None:
    print(f"docintel: {line}", file=sys.stderr, flush=True)


def ensure_derived(
    cfg: Config,
    say: Callable[[str], None] = _say,
    layout: dict[str, list[Pool]] | None = None,
) -> None:
    """Build, once per model version, the derived models this layout runs and the cache
    lacks: the fp32 ONNX encoder and classifier head, the int8 encoder and classifier. Never
    refused for a missing artefact; concurrent runs wait on one build (a lock in the
    folder)."""
    int8 = cfg.embed.resolved_int8_dir()
    missing = [d for d in _derived(cfg, layout) if not d.path.is_file()]
    if not missing:
        return
    int8.mkdir(parents=True, exist_ok=True)
    with (int8 / BUILD_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be building the same files
        for d in missing:
            if d.path.is_file():
                continue  # built meanwhile by the run that held the lock
            say(f"building the {d.what} into {int8} (once per model version)...")
            t0 = time.perf_counter()
            _build(d.kind, cfg, int8, cfg.classify.resolved_model_dir())
            say(f"built {d.path.name} in {time.perf_counter() - t0:.1f} s")


def _build(kind: str, cfg: Config, int8: Path, clf_dir: Path) -> None:
    """One artefact, with the exporters' progress bars and tracer warnings kept quiet (the
    run prints its own line; a failure still raises)."""
    import transformers

    from docintel.pipeline.offline import quantize

    encoder = cfg.embed.resolved_model_path()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            if kind == "fp32":
                quantize.build_fp32(encoder, int8)
            elif kind == "int8":
                quantize.build_int8(encoder, int8)
            elif kind == "fp32-head":
                quantize.build_fp32_classifier(clf_dir, int8)
            else:
                quantize.build_int8_classifier(clf_dir, int8)
        finally:
            logging.disable(logging.NOTSET)


def check_models(cfg: Config) -> tuple[list[str], dict[str, str], list[str]]:
    """Labels, model versions and warnings; ModelError if a model is missing or mismatched."""
    warnings: list[str] = []
    embed_path = cfg.embed.resolved_model_path()
    check_encoder_dir(embed_path)
    clf_dir = cfg.classify.resolved_model_dir()
    labels, training = read_classifier_meta(clf_dir)
    dim = embedding_dim(embed_path)
    if training.get("embedding_dim") != dim:
        raise ModelError(
            f"classifier {clf_dir} was trained on {training.get('embedding_dim')}-d embeddings "
            f"but the embedder {embed_path} makes {dim}-d ones; train a matching head with "
            "`docintel train DATA --out DIR` and set [classify] model_dir"
        )
    embed_version = fingerprint(embed_path)
    check_head_encoder(clf_dir, embed_path)  # another encoder's head: refused, not warned
    _check_spacy(cfg.sentencize.spacy_model)
    _check_int8(cfg)
    versions = {"embed": embed_version, "classify": fingerprint(clf_dir)}
    return labels, versions, warnings


def prepare(cfg: Config, input_uri: str) -> Plan:
    """Driver-side checks: inputs, columns, ids, models, stage chain (no Ray, no torch/TF)."""
    check_declared_gpus(cfg)
    check_chain([DOC_ID, TEXT], chain_stages(cfg))  # stage objects are config only: cheap
    ensure_derived(cfg)
    labels, versions, warnings = check_models(cfg)
    fs, files = resolve_input(input_uri, cfg.storage)
    files, skipped = split_readable(fs, files)
    units = plan(fs, files, cfg.input.id_column, cfg.input.text_column, cfg.run.batch_size)
    total = sum(u.n_rows for u in units)  # from the footers plan() read: no second read
    n_docs = check_ids(fs, files, cfg.input.id_column, cfg.input.max_id_bytes, total)
    warnings += [f"skipped unreadable input file: {s['reason']}" for s in skipped]
    return Plan(cfg, input_uri, fs, files, units, n_docs, labels, versions, warnings, skipped)
