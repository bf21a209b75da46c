"""The one run function behind `docintel run`, the Ray batch job and the nightly audit.

Order: every check that can fail on bad usage runs on the driver first
(:func:`docintel.pipeline.run.plan.prepare`, exit code 2), the output is opened
(:class:`docintel.pipeline.output.protocol.RunOutput`: new run, resume or already
complete), then Ray starts, the stage pools load their models, batches stream through the
:class:`~docintel.actors.executor.Executor`, and the output is committed (manifest last).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ray

from docintel.actors import cluster
from docintel.actors.executor import Executor, Sink
from docintel.actors.resources import task_options
from docintel.pipeline.config import Config
from docintel.pipeline.output.protocol import RunOutput, RunSummary
from docintel.pipeline.output.sink import BatchStats, TaskMap
from docintel.pipeline.run.layout import Pool, stage_layout
from docintel.pipeline.run.lease import LeaseLost
from docintel.pipeline.run.pieces import completed
from docintel.pipeline.run.plan import Plan, ensure_derived, prepare

StartCallback = Callable[[int, int], None]  # (total documents, documents already done)
BatchCallback = Callable[[BatchStats], None]
OpenCallback = Callable[[str, int], None]  # (run id, batches an earlier invocation committed)


def execute(
    cfg: Config,
    input_uri: str,
    output_uri: str,
    on_start: StartCallback | None = None,
    on_batch: BatchCallback | None = None,
    on_open: OpenCallback | None = None,
) -> RunSummary:
    """Run the pipeline from ``input_uri`` to ``output_uri``; the manifest is written last.

    ``on_start(total_documents, documents_already_done)`` and ``on_batch(stats)`` feed a
    progress display; ``on_open(run_id, resumed_batches)`` says, before any work, which
    run this is (a generated run id is known from here on: the resume command names it).
    """
    t0 = time.perf_counter()
    p = prepare(cfg, input_uri)
    cfg = p.cfg  # as the plan resolved it (an "auto" batch size is a number there)
    with RunOutput.open(p, output_uri, cfg.run.run_id) as output:
        if output.complete:
            return output.completed_summary()
        if on_open:
            on_open(output.run_id, len(output.resumed))
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
    with cluster.ray_session(cfg, p.shape):
        # the embedded Ray: the layout prepare() sized to the shape it was started with;
        # a cluster joined by address (or a Ray already running in this process): sized
        # to the cluster as it is now, and the artefacts that layout runs built if missing
        layout = p.layout
        if layout is None or cluster.current_shape().gpus != (p.shape and p.shape.gpus):
            layout = stage_layout(cfg, cluster.current_shape(), p.chain)
            ensure_derived(cfg, layout=layout, chain=p.chain)
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
    assert p.chain is not None, "a plan from prepare() carries the resolved chain"
    with cluster.stage_pools(p.chain, output.run_id, layout) as pools:
        if on_start:
            on_start(p.n_documents, output.done_documents())
        executor = Executor(
            pools.actors,
            pools.dispatcher,
            p.source_fs,
            cfg.input.id_column,
            cfg.input.text_column,
            cfg.run.batch_size,
            Sink.of(output.sink),
            cfg.resources.io_cpus,
            cfg.run.max_batches_in_flight,
            on_tick=pools.poll,
            metrics=pools.metrics,
            wake=pools.pending_refs,
            split_stage=p.chain.split_stage,
            slicing=cfg.run.spill_slicing,
        )

        def record(stats: BatchStats) -> None:
            output.record(stats)
            if on_batch:
                on_batch(stats)

        # a batch split into pieces is done when all its pieces are (pipeline/run/pieces.py)
        executor.run(p.units, completed(output.resumed), record)
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


def _apply(fn: Callable[[Any], Any], item: Any, valid_until: float) -> Any:
    """One item of a sink's task map (``fn`` arrives resolved from its object ref). Refused
    once the output's claim it was submitted under has expired (``valid_until``, Unix
    time): a task that waited that long in a queue may no longer be the lease holder's."""
    if time.time() >= valid_until:
        raise LeaseLost(
            "a compaction task started after the output's lease it was submitted under had "
            "expired; it did nothing, and this run stops without committing"
        )
    return fn(item)


_sink_task = ray.remote(_apply)


def _compact(cfg: Config, output: RunOutput) -> None:
    """Let the sink finish the output (merge small parts: pipeline/output/sink.py) on the
    cluster's I/O tasks, a few at a time, under the output's lease."""
    output.finish(_task_map(cfg, output))


def _task_map(cfg: Config, output: RunOutput) -> TaskMap:
    """The sink's work as Ray I/O tasks: a window sized to the CPUs, the lease checked
    right before each submission (and each task refused past the claim's expiry), the
    function put in the object store once."""
    window = max(1, int(ray.available_resources().get("CPU", 1) / cfg.resources.io_cpus))
    # the sink's work is idempotent: retried on any error (an S3 hiccup), not only a lost
    # worker
    opts = {**task_options(cfg.resources.io_cpus), "retry_exceptions": True}

    def run(fn: Callable[[Any], Any], items: Sequence[Any], /) -> Iterator[Any]:
        fn_ref = ray.put(fn)
        pending: list[ray.ObjectRef] = []
        for item in items:
            if len(pending) >= window:
                done, pending = ray.wait(pending, num_returns=1)
                yield from ray.get(done)
            output.lease.check()  # after the wait: the claim as it is at submission
            until = output.lease.valid_until
            pending.append(_sink_task.options(**opts).remote(fn_ref, item, until))
        yield from ray.get(pending)

    return run
