"""The output protocol of a run, shaped like a data sink: open → write batches → commit.

* :meth:`RunOutput.open` first takes the lease on OUTPUT (pipeline/lease.py: one writer
  per output; a second run on the same OUTPUT is refused with exit 2, naming the holder),
  then decides, before any cluster work, whether OUTPUT starts a new run
  (it writes ``_run.json`` first, marking the folder as this run's), resumes an unfinished
  one (the batches whose ``documents`` part exists are committed and skipped), or already
  holds the completed run (nothing to do).
* Write tasks write each batch's parts (:func:`docintel.pipeline.sink.write_batch`);
  :meth:`RunOutput.record` takes the small per-batch stats they return: the error budget,
  time per stage and the backends that served the batch.
* :meth:`RunOutput.commit` checks the counts against the plan, then writes
  ``_manifest.json`` last: a run without it is not committed.

Nothing here grows with the corpus beyond one small record per batch: the final counts
are the sum of the per-batch stats (this invocation's from the write tasks, an earlier
invocation's from the footers of its documents parts), never a re-read of the tables; the
manifest records how many batches were committed, not their ids (the documents/ listing
is that record).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow.fs as pafs

from docintel.pipeline import compact
from docintel.pipeline.config import ERROR_FRACTION_MIN_DOCS
from docintel.pipeline.errors import RunFailed, UsageError
from docintel.pipeline.lease import Lease
from docintel.pipeline.plan import Plan
from docintel.pipeline.sink import (
    TABLES,
    BatchStats,
    atomic_write,
    read_batch_stats,
    read_json,
    read_manifest,
    resolve_output,
    write_manifest,
)

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


def _committed(fs: pafs.FileSystem, root: str) -> set[str]:
    """Batches with their own documents part (not merged ones: see compact.recover)."""
    sel = pafs.FileSelector(f"{root}/documents", allow_not_found=True)
    names = (info.base_name for info in fs.get_file_info(sel))
    return {
        n[len("part-") : -len(".parquet")]
        for n in names
        if n.startswith("part-")
        and n.endswith(".parquet")
        and not n.startswith(f"part-{compact.MERGED}")
    }


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


def _check_fresh(fs: pafs.FileSystem, root: str, output_uri: str) -> None:
    if fs.get_file_info(root).type == pafs.FileType.File:
        raise UsageError(f"output {output_uri} is a file; give a folder or s3:// prefix")
    existing = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    if any(i.base_name in TABLES for i in existing):
        raise UsageError(
            f"output {output_uri} already holds docintel tables but no run "
            "state; choose an empty output folder"
        )


class RunOutput:
    """One run's output folder or prefix: open, record written batches, commit."""

    def __init__(
        self,
        plan: Plan,
        output_uri: str,
        fs: pafs.FileSystem,
        root: str,
        run_id: str,
        committed: set[str],
        manifest: dict[str, Any] | None,
        lease: Lease,
    ) -> None:
        self.plan, self.uri, self.fs, self.root = plan, output_uri, fs, root
        self.lease = lease
        self.run_id = run_id
        self.resumed = committed  # batches an earlier invocation of this run committed
        self.manifest = manifest  # set when the run is already complete
        self.errors = ErrorBudget(plan.cfg.run.max_error_fraction)
        self.stage_seconds: Counter[str] = Counter()
        self.served: dict[str, Counter[str]] = {}
        self.totals: Counter[str] = Counter()  # documents, sentences, errors, tokens
        self.written = 0  # batches this invocation wrote
        # batches an earlier invocation committed and merged: their stats, from the footers
        # of the merged documents parts (compact.recover)
        self.merged: dict[str, BatchStats] = {}
        self.compaction: dict[str, Any] = {}  # what compaction did, for the manifest
        self.replicas: list[dict[str, Any]] = []  # every replica of this invocation

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
            return cls._open(p, output_uri, run_id, fs, root, lease)
        except BaseException:
            lease.release()
            raise

    @classmethod
    def _open(
        cls, p: Plan, output_uri: str, run_id: str, fs: pafs.FileSystem, root: str, lease: Lease
    ) -> RunOutput:
        manifest = read_manifest(fs, root)
        if manifest is not None:
            if run_id and manifest["run_id"] != run_id:
                raise UsageError(
                    f"{output_uri} already holds completed run {manifest['run_id']!r};"
                    " choose an empty output folder for a new run"
                )
            return cls(p, output_uri, fs, root, manifest["run_id"], set(), manifest, lease)
        state = read_json(fs, f"{root}/{RUN_STATE}")
        if state is not None:
            _check_resumable(state, p, output_uri, run_id)
            merged = compact.recover(fs, root)  # first: it settles what a crash left
            out = cls(p, output_uri, fs, root, run_id, _committed(fs, root), None, lease)
            out.resumed |= merged.keys()
            out.merged = merged
            return out
        _check_fresh(fs, root, output_uri)
        run_id = run_id or f"{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
        state = {"run_id": run_id, "input": p.input_uri, "started": _now()}
        atomic_write(fs, f"{root}/{RUN_STATE}", json.dumps(state).encode())
        return cls(p, output_uri, fs, root, run_id, set(), None, lease)

    def close(self) -> None:
        """Release the output's lease (after commit, or when the run stops)."""
        self.lease.release()

    def __enter__(self) -> RunOutput:
        return self

    def __exit__(self, *exc: object) -> None:
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

    def commit(self, summary: RunSummary, models: dict[str, str]) -> RunSummary:
        """Check the counts against the plan, then write the manifest last."""
        self.lease.check()
        for batch_id in sorted(self.resumed):  # an earlier invocation's: footers only
            merged = self.merged.get(batch_id)
            self._count(merged or read_batch_stats(self.fs, self.root, batch_id))
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
        write_manifest(self.fs, self.root, self._manifest(summary, models))
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
            "labels": p.labels,
            "counts": {
                "documents": summary.documents,
                "sentences": summary.sentences,
                "errors": summary.errors,
                "tokens": summary.tokens,
                "batches": len(self.resumed) + self.written,
            },
            # the batch ids are the names of the documents/ parts: not repeated here
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
            # files per table after compaction (run.part_target_mb), and what it merged
            "parts": {
                "target_mb": p.cfg.run.part_target_mb,
                **self.compaction,
                "tables": compact.part_counts(self.fs, self.root),
            },
            "warnings": p.warnings,
            "partial": bool(p.skipped_files),
            "skipped_files": p.skipped_files,
        }


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()
