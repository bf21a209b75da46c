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
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from docintel.pipeline import registry
from docintel.pipeline.artefacts import BUILD_LOCK
from docintel.pipeline.config import Config
from docintel.pipeline.errors import ConfigError, ModelError
from docintel.pipeline.layout import (
    ClusterShape,
    Pool,
    artefacts,
    check_declared_gpus,
    detect_gpus,
    expected_shape,
    stage_layout,
)
from docintel.pipeline.source import (
    InputFile,
    WorkUnit,
    check_ids,
    plan,
    resolve_input,
    split_readable,
)

Layout = dict[str, list[Pool]]


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
    stages: list[str] = field(default_factory=list)  # the chain, in order
    # The embedded Ray's shape and the layout sized to it, computed once here (GPUs
    # detected once); None for a cluster joined by address: sized once connected.
    shape: ClusterShape | None = None
    layout: Layout | None = None


def _layouts(
    cfg: Config, shape: ClusterShape | None, specs: list[registry.StageSpec] | None = None
) -> list[Layout]:
    """The layouts this run may start: the embedded Ray's, known before it starts; for a
    cluster joined by address (its shape is known only once connected), both what a CPU
    cluster and what a GPU cluster would run."""
    if shape is not None:
        return [stage_layout(cfg, shape, specs)]
    out = []
    for guess in (ClusterShape.of(64), ClusterShape.of(64, 1)):
        with contextlib.suppress(ConfigError):  # e.g. gpu-only on a CPU cluster
            out.append(stage_layout(cfg, guess, specs))
    return out


def _artefacts(cfg: Config, layouts: list[Layout]) -> list[registry.Artefact]:
    """Every derived model the layouts run, each once."""
    seen: dict[object, registry.Artefact] = {}
    for layout in layouts:
        for a in artefacts(cfg, layout):
            seen.setdefault(a.path, a)
    return list(seen.values())


def _check_int8(cfg: Config, layouts: list[Layout]) -> None:
    """The int8 artefacts exist for every stage whose layout runs them."""
    for a in _artefacts(cfg, layouts):
        if a.int8 and not a.path.is_file():
            raise ModelError(
                f"the {a.stage} stage's CPU replicas run the {a.what}, but {a.path} (keyed "
                "by the source model's version) does not exist: build it once with "
                "`docintel quantize` "
                '(a run builds it itself), or set [embed] cpu_precision = "fp32"'
            )


def _say(line: str) -> None:
    print(f"docintel: {line}", file=sys.stderr, flush=True)


def ensure_derived(
    cfg: Config,
    say: Callable[[str], None] = _say,
    layout: Layout | None = None,
    layouts: list[Layout] | None = None,
) -> None:
    """Build, once per model version, the derived models the layout(s) run and the cache
    lacks (the registry's backends say which: fused fp32 ONNX graphs, int8 copies).
    Default: any layout this run may start. Never refused for a missing artefact;
    concurrent runs wait on one build (a lock in the folder)."""
    if layouts is None:
        layouts = [layout] if layout is not None else _layouts(cfg, expected_shape(cfg))
    missing = [a for a in _artefacts(cfg, layouts) if not a.path.is_file()]
    if not missing:
        return
    folder = cfg.embed.resolved_int8_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / BUILD_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be building the same files
        for a in missing:
            if a.path.is_file():
                continue  # built meanwhile by the run that held the lock
            say(f"building the {a.what} into {folder} (once per model version)...")
            t0 = time.perf_counter()
            _build(a)
            say(f"built {a.path.name} in {time.perf_counter() - t0:.1f} s")


def _build(artefact: registry.Artefact) -> None:
    """One artefact, with the exporters' progress bars and tracer warnings kept quiet (the
    run prints its own line; a failure still raises)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            artefact.build()
        finally:
            logging.disable(logging.NOTSET)


def check_models(
    cfg: Config,
    specs: list[registry.StageSpec] | None = None,
    layouts: list[Layout] | None = None,
) -> tuple[list[str], dict[str, str], list[str]]:
    """Labels, model versions (per stage, where the driver can know them) and warnings;
    ModelError if a model is missing or mismatched (each stage's registry check), or an
    int8 artefact the layouts run is missing (default: any layout this run may start)."""
    _check_int8(cfg, layouts if layouts is not None else _layouts(cfg, expected_shape(cfg)))
    labels: list[str] = []
    versions: dict[str, str] = {}
    for spec in specs if specs is not None else registry.chain(cfg):
        facts = spec.check(cfg)
        if facts.version is not None:
            versions[spec.name] = facts.version
        if facts.labels is not None:
            labels = facts.labels
    return labels, versions, []


def _gpus(cfg: Config) -> int:
    """The cards of this machine, asked once per run (nvidia-smi); 0 on a cluster joined by
    address (its nodes' GPUs are known once connected)."""
    if cfg.run.ray_address:
        return 0
    return detect_gpus()


def prepare(cfg: Config, input_uri: str) -> Plan:
    """Driver-side checks: inputs, columns, ids, models, stage chain (no Ray, no torch/TF).
    The cluster's shape (GPUs detected once) and the stage layout are computed here and
    carried in the plan."""
    specs = registry.check_config(cfg)  # the chain, from the classes' declarations
    gpus = _gpus(cfg)
    check_declared_gpus(cfg, gpus)
    shape = expected_shape(cfg, gpus)
    layouts = _layouts(cfg, shape, specs)
    ensure_derived(cfg, layouts=layouts)
    labels, versions, warnings = check_models(cfg, specs, layouts)
    fs, files = resolve_input(input_uri, cfg.storage)
    files, skipped = split_readable(fs, files)
    units = plan(fs, files, cfg.input.id_column, cfg.input.text_column, cfg.run.batch_size)
    total = sum(u.n_rows for u in units)  # from the footers plan() read: no second read
    n_docs = check_ids(fs, files, cfg.input.id_column, cfg.input.max_id_bytes, total)
    warnings += [f"skipped unreadable input file: {s['reason']}" for s in skipped]
    return Plan(
        cfg, input_uri, fs, files, units, n_docs, labels, versions, warnings, skipped,
        stages=[s.name for s in specs], shape=shape,
        layout=layouts[0] if shape is not None else None,
    )  # fmt: skip
