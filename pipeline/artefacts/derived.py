"""Derived model artefacts on the driver: which ones a run may load, and building the
missing or damaged ones once, before any cluster work.

A derived artefact (the fused fp32 ONNX encoder, the int8 encoder, the fp32 and int8 ONNX
classifier heads; the stage registry's backends declare them) is built once per source
model version into the cache folder, by `docintel quantize` or by the first run that needs
it. Each is written whole with its SHA-256 beside it (pipeline/artefacts/paths.py). Before a run
the driver checks every artefact its layouts load against that checksum (~0.2 s for the
90 MB encoder, once per process); one that is missing, fails it, or (written before
checksums were kept) fails to load is rebuilt once, under the folder's build lock, with a
line saying so. A rebuild that still fails is a ModelError (exit 2). Nothing here imports
Ray, torch or TensorFlow (a build imports what it needs).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from docintel.pipeline import registry
from docintel.pipeline.artefacts.paths import (
    MISSING,
    NO_CHECKSUM,
    build_lock,
    checksum_problem,
    remove_staged,
    write_checksum,
)
from docintel.pipeline.config import Config
from docintel.pipeline.errors import ConfigError, ModelError
from docintel.pipeline.run.layout import ClusterShape, Pool, artefacts, expected_shape, stage_layout

Layout = dict[str, list[Pool]]


def run_layouts(
    cfg: Config, shape: ClusterShape | None, specs: registry.Chain | None = None
) -> list[Layout]:
    """The layouts this run may start: the embedded Ray's, known before it starts; for a
    cluster joined by address (its shape is known only once connected), both what a CPU
    cluster and what a GPU cluster would run."""
    specs = registry.resolve(cfg, specs)
    if shape is not None:
        return [stage_layout(cfg, shape, specs)]
    out = []
    for guess in (ClusterShape.of(64), ClusterShape.of(64, 1)):
        with contextlib.suppress(ConfigError):  # e.g. gpu-only on a CPU cluster
            out.append(stage_layout(cfg, guess, specs))
    return out


def derived_artefacts(chain: registry.Chain, layouts: list[Layout]) -> list[registry.Artefact]:
    """Every derived model the layouts of ``chain`` run, each once."""
    seen: dict[object, registry.Artefact] = {}
    for layout in layouts:
        for a in artefacts(chain, layout):
            seen.setdefault(a.path, a)
    return list(seen.values())


def check_int8(chain: registry.Chain, layouts: list[Layout]) -> None:
    """The int8 artefacts exist for every stage whose layout runs them."""
    for a in derived_artefacts(chain, layouts):
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
    chain: registry.Chain | None = None,
) -> None:
    """Build, once per model version, the derived models the layout(s) of ``chain`` (the
    plan's; default: ``cfg``'s) run and the cache lacks or holds damaged (the registry's
    backends say which: fused fp32 ONNX graphs, int8 copies). Default: any layout this
    run may start. Never refused for a missing artefact; concurrent runs and `docintel
    quantize` wait on one build (the folder's build lock), and whoever gets the lock
    second finds the work done."""
    chain = registry.resolve(cfg, chain)
    if layouts is None:
        layouts = [layout] if layout is not None else run_layouts(cfg, expected_shape(cfg), chain)
    wanted = derived_artefacts(chain, layouts)
    if all(checksum_problem(a.path) is None for a in wanted):
        return
    check_sources(cfg, chain)
    folder = cfg.embed.resolved_int8_dir()
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(build_lock(folder))
        except OSError as e:  # a read-only cache (artefacts shipped in an image)
            _use_as_is(wanted, folder, e)
            return
        for parent in {a.path.parent for a in wanted}:
            remove_staged(parent)  # what a killed build left: never read, never kept
        for a in wanted:
            _settle(a, folder, say)


def check_sources(cfg: Config, chain: registry.Chain) -> None:
    """Before anything is built: every stage's source models pass its registry check
    (present, matching: a head trained on another encoder is refused here), so that
    nothing is built, into any cache folder, from models the run would refuse."""
    for spec in chain:
        spec.check(cfg)


def _use_as_is(wanted: list[registry.Artefact], folder: Path, err: OSError) -> None:
    """A cache folder this process cannot write: run on what is intact (or, cached before
    checksums were kept, loads); refuse what is not, since it cannot be rebuilt here."""
    for a in wanted:
        problem = checksum_problem(a.path)
        if problem is None or (problem == NO_CHECKSUM and _loads(a.path)):
            continue
        said = "does not load" if problem == NO_CHECKSUM else problem
        raise ModelError(
            f"the {a.what} {a.path} {said}, and it cannot be rebuilt here: {folder} is not "
            f"writable ({err.strerror or err}). Build it where the cache is writable "
            "(`docintel quantize`, or the image build), or point [embed] int8_dir or "
            "DOCINTEL_CACHE_DIR at a writable folder"
        )


def _settle(a: registry.Artefact, folder: Path, say: Callable[[str], None]) -> None:
    """Under the build lock: leave an intact artefact alone; record the checksum of one
    built before checksums were kept if it loads; else build it (once) and check it."""
    problem = checksum_problem(a.path)  # again: the run that held the lock may have built it
    if problem is None:
        return
    if problem == NO_CHECKSUM and _loads(a.path):
        write_checksum(a.path)
        return
    if problem != MISSING:
        said = "does not load" if problem == NO_CHECKSUM else problem
        say(f"the cached {a.what} {a.path} {said}: rebuilding it (once)")
    say(f"building the {a.what} into {a.path.parent} (once per source version)...")
    t0 = time.perf_counter()
    _build(a)
    after = checksum_problem(a.path)
    if after is not None:
        raise ModelError(
            f"rebuilt the {a.what} {a.path}, but it still {after}; check the disk of "
            f"{folder} (full? shared by hosts that write it at once?), delete the folder "
            "and build it with `docintel quantize`"
        )
    say(f"built {a.path.name} in {time.perf_counter() - t0:.1f} s")


def _loads(path: Path) -> bool:
    """ONNX Runtime opens ``path`` (no graph optimisation: a check, ~1 s for the encoder).
    Only for artefacts cached before checksums were kept, once: then the checksum rules."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    try:
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception:  # ORT's InvalidProtobuf/Fail/... derive from Exception only
        return False
    return True


def _build(artefact: registry.Artefact) -> None:
    """One artefact, with the exporters' progress bars and tracer warnings kept quiet (the
    run prints its own line; a failure still raises)."""
    if not artefact.exported:  # nothing to quiet: no transformers import (~1-2 s)
        artefact.build()
        return
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
