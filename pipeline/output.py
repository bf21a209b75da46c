"""The run-level output protocol: open → record written batches → finish → commit.

Storage is the run's :class:`~docintel.pipeline.sink.RunSink` (names, files, commit points,
crash recovery); this module decides what a run *is* on top of it:

* :meth:`RunOutput.open` first takes the lease on OUTPUT (pipeline/lease.py: one writer
  per output; a second run on the same OUTPUT is refused with exit 2, naming the holder),
  then decides, before any cluster work, from what the sink finds, whether OUTPUT starts a
  new run (the sink records the run state first), resumes an unfinished one of the same
  run id and input (the sink settles what a crash left and lists the committed batches,
  which are skipped), or already holds the completed run (nothing to do).
* Write tasks call ``RunSink.write`` on each batch; :meth:`RunOutput.record` takes the
  small per-batch stats they return: the error budget, time per stage and the backends
  that served the batch. :meth:`RunOutput.finish` lets the sink reorganise its files
  (compaction) on tasks the runner provides.
* :meth:`RunOutput.commit` checks the counts against the plan, then has the sink write
  ``_manifest.json`` last: a run without it is not committed.

Nothing here grows with the corpus beyond one small record per batch: the final counts
are the sum of the per-batch stats (this invocation's from the write tasks, an earlier
invocation's read once by the sink when the run resumes), never a re-read of the tables;
the manifest records how many batches were committed, not their ids (the tables' files
are that record).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from docintel.pipeline.config import ERROR_FRACTION_MIN_DOCS
from docintel.pipeline.errors import RunFailed, UsageError
from docintel.pipeline.lease import Lease
from docintel.pipeline.plan import Plan
from docintel.pipeline.sink import (
    RUN_STATE,
    BatchStats,
    RunSink,
    TaskMap,
    resolve_output,
    sink_for,
)

# RUN_STATE is re-exported: the audit tells a partition that holds a run by it
__all__ = ["RUN_STATE", "ErrorBudget", "RunOutput", "RunSummary"]


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
    models_loaded_seconds: float | None = None  # every starting replica joined (overlaps)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    backends: dict[str, dict[str, int]] = field(default_factory=dict)
    replicas: dict[str, dict[str, int]] = field(default_factory=dict)  # stage -> pool -> n
    already_complete: bool = False
    skipped_files: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        """Input files were skipped as unreadable: not every document was read."""
        return bool(self.skipped_files)

    @property
    def docs_per_s(self) -> float:
        return self.documents / self.wall_seconds if self.wall_seconds else 0.0


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


def _check_resumable(state: dict[str, Any], p: Plan, output_uri: str, run_id: str) -> None:
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


class RunOutput:
    """One run's output: open, record written batches, finish, commit (through its sink)."""

    def __init__(
        self,
        plan: Plan,
        output_uri: str,
        sink: RunSink,
        run_id: str,
        manifest: dict[str, Any] | None,
        lease: Lease,
    ) -> None:
        self.plan, self.uri, self.sink = plan, output_uri, sink
        self.lease = lease
        self.run_id = run_id
        self.resumed: set[str] = set()  # batches an earlier invocation of this run committed
        self.manifest = manifest  # set when the run is already complete
        self.errors = ErrorBudget(plan.cfg.run.max_error_fraction)
        self.stage_seconds: Counter[str] = Counter()
        self.served: dict[str, Counter[str]] = {}
        self.totals: Counter[str] = Counter()  # documents, sentences, errors, tokens
        self.written = 0  # batches this invocation wrote
        self.compaction: dict[str, Any] = {}  # what the sink's finish did, for the manifest
        self.replicas: list[dict[str, Any]] = []  # every replica of this invocation
        self.committed = False

    @classmethod
    def open(cls, p: Plan, output_uri: str, run_id: str) -> RunOutput:
        """A new run, a resume of an unfinished one, or the completed run (``complete``).

        Holds the output's lease from here on: close() (or ``with``) releases it."""
        fs, root = resolve_output(output_uri, p.cfg.storage)
        run = p.cfg.run
        what = f"docintel run {run_id or '(new)'} of {p.input_uri}"
        lease = Lease(fs, root, p.cfg.storage, what, run.lease_ttl_s, run.lease_wait_s)
        lease.acquire()
        try:
            return cls._open(p, output_uri, run_id, sink_for(fs, root, p.cfg, p.labels), lease)
        except BaseException:
            lease.release()
            raise

    @classmethod
    def _open(cls, p: Plan, output_uri: str, run_id: str, sink: RunSink, lease: Lease) -> RunOutput:
        found = sink.open()
        if found.manifest is not None:
            if run_id and found.manifest["run_id"] != run_id:
                raise UsageError(
                    f"{output_uri} already holds completed run {found.manifest['run_id']!r};"
                    " choose an empty output folder for a new run"
                )
            return cls(p, output_uri, sink, found.manifest["run_id"], found.manifest, lease)
        if found.state is not None:
            _check_resumable(found.state, p, output_uri, run_id)
            out = cls(p, output_uri, sink, run_id, None, lease)
            for stats in sink.resume().values():  # footers read once, here
                out.resumed.add(stats.batch_id)
                out._count(stats)
            return out
        run_id = run_id or f"{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
        sink.start({"run_id": run_id, "input": p.input_uri, "started": _now()})
        return cls(p, output_uri, sink, run_id, None, lease)

    def close(self) -> None:
        """Release the output's lease (after commit, or when the run stops)."""
        self.lease.release()

    def __enter__(self) -> RunOutput:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            if exc_type is not None and not self.committed:
                self.sink.abort()  # still under the lease: nothing else writes here
        finally:
            self.close()

    @property
    def complete(self) -> bool:
        return self.manifest is not None

    def completed_summary(self) -> RunSummary:
        """The summary of the already completed run (from its manifest)."""
        assert self.manifest is not None
        c = self.manifest["counts"]
        return RunSummary(
            self.run_id, self.uri, c["documents"], c["sentences"], c["errors"], c["tokens"],
            already_complete=True, skipped_files=self.manifest.get("skipped_files", []),
        )  # fmt: skip

    def done_documents(self) -> int:
        """Documents in the batches an earlier invocation committed (for progress)."""
        size = self.plan.cfg.run.batch_size
        return sum(
            min(size, u.n_rows - k * size)
            for u in self.plan.units
            for k, b in enumerate(u.batch_ids)
            if b in self.resumed
        )

    def record(self, stats: BatchStats) -> None:
        """A batch's parts are written: count it (may fail the run on too many errors, or
        when another writer took the output's lease)."""
        self.lease.check()
        self.errors.update(stats)
        self.stage_seconds.update(stats.seconds)
        self._count(stats)
        self.written += 1

    def _count(self, stats: BatchStats) -> None:
        for key in ("documents", "sentences", "errors", "tokens"):
            self.totals[key] += getattr(stats, key)
        for stage, backend in stats.backends.items():
            self.served.setdefault(stage, Counter())[backend] += 1

    def finish(self, task_map: TaskMap) -> None:
        """Every batch is written: let the sink reorganise its files (merge small parts)
        on ``task_map``, which the runner provides (Ray tasks, the lease checked between
        them)."""
        self.lease.check()
        self.compaction = self.sink.finish(task_map)

    def commit(self, summary: RunSummary, models: dict[str, str]) -> RunSummary:
        """Check the counts against the plan, then have the sink write the manifest last."""
        self.lease.check()
        counts = self.totals
        if counts["documents"] != self.plan.n_documents:
            raise RunFailed(
                f"{self.uri}/documents has {counts['documents']} rows but the input has "
                f"{self.plan.n_documents} documents; the run is not committed"
            )
        self.errors.check_final(counts["errors"], counts["documents"])
        summary.documents = counts["documents"]
        summary.sentences, summary.errors = counts["sentences"], counts["errors"]
        summary.tokens = counts["tokens"]
        summary.batches = self.written
        summary.stage_seconds = dict(self.stage_seconds)
        summary.backends = {s: dict(c) for s, c in self.served.items()}
        self.lease.renew()  # the manifest goes out under a claim that is fresh and ours
        self.lease.check()
        self.sink.commit(self._manifest(summary, models))
        self.committed = True
        return summary

    def _manifest(self, summary: RunSummary, models: dict[str, str]) -> dict[str, Any]:
        p = self.plan
        return {
            "run_id": summary.run_id,
            "finished": _now(),
            "input": {"uri": p.input_uri, "files": [asdict(f) for f in p.files]},
            "output": summary.output,
            "config": p.cfg.model_dump(),
            "models": models,
            "stages": list(p.stages),  # the chain, in order (the report orders by it)
            "labels": p.labels,
            "counts": {
                "documents": summary.documents,
                "sentences": summary.sentences,
                "errors": summary.errors,
                "tokens": summary.tokens,
                "batches": len(self.resumed) + self.written,
            },
            # the batch ids are in the tables (batch_id column, file names): not repeated
            "resumed_batches": summary.skipped_batches,
            "timings": {
                "wall_seconds": summary.wall_seconds,
                # checks, Ray start, reads and model loads until the first replica call;
                # then streaming the batches, while the other replicas finish loading
                "startup_seconds": summary.startup_seconds,
                "processing_seconds": summary.processing_seconds,
                # when the last replica of the starting layout had loaded its model
                "models_loaded_seconds": summary.models_loaded_seconds,
                "stage_seconds": summary.stage_seconds,
            },
            "backends": summary.backends,
            # every replica this invocation had: where it ran, what it served, its life
            "replicas": self.replicas,
            # files per table after the sink's finish (run.part_target_mb), what it merged
            "parts": {
                "target_mb": p.cfg.run.part_target_mb,
                **self.compaction,
                "tables": self.sink.table_files(),
            },
            "warnings": p.warnings,
            "partial": bool(p.skipped_files),
            "skipped_files": p.skipped_files,
        }


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()
