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

from docintel.actors import cluster
from docintel.actors.executor import Executor, Sink
from docintel.pipeline.config import Config
from docintel.pipeline.output import RunOutput, RunSummary
from docintel.pipeline.plan import Plan, prepare
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
    with (
        cluster.ray_session(cfg),
        cluster.stage_pools(cfg, output.run_id) as (
            actors,
            dispatcher,
            info,
        ),
    ):
        summary.startup_seconds = time.perf_counter() - t0
        if on_start:
            on_start(p.n_documents, output.done_documents())
        slots = sum(dispatcher.slots(s) for s in dispatcher.pools)
        executor = Executor(
            actors,
            dispatcher,
            p.source_fs,
            cfg.input.id_column,
            cfg.input.text_column,
            cfg.run.batch_size,
            Sink(output.fs, output.root, p.labels, cfg.run.embeddings),
            cfg.resources.io_cpus,
            cfg.run.max_batches_in_flight or 2 * slots,
        )

        def record(stats: BatchStats) -> None:
            output.record(stats)
            if on_batch:
                on_batch(stats)

        executor.run(p.units, output.resumed, record)
        summary.processing_seconds = time.perf_counter() - t0 - summary.startup_seconds
    return {s: i["version"] for s, i in info.items()}
