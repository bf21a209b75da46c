"""The one run function behind `docintel run`, the Ray batch job and the nightly audit.

Order: every check that can fail on bad usage runs on the driver first (exit code 2),
then Ray starts, the stage pools load their models, batches stream, and the manifest is
committed last.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.config import ERROR_FRACTION_MIN_DOCS, Config
from pipeline.errors import ModelError, RunFailed, UsageError
from pipeline.quantize import INT8_MODEL_FILE, classifier_int8_path
from pipeline.schema import DOC_ID, N_TOKENS, STAGES, TEXT
from pipeline.sink import (
    TABLES,
    BatchStats,
    atomic_write,
    part_path,
    read_manifest,
    resolve_output,
    write_manifest,
)
from pipeline.source import (
    InputFile,
    WorkUnit,
    check_ids,
    plan,
    resolve_input,
    split_readable,
)
from pipeline.stages import check_chain
from pipeline.stages.classify import read_classifier_meta
from pipeline.stages.embed import check_encoder_dir, embedding_dim
from pipeline.versions import fingerprint

RUN_STATE = "_run.json"  # written first: marks the folder as holding (part of) this run


@dataclass
class RunSummary:
    run_id: str
    output: str
    documents: int = 0
    sentences: int = 0
    errors: int = 0
    tokens: int = 0
    batches: int = 0  # batches processed by this invocation
    skipped_batches: int = 0  # committed by an earlier invocation of the same run
    wall_seconds: float = 0.0
    startup_seconds: float = 0.0
    processing_seconds: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    backends: dict[str, dict[str, int]] = field(default_factory=dict)
    already_complete: bool = False
    skipped_files: list[dict[str, str]] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        """Input files were skipped as unreadable: not every document was read."""
        return bool(self.skipped_files)

    warnings: list[str] = field(default_factory=list)

    @property
    def docs_per_s(self) -> float:
        return self.documents / self.wall_seconds if self.wall_seconds else 0.0


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
    if training.get("embedder") != embed_version:
        warnings.append(
            f"classifier {clf_dir} was trained on embeddings of "
            f"{training.get('embedder')}, this run embeds with {embed_version}"
        )
    name = cfg.sentencize.spacy_model
    if not name.startswith("blank:"):
        import spacy.util

        if not (spacy.util.is_package(name) or Path(name).is_dir()):
            raise ModelError(
                f"spaCy pipeline {name!r} is not installed; install its package "
                'or use [sentencize] spacy_model = "blank:en"'
            )
    from actors.stages import cpu_int8

    cpu_pools = cfg.run.spill != "gpu-only"
    if cpu_int8(cfg, "embed") and cfg.resources.embed.replicas > 0 and cpu_pools:
        int8 = cfg.embed.resolved_int8_dir()
        if not (int8 / INT8_MODEL_FILE).is_file():
            raise ModelError(
                f"the embed stage's CPU replicas run the int8 encoder, but {int8} holds no "
                f"{INT8_MODEL_FILE}: build it once with `docintel quantize`, or set [embed] "
                'cpu_precision = "fp32"'
            )
    if cpu_int8(cfg, "classify") and cfg.resources.classify.replicas > 0 and cpu_pools:
        head = classifier_int8_path(cfg.embed.resolved_int8_dir(), clf_dir)
        if not head.is_file():
            raise ModelError(
                f"the classify stage's CPU replicas run the int8 classifier, but {head} (the "
                f"int8 copy of {clf_dir}, keyed by its version) does not exist: build it "
                'once with `docintel quantize`, or set [embed] cpu_precision = "fp32"'
            )
    versions = {"embed": embed_version, "classify": fingerprint(clf_dir)}
    return labels, versions, warnings


def prepare(cfg: Config, input_uri: str) -> Plan:
    """Driver-side checks: inputs, columns, ids, models, stage chain (no Ray, no torch/TF)."""
    from actors.executor import STAGE_ORDER
    from actors.stages import build_stage  # stage objects are config only: cheap

    check_chain([DOC_ID, TEXT], [build_stage(s, cfg) for s in STAGE_ORDER])
    labels, versions, warnings = check_models(cfg)
    fs, files = resolve_input(input_uri, cfg.storage)
    files, skipped = split_readable(fs, files)
    units = plan(fs, files, cfg.input.id_column, cfg.input.text_column, cfg.run.batch_size)
    n_docs = check_ids(fs, files, cfg.input.id_column)
    warnings += [f"skipped unreadable input file: {s['reason']}" for s in skipped]
    return Plan(cfg, input_uri, fs, files, units, n_docs, labels, versions, warnings, skipped)


def _committed(fs: pafs.FileSystem, root: str) -> set[str]:
    sel = pafs.FileSelector(f"{root}/documents", allow_not_found=True)
    names = (info.base_name for info in fs.get_file_info(sel))
    return {
        n[len("part-") : -len(".parquet")]
        for n in names
        if n.startswith("part-") and n.endswith(".parquet")
    }


def _read_state(fs: pafs.FileSystem, root: str) -> dict[str, Any] | None:
    import json

    path = f"{root}/{RUN_STATE}"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode())


def open_output(
    p: Plan, output_uri: str, run_id: str
) -> tuple[pafs.FileSystem, str, str, set[str], dict | None]:
    """Decide new run / resume / already complete. Returns fs, root, run id, skip, manifest."""
    import json

    fs, root = resolve_output(output_uri, p.cfg.storage)
    manifest = read_manifest(fs, root)
    if manifest is not None:
        if run_id and manifest["run_id"] != run_id:
            raise UsageError(
                f"{output_uri} already holds completed run {manifest['run_id']!r};"
                " choose an empty output folder for a new run"
            )
        return fs, root, manifest["run_id"], set(), manifest
    state = _read_state(fs, root)
    if state is not None:
        if state["run_id"] != run_id:
            raise UsageError(
                f"{output_uri} holds unfinished run {state['run_id']!r}; rerun with "
                f"--run-id {state['run_id']} to resume it, or choose an empty output folder"
            )
        if state["input"] != p.input_uri:
            raise UsageError(
                f"run {run_id!r} in {output_uri} read {state['input']!r}, not "
                f"{p.input_uri!r}; resume it with the same input"
            )
        return fs, root, run_id, _committed(fs, root), None
    if fs.get_file_info(root).type == pafs.FileType.File:
        raise UsageError(f"output {output_uri} is a file; give a folder or s3:// prefix")
    existing = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    if any(i.base_name in TABLES for i in existing):
        raise UsageError(
            f"output {output_uri} already holds docintel tables but no run "
            "state; choose an empty output folder"
        )
    run_id = run_id or f"{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    state = {"run_id": run_id, "input": p.input_uri, "started": dt.datetime.now(dt.UTC).isoformat()}
    atomic_write(fs, f"{root}/{RUN_STATE}", json.dumps(state).encode())
    return fs, root, run_id, set(), None


def _final_counts(fs: pafs.FileSystem, root: str) -> dict[str, int]:
    """Count what the committed tables hold (the manifest reports tables, not hopes)."""

    def ds(table: str) -> pads.Dataset:
        return pads.dataset(f"{root}/{table}", filesystem=fs, format="parquet")

    ids = ds("documents").to_table(columns=[DOC_ID])[DOC_ID]
    tokens = ds("sentences").to_table(columns=[N_TOKENS])[N_TOKENS]
    return {
        "documents": len(ids),
        "distinct_ids": pc.count_distinct(ids).as_py(),
        "sentences": len(tokens),
        "tokens": int(pc.sum(tokens).as_py() or 0),
        "errors": ds("errors").count_rows(),
    }


def _resumed_backends(
    fs: pafs.FileSystem, root: str, batch_ids: set[str]
) -> dict[str, Counter[str]]:
    """Backends that served the batches an earlier invocation of this run committed.

    Read back from their sentences parts (one replica per stage serves a whole batch, so
    the first row tells), so the manifest counts every batch of a resumed run, not only
    this invocation's. A batch without sentences (only empty or failed documents) has
    nothing to tell and is not counted.
    """
    columns = [f"{stage}_backend" for stage in STAGES]
    served: dict[str, Counter[str]] = {}
    for batch_id in sorted(batch_ids):
        t = pq.read_table(part_path(root, "sentences", batch_id), columns=columns, filesystem=fs)
        if t.num_rows:
            for stage in STAGES:
                served.setdefault(stage, Counter())[t[f"{stage}_backend"][0].as_py()] += 1
    return served


@dataclass
class ErrorBudget:
    """Fails the run when more than ``max_fraction`` of the documents end as errors."""

    max_fraction: float
    documents: int = 0
    errors: int = 0

    def _check(self, errors: int, documents: int, when: str) -> None:
        if documents and errors / documents > self.max_fraction:
            raise RunFailed(
                f"{errors:,} of {documents:,} documents failed {when} "
                f"({errors / documents:.0%} > run.max_error_fraction "
                f"{self.max_fraction:.0%}); the run is not committed. See the errors/ "
                "table for the reasons; raise run.max_error_fraction only if this is expected"
            )

    def update(self, stats: BatchStats) -> None:
        self.documents += stats.documents
        self.errors += stats.errors
        if self.documents >= ERROR_FRACTION_MIN_DOCS:
            self._check(self.errors, self.documents, "so far")

    def check_final(self, errors: int, documents: int) -> None:
        self._check(errors, documents, "in this run's output")


def _manifest(
    p: Plan, summary: RunSummary, models: dict[str, str], committed: set[str]
) -> dict[str, Any]:
    return {
        "run_id": summary.run_id,
        "finished": dt.datetime.now(dt.UTC).isoformat(),
        "input": {"uri": p.input_uri, "files": [asdict(f) for f in p.files]},
        "output": summary.output,
        "config": p.cfg.model_dump(),
        "models": models,
        "labels": p.labels,
        "counts": {
            "documents": summary.documents,
            "sentences": summary.sentences,
            "errors": summary.errors,
            "tokens": summary.tokens,
            "batches": len(committed),
        },
        "committed_batches": sorted(committed),
        "resumed_batches": summary.skipped_batches,
        "timings": {
            "wall_seconds": summary.wall_seconds,
            # checks, Ray start and model loading, then streaming the batches
            "startup_seconds": summary.startup_seconds,
            "processing_seconds": summary.processing_seconds,
            "stage_seconds": summary.stage_seconds,
        },
        "backends": summary.backends,
        "warnings": p.warnings,
        "partial": bool(p.skipped_files),
        "skipped_files": p.skipped_files,
    }


def execute(
    cfg: Config,
    input_uri: str,
    output_uri: str,
    on_start: Callable[[int, int], None] | None = None,
    on_batch: Callable[[BatchStats], None] | None = None,
) -> RunSummary:
    """Run the pipeline from ``input_uri`` to ``output_uri``; the manifest is written last.

    ``on_start(total_documents, documents_already_done)`` and ``on_batch(stats)`` feed a
    progress display.
    """
    t0 = time.perf_counter()
    p = prepare(cfg, input_uri)
    fs, root, run_id, skip, manifest = open_output(p, output_uri, cfg.run.run_id)
    if manifest is not None:
        c = manifest["counts"]
        return RunSummary(
            run_id,
            output_uri,
            c["documents"],
            c["sentences"],
            c["errors"],
            c["tokens"],
            already_complete=True,
            skipped_files=manifest.get("skipped_files", []),
        )

    from actors.cluster import ray_session, stage_pools
    from actors.executor import Executor, Sink

    summary = RunSummary(
        run_id,
        output_uri,
        skipped_batches=len(skip),
        warnings=p.warnings,
        skipped_files=p.skipped_files,
    )
    errors = ErrorBudget(cfg.run.max_error_fraction)
    stage_seconds: Counter[str] = Counter()
    served: dict[str, Counter[str]] = {}
    done_docs = sum(
        min(cfg.run.batch_size, u.n_rows - k * cfg.run.batch_size)
        for u in p.units
        for k, b in enumerate(u.batch_ids)
        if b in skip
    )
    with ray_session(cfg), stage_pools(cfg, run_id) as (actors, dispatcher, info):
        summary.startup_seconds = time.perf_counter() - t0
        if on_start:
            on_start(p.n_documents, done_docs)
        slots = sum(dispatcher.slots(s) for s in dispatcher.pools)
        executor = Executor(
            actors,
            dispatcher,
            p.source_fs,
            cfg.input.id_column,
            cfg.input.text_column,
            cfg.run.batch_size,
            Sink(fs, root, p.labels, cfg.run.embeddings),
            cfg.resources.io_cpus,
            cfg.run.max_batches_in_flight or 2 * slots,
        )

        def record(stats: BatchStats) -> None:
            errors.update(stats)
            stage_seconds.update(stats.seconds)
            for stage, backend in stats.backends.items():
                served.setdefault(stage, Counter())[backend] += 1
            if on_batch:
                on_batch(stats)

        stats = executor.run(p.units, skip, record)
        summary.processing_seconds = time.perf_counter() - t0 - summary.startup_seconds
    summary.batches = len(stats)
    counts = _final_counts(fs, root)
    if not counts["documents"] == counts["distinct_ids"] == p.n_documents:
        raise RunFailed(
            f"{output_uri}/documents has {counts['documents']} rows for "
            f"{counts['distinct_ids']} ids but the input has {p.n_documents} documents; "
            "the run is not committed"
        )
    errors.check_final(counts["errors"], counts["documents"])
    summary.documents = counts["documents"]
    summary.sentences, summary.errors = counts["sentences"], counts["errors"]
    summary.tokens = counts["tokens"]
    summary.wall_seconds = time.perf_counter() - t0
    summary.stage_seconds = dict(stage_seconds)
    for stage, counts in _resumed_backends(fs, root, skip).items():
        served.setdefault(stage, Counter()).update(counts)
    summary.backends = {s: dict(c) for s, c in served.items()}
    committed = skip | {s.batch_id for s in stats}
    write_manifest(
        fs, root, _manifest(p, summary, {s: i["version"] for s, i in info.items()}, committed)
    )
    return summary
