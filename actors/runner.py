"""The one run function behind `docintel run`, the Ray batch job and the nightly audit.

Order: every check that can fail on bad usage runs on the driver first
(:func:`docintel.pipeline.plan.prepare`, exit code 2), the output is opened
(:class:`docintel.pipeline.output.RunOutput`: new run, resume or already complete), then Ray
starts, the stage pools load their models, batches stream through the
:class:`~docintel.actors.executor.Executor`, and the output is committed (manifest last).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import ray

from docintel.actors import cluster
from docintel.actors.executor import Executor, Sink
from docintel.actors.resources import task_options
from docintel.pipeline import compact
from docintel.pipeline.config import Config
from docintel.pipeline.layout import Pool, stage_layout
from docintel.pipeline.output import RunOutput, RunSummary
from docintel.pipeline.plan import Plan, ensure_derived, prepare
from docintel.pipeline.sink import BatchStats

StartCallback = Callable[[int, int], None]  # (total documents, documents already done)
BatchCallback = Callable[[BatchStats], None]


def execute(
    cfg: Config,
    input_uri: str,
    output_uri: str,
    on_start: StartCallback | None = None,
    on_batch: BatchCallback | None = None,
) -> RunSummary:
    """Run the pipeline from ``input_uri`` to ``output_uri``; the manifest is written last.

    ``on_start(total_documents, documents_already_done)`` and ``on_batch(stats)`` feed a
    progress display.
    """
    t0 = time.perf_counter()
    p = prepare(cfg, input_uri)
    with RunOutput.open(p, output_uri, cfg.run.run_id) as output:
        if output.complete:
            return output.completed_summary()
        summary = RunSummary(
            output.run_id,
            output_uri,
            skipped_batches=len(output.resumed),
            warnings=p.warnings,
            skipped_files=p.skipped_files,
        )
        models = _process(cfg, p, output, summary, t0, on_start, on_batch)
        summary.wall_seconds = time.perf_counter() - t0
        return output.commit(summary, models)


def _process(
    cfg: Config,
    p: Plan,
    output: RunOutput,
    summary: RunSummary,
    t0: float,
    on_start: StartCallback | None,
    on_batch: BatchCallback | None,
) -> dict[str, str]:
    """Start Ray and the stage pools, stream every uncommitted batch, stop them; returns
    each model stage's version as its replicas reported it."""
    # through the module, so a test can stand in a Ray of its own for ray_session
    with cluster.ray_session(cfg):
        # sized to the cluster as it is now; the artefacts that layout runs exist (built
        # on first need; a no-op when prepare() already built them for the same layout)
        layout = stage_layout(cfg, cluster.current_shape())
        ensure_derived(cfg, layout=layout)
        return _stream(cfg, p, output, summary, t0, layout, on_start, on_batch)


def _stream(
    cfg: Config,
    p: Plan,
    output: RunOutput,
    summary: RunSummary,
    t0: float,
    layout: dict[str, list[Pool]],
    on_start: StartCallback | None,
    on_batch: BatchCallback | None,
) -> dict[str, str]:
    with cluster.stage_pools(cfg, output.run_id, layout) as pools:
        if on_start:
            on_start(p.n_documents, output.done_documents())
        executor = Executor(
            pools.actors,
            pools.dispatcher,
            p.source_fs,
            cfg.input.id_column,
            cfg.input.text_column,
            cfg.run.batch_size,
            Sink(output.fs, output.root, p.labels, cfg.run.embeddings),
            cfg.resources.io_cpus,
            cfg.run.max_batches_in_flight,
            on_tick=pools.poll,
            metrics=pools.metrics,
            wake=pools.pending_refs,
        )

        def record(stats: BatchStats) -> None:
            output.record(stats)
            if on_batch:
                on_batch(stats)

        executor.run(p.units, output.resumed, record)
        # start-up: checks, Ray, reads and model loads until the first replica call (the
        # other replicas load meanwhile); processing: from there to the last batch written
        end = time.perf_counter()
        summary.startup_seconds = (executor.first_call or end) - t0
        summary.processing_seconds = end - t0 - summary.startup_seconds
        if pools.loaded_at is not None:
            summary.models_loaded_seconds = pools.loaded_at - t0
        _compact(cfg, output)
        output.replicas = pools.records()
        summary.replicas = pools.per_pool()
        return {s: i["version"] for s, i in pools.info.items()}


_merge_task = ray.remote(compact.merge_group)


def _compact(cfg: Config, output: RunOutput) -> None:
    """Merge small batch parts (pipeline/compact.py) on the cluster's I/O tasks, a few
    groups at a time, under the output's lease."""
    t0 = time.perf_counter()
    groups = compact.plan_groups(output.fs, output.root, int(cfg.run.part_target_mb * 2**20))
    window = max(1, int(ray.available_resources().get("CPU", 1) / cfg.resources.io_cpus))
    # a merge is idempotent: retried on any error (an S3 hiccup), not only a lost worker
    opts = {**task_options(cfg.resources.io_cpus), "retry_exceptions": True}
    pending: list[ray.ObjectRef] = []
    removed = 0

    def settle(refs: list[ray.ObjectRef]) -> None:
        nonlocal removed
        for n, stats in ray.get(refs):
            removed += n
            # resumed batches' stats now live in the merged footers only
            output.merged.update((s.batch_id, s) for s in stats)

    for group in groups:
        output.lease.check()
        if len(pending) >= window:
            done, pending = ray.wait(pending, num_returns=1)
            settle(done)
        pending.append(_merge_task.options(**opts).remote(output.fs, output.root, group))
    settle(pending)
    output.compaction = {
        "merged_groups": len(groups),
        "merged_batches": sum(len(g.batch_ids) for g in groups),
        "parts_removed": removed,
        "seconds": round(time.perf_counter() - t0, 3),
    }
