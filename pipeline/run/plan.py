"""What a run is before any cluster work: the driver's checks and the plan they produce.

Every check that can fail on bad usage runs here, on the driver, before Ray starts
(exit code 2): the stage chain, the models (present, matching, int8 artefacts where a
pool needs them), the input files, their columns and ids. Nothing here imports Ray,
torch or TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from docintel.pipeline import registry
from docintel.pipeline.artefacts.derived import Layout, ensure_derived  # also imported from here
from docintel.pipeline.artefacts.derived import check_int8 as _check_int8
from docintel.pipeline.artefacts.derived import run_layouts as _layouts
from docintel.pipeline.config import AUTO, Config
from docintel.pipeline.errors import InputError
from docintel.pipeline.input.documents import (
    DOCUMENT_BATCH_SIZE,
    DocumentUnit,
    check_document_ids,
    plan_documents,
)
from docintel.pipeline.input.source import (
    InputFile,
    WorkUnit,
    check_ids,
    plan_sized,
    resolve_input,
    split_readable,
)
from docintel.pipeline.run.layout import (
    GPU_POOL,
    ClusterShape,
    check_declared_gpus,
    detect_gpus,
    expected_shape,
)
from docintel.pipeline.schema import PARQUET_SOURCE


@dataclass
class Plan:
    """Everything the driver checked before any cluster work."""

    cfg: Config
    input_uri: str
    source_fs: pafs.FileSystem
    files: list[InputFile]
    units: list[WorkUnit | DocumentUnit]
    n_documents: int
    labels: list[str]
    versions: dict[str, str]
    warnings: list[str]
    skipped_files: list[dict[str, str]]  # unreadable inputs: the run is partial
    stages: list[str] = field(default_factory=list)  # the chain's names, in order
    # The embedded Ray's shape and the layout sized to it, computed once here (GPUs
    # detected once); None for a cluster joined by address: sized once connected.
    shape: ClusterShape | None = None
    layout: Layout | None = None
    # The stages, resolved once (registry.chain: user stages imported, specs, backends,
    # columns): layout, replica builds, artefacts and split caps all read this one.
    chain: registry.Chain | None = None
    # the classifier's extra heads ([classify.heads]), each {name, dir, version, labels}
    heads: list[dict[str, Any]] = field(default_factory=list)


def check_models(
    cfg: Config,
    specs: registry.Chain | None = None,
    layouts: list[Layout] | None = None,
) -> tuple[list[str], dict[str, str], list[str]]:
    """Labels, model versions (per stage, where the driver can know them) and warnings;
    ModelError if a model is missing or mismatched (each stage's registry check), or an
    int8 artefact the layouts run is missing (default: any layout this run may start)."""
    specs = registry.resolve(cfg, specs)
    labels, versions, _ = check_stages(cfg, specs)
    if layouts is None:
        layouts = _layouts(cfg, expected_shape(cfg), specs)
    _check_int8(specs, layouts)
    return labels, versions, []


def check_stages(
    cfg: Config, specs: registry.Chain
) -> tuple[list[str], dict[str, str], list[dict[str, Any]]]:
    """Each stage's registry check of its source models (present, matching: a head
    trained on another encoder is refused): the labels, the versions it knows and the
    classifier's extra heads."""
    labels: list[str] = []
    versions: dict[str, str] = {}
    heads: list[dict[str, Any]] = []
    for spec in specs:
        facts = spec.check(cfg)
        if facts.version is not None:
            versions[spec.name] = facts.version
        if facts.labels is not None:
            labels = facts.labels
        heads = facts.heads or heads
    return labels, versions, heads


def _gpus(cfg: Config) -> int:
    """The cards of this machine, asked once per run (nvidia-smi); 0 on a cluster joined by
    address (its nodes' GPUs are known once connected)."""
    if cfg.run.ray_address:
        return 0
    return detect_gpus()


def _batches(
    cfg: Config, fs: pafs.FileSystem, files: list[InputFile], layouts: list[Layout]
) -> tuple[list[WorkUnit], Config]:
    """The input cut into batches, and the config with ``run.batch_size`` resolved: an
    "auto" batch size is sized by text bytes (``run.gpu_batch_bytes``) when the run can
    use GPU replicas (a layout with a GPU pool: GPUs on this machine, or a cluster joined
    by address), else DEFAULT_BATCH_SIZE documents (CPU replicas: small batches keep every
    replica busy on small corpora)."""
    run = cfg.run
    gpu = run.batch_size == AUTO and any(
        p.kind == GPU_POOL for lay in layouts for ps in lay.values() for p in ps
    )
    units, size = plan_sized(
        fs, files, cfg.input.id_column, cfg.input.text_column, run.fixed_batch_size(),
        run.gpu_batch_bytes if gpu else 0,
    )  # fmt: skip
    return units, cfg.with_overrides({"run.batch_size": size})


def _documents(
    cfg: Config, files: list[InputFile]
) -> tuple[list[InputFile], list[dict[str, str]], list[DocumentUnit], Config, int]:
    """Document input: the files cut into batches of files (``[run] batch_size``; "auto":
    DOCUMENT_BATCH_SIZE), ids (relative paths) checked; nothing is read on the driver."""
    size = cfg.run.batch_size if isinstance(cfg.run.batch_size, int) else DOCUMENT_BATCH_SIZE
    cfg = cfg.with_overrides({"run.batch_size": size})
    ids = {f.path: f.rel for f in files}
    units = plan_documents(files, ids, size, cfg.parse.max_bytes)
    return files, [], units, cfg, check_document_ids(units, cfg.input.max_id_bytes)


def prepare(cfg: Config, input_uri: str) -> Plan:
    """Driver-side checks: inputs, columns, ids, models, stage chain (no Ray, no torch/TF).
    The cluster's shape (GPUs detected once) and the stage layout are computed here and
    carried in the plan."""
    fs, files = resolve_input(input_uri, cfg.storage)  # a listing: which kind of input
    # what [input] kind names: Parquet files (the source format "parquet") or documents
    kind = "documents" if files and files[0].document else PARQUET_SOURCE
    if cfg.input.kind not in ("auto", kind):
        raise InputError(
            f"[input] kind is {cfg.input.kind!r} but INPUT {input_uri!r} holds {kind} files"
        )
    cfg = cfg.with_overrides({"input.kind": kind})  # the chain has the parse stage or not
    specs = registry.check_config(cfg)  # the chain, from the classes' declarations
    gpus = _gpus(cfg)
    check_declared_gpus(cfg, gpus)
    shape = expected_shape(cfg, gpus)
    layouts = _layouts(cfg, shape, specs)
    # the source models first: nothing is built from a model the run refuses
    labels, versions, heads = check_stages(cfg, specs)
    ensure_derived(cfg, layouts=layouts, chain=specs)
    _check_int8(specs, layouts)
    warnings: list[str] = []
    if kind == "documents":
        files, skipped, units, cfg, n_docs = _documents(cfg, files)
    else:
        files, skipped = split_readable(fs, files)
        units, cfg = _batches(cfg, fs, files, layouts)
        total = sum(u.n_rows for u in units)  # from the footers plan() read: no second read
        n_docs = check_ids(fs, files, cfg.input.id_column, cfg.input.max_id_bytes, total)
    warnings += [f"skipped unreadable input file: {s['reason']}" for s in skipped]
    return Plan(
        cfg, input_uri, fs, files, units, n_docs, labels, versions, warnings, skipped,
        stages=specs.names, shape=shape, layout=layouts[0] if shape is not None else None,
        chain=specs.with_config(cfg), heads=heads,
    )  # fmt: skip
