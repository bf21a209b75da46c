"""The run-level output protocol: open → record written batches → finish → commit.

Storage is the run's :class:`~docintel.pipeline.output.sink.RunSink` (names, files, commit points,
crash recovery); this module decides what a run *is* on top of it:

* :meth:`RunOutput.open` first decides, before any cluster work and without writing
  anything, from what the sink finds, whether OUTPUT starts a new run, resumes an
  unfinished one, or already holds the completed run (nothing to do). Every refusal comes
  here, with exit code 2: another run id, a different input or plan (:func:`plan_key`: a
  resume must keep what shapes its batches and rows; a completed output is a no-op only
  for the input and plan it was made from), an OUTPUT that is a file or holds tables of no
  run, an OUTPUT that cannot be written (read-only, immutable, full, not a folder: the OS
  error becomes a usage error naming the path). Only then does it take the lease on
  OUTPUT (pipeline/run/lease.py: one writer per output; a second run on the same OUTPUT is
  refused with exit 2, naming the holder), so a refused run never touches another
  writer's lease; under the lease it looks again (another writer may have moved OUTPUT
  on meanwhile), then the sink records the run state first (a new run) or settles what a
  crash left and lists the committed batches, which are skipped (a resume). A completed
  run needs no lease: nothing is written.
* Write tasks call ``RunSink.write`` on each batch; :meth:`RunOutput.record` takes the
  small per-batch stats they return: the error budget, time per stage and the backends
  that served the batch. :meth:`RunOutput.finish` lets the sink reorganise its files
  (compaction) on tasks the runner provides.
* :meth:`RunOutput.commit` checks the counts against the plan, then has the sink write
  ``_manifest.json`` last: a run without it is not committed. A storage error there (a
  full disk) fails the run (exit 1) with what was committed intact: it resumes.

Nothing here grows with the corpus beyond one small record per batch: the final counts
are the sum of the per-batch stats (this invocation's from the write tasks, an earlier
invocation's read once by the sink when the run resumes), never a re-read of the tables;
the manifest records how many batches were committed, not their ids (the tables' files
are that record). The plan key holds one small record per input *file* (as the manifest's
input list always did), never per document or batch.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import posixpath
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from docintel.pipeline import formats, registry
from docintel.pipeline.config import ERROR_FRACTION_MIN_DOCS, SECRET_PROPERTY_WORDS, Config
from docintel.pipeline.entities.stage import plan_record as watch_lists_record
from docintel.pipeline.errors import OutputError, RunFailed, UsageError
from docintel.pipeline.input.source import InputFile
from docintel.pipeline.output.sink import (
    BatchStats,
    Existing,
    RunSink,
    TaskMap,
    resolve_output,
)
from docintel.pipeline.privacy import stage as privacy
from docintel.pipeline.run.lease import Lease
from docintel.pipeline.run.plan import Plan
from docintel.pipeline.schema import (
    ENTITIES,
    ERRORS_SCHEMA,
    documents_schema,
    head_fields,
    sentences_schema,
)
from docintel.pipeline.storage import display_uri, is_local, s3_error

__all__ = ["ErrorBudget", "RunOutput", "RunSummary", "plan_key", "sink_for"]


def sink_for(fs: pafs.FileSystem, root: str, p: Plan) -> RunSink:
    """The sink a run writes OUTPUT with, in the configured table format (``[output]
    format``, ``--format``), after refusing (exit 2) an output that holds another
    format's (pipeline/formats/: each format's markers tell)."""
    fmt = formats.get(p.cfg.output.format)
    found = formats.detect(fs, root)
    if found is not None and found is not fmt:
        raise UsageError(
            f"output {display_uri(fs, root)} holds {found.what}, not {fmt.name} output; write "
            f"to it with --format {found.name}, or choose an empty output folder"
        )
    return fmt.sink(fs, root, p.cfg, p.labels, p.stages)


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


# --- what a run is made from: the plan key -------------------------------------------------

# How a user sets each key of the plan, for the messages that name one.
_HOW = {
    "columns": "--id-column / --text-column ([input] id_column, text_column)",
    "batch_size": "--batch-size ([run] batch_size)",
    "embeddings": "--embeddings / --no-embeddings ([run] embeddings)",
    privacy.NAME: "--redact / --redact-only ([privacy] redact and [privacy.patterns])",
    "stages": "[pipeline] stages",
    "watch_lists": "--watch-list ([entities] lists, min_similarity)",
    "models": "the models of the config's stage sections",
    "heads": "--classifier ([classify.heads])",
}


def plan_key(p: Plan) -> dict[str, Any]:
    """What shapes a run's batches and rows, recorded in its run state (``_run.json``) and
    its manifest: the input's identity (:func:`input_identity`), the columns read, the
    batch size, embeddings on or off, the stage chain and the models' versions.

    A resume must match every key its record holds (the committed batches' ids, rows and
    columns depend on them), and a completed output is a no-op only for the same key:
    anything else is refused before any work (exit 2), naming the key and both values.
    This is the one place that says what shapes a plan: add a key here (and its ``_HOW``)
    when something new does. A record written before a key existed is not checked on it.
    """
    cfg = p.cfg
    return {
        "input": input_identity(p.source_fs, p.files),
        "columns": {"id": cfg.input.id_column, "text": cfg.input.text_column},
        "batch_size": cfg.run.batch_size,
        "embeddings": cfg.run.embeddings,
        # redacted or not, the types, a digest of each user regex (never the regex)
        privacy.NAME: privacy.plan_setting(cfg),
        "stages": list(p.stages),
        # each watch list's name, content hash and size (None: no entities stage)
        "watch_lists": watch_lists_record(cfg) if ENTITIES in p.stages else None,
        "models": dict(p.versions),
        # the extra classifier heads, name -> version (their columns shape the rows)
        "heads": {h["name"]: h["version"] for h in p.heads},
    }


def input_identity(fs: pafs.FileSystem, files: list[InputFile]) -> list[dict[str, Any]]:
    """Each input file as its storage describes it now: path, size, modification time (on
    S3 the object's LastModified, which every PUT renews) and ``key`` (its path relative to
    the input and a hash of its Parquet footer: what its batch ids carry). One stat per
    file locally, one listing of the input on S3: no file is read again."""
    infos = _file_infos(fs, [f.path for f in files])
    return [
        {
            "uri": f.uri,
            "path": f.path,
            "size": f.size,
            "mtime_ns": info.mtime_ns if (info := infos.get(f.path)) else None,
            "key": f.key,
        }
        for f in files
    ]


def _file_infos(fs: pafs.FileSystem, paths: list[str]) -> dict[str, pafs.FileInfo]:
    try:
        if len(paths) > 1 and not is_local(fs):  # one listing, not a HEAD per object
            selector = pafs.FileSelector(posixpath.commonpath(paths), recursive=True)
            listed = fs.get_file_info(selector)
        else:
            listed = fs.get_file_info(paths)
    except OSError as e:
        if is_local(fs):
            raise
        raise s3_error(e, display_uri(fs, paths[0])) from e
    return {i.path: i for i in listed if i.type == pafs.FileType.File}


@dataclass(frozen=True)
class _Mismatch:
    key: str
    then: str  # as shown in a message; for the input, what differs
    now: str


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _recorded(record: dict[str, Any]) -> dict[str, Any]:
    """The plan key a run state or a manifest recorded (a manifest keeps the input files
    once, under ``input``). A record from before plan keys: the input files its manifest
    lists (path, size, key), if any."""
    key = dict(record.get("plan") or {})
    given = record.get("input")
    if "input" not in key and isinstance(given, dict) and "files" in given:
        key["input"] = given["files"]
    return key


def _input_uri(record: dict[str, Any]) -> str:
    """The input as the recorded run was given it (run state: a string; manifest: a dict)."""
    given = record.get("input")
    return str(given.get("uri") if isinstance(given, dict) else given)


def _input_change(then: list[dict[str, Any]], now: list[dict[str, Any]]) -> str | None:
    """The first input file that differs, and how; None for the same input. Fields an older
    record lacks are not compared; ``uri`` only shows how the input was written."""
    before = {f["path"]: f for f in then}
    after = {f["path"]: f for f in now}
    for path in sorted(before.keys() | after.keys()):
        was, new = before.get(path), after.get(path)
        if was is None:
            return f"{new['uri'] if new else path} was not part of it"
        if new is None:
            return f"{was['uri']} is no longer part of it"
        for name in sorted((was.keys() & new.keys()) - {"uri"}):
            if was[name] != new[name]:
                return f"{was['uri']} changed: {name} {was[name]} then, {new[name]} now"
    return None


def _difference(then: dict[str, Any], now: dict[str, Any]) -> _Mismatch | None:
    """The first key whose recorded value differs from now's (the input first)."""
    for key, was in then.items():
        if key not in now:
            continue
        if key == "input":
            change = _input_change(was, now[key])
            if change is not None:
                files = f"{len(was)} file(s) then, {len(now[key])} now"
                return _Mismatch(key, f"{change}; {files}", "")
        elif was != now[key]:
            return _Mismatch(key, _show(was), _show(now[key]))
    return None


def _check_complete(
    manifest: dict[str, Any], p: Plan, key: dict[str, Any], output_uri: str, run_id: str
) -> None:
    """A completed output is a no-op only for its own run id, input and plan."""
    done = manifest["run_id"]
    if run_id and done != run_id:
        raise UsageError(
            f"{output_uri} already holds completed run {done!r}; choose an empty output "
            "folder for a new run"
        )
    diff = _difference(_recorded(manifest), key)
    if diff is None:
        return
    made_from = _input_uri(manifest)
    if diff.key == "input":
        raise UsageError(
            f"{output_uri} already holds completed run {done!r}, made from {made_from!r}; "
            f"this run reads {p.input_uri!r}, a different input ({diff.then}), and would "
            f"process none of it. Choose another output folder for {p.input_uri!r}, or pass "
            f"the same input ({made_from!r}) to confirm that run {done!r} is complete"
        )
    raise UsageError(
        f"{output_uri} already holds completed run {done!r}, made with {diff.key} "
        f"{diff.then}; this run asks for {diff.key} {diff.now}, and nothing would be redone. "
        f"Choose another output folder for a run with {diff.key} {diff.now}, or ask with "
        f"{diff.key} {diff.then} ({_HOW.get(diff.key, diff.key)}) to confirm that run "
        f"{done!r} is complete"
    )


def _check_resumable(
    state: dict[str, Any], p: Plan, key: dict[str, Any], output_uri: str, run_id: str
) -> None:
    """A resume must keep the run id, the input and the plan its run state recorded."""
    if state["run_id"] != run_id:
        raise UsageError(
            f"{output_uri} holds unfinished run {state['run_id']!r}; rerun with "
            f"--run-id {state['run_id']} to resume it, or choose an empty output folder"
        )
    recorded = _recorded(state)
    if "input" not in recorded and state["input"] != p.input_uri:  # a state before plan keys
        raise UsageError(
            f"run {run_id!r} in {output_uri} read {state['input']!r}, not "
            f"{p.input_uri!r}; resume it with the same input"
        )
    diff = _difference(recorded, key)
    if diff is None:
        return
    if diff.key == "input":
        raise UsageError(
            f"run {run_id!r} in {output_uri} read {state['input']!r}; this run reads "
            f"{p.input_uri!r}, a different input ({diff.then}). Resume it with the same, "
            "unchanged input, or choose another output folder to start over"
        )
    raise UsageError(
        f"run {run_id!r} in {output_uri} was started with {diff.key} {diff.then}; this run "
        f"asks for {diff.key} {diff.now}. A resume must keep what shapes its batches and "
        f"rows: rerun with {diff.key} {diff.then} ({_HOW.get(diff.key, diff.key)}) to "
        "resume it, or choose another output folder"
    )


def _same_run(sink: RunSink, p: Plan, key: dict[str, Any], run_id: str) -> Existing | None:
    """A completed run of the same input and plan in a warehouse of appending runs: a run
    with no run id of its own (and no ``--append``) is a no-op that names it."""
    if run_id or p.cfg.run.append:
        return None
    for manifest in sink.completed():
        if _difference(_recorded(manifest), key) is None:
            return Existing(manifest, None)
    return None


def _check(found: Existing, p: Plan, key: dict[str, Any], output_uri: str, run_id: str) -> None:
    """Refuse (exit 2) what OUTPUT holds if this run may not complete or resume it."""
    if found.manifest is not None:
        _check_complete(found.manifest, p, key, output_uri, run_id)
    elif found.state is not None:
        _check_resumable(found.state, p, key, output_uri, run_id)


# --- OUTPUT's storage errors while it opens ------------------------------------------------

_WHY = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted (an immutable file or folder, or a system one)",
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a part of the path is a file, not a folder",
}


def _client_errors() -> tuple[type[Exception], ...]:
    """boto3's errors (the lease's conditional requests on S3); imported only on an error."""
    from botocore.exceptions import BotoCoreError, ClientError

    return (ClientError, BotoCoreError)


@contextlib.contextmanager
def _opening(fs: pafs.FileSystem, root: str) -> Iterator[None]:
    """OUTPUT's storage errors while a run opens it, before any work, are usage errors
    naming it (exit 2): a folder that is read-only, immutable, full, or under a file. Once
    the run works they stay failures (exit 1, resumable)."""
    where = display_uri(fs, root)
    try:
        yield
    except OSError as e:
        if not is_local(fs):
            raise s3_error(e, where, "output") from e
        why = _WHY.get(e.errno or 0, "it cannot be written")
        raise OutputError(
            f"output {where} cannot be used: {why} ({e}). Nothing was done: choose an output "
            "folder this user may create and write, or fix its permissions or free space"
        ) from e
    except _client_errors() as e:
        raise s3_error(OSError(str(e)), where, "output") from e


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
        key: dict[str, Any],
    ) -> None:
        self.plan, self.uri, self.sink = plan, output_uri, sink
        self.lease = lease
        self.key = key  # plan_key(plan): recorded in the run state and the manifest
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

        Every refusal comes first, without the lease (a refused run never touches another
        writer's claim); a new run or a resume then holds the output's lease from here on:
        close() (or ``with``) releases it. A completed run takes no lease: nothing is
        written."""
        fs, root = resolve_output(output_uri, p.cfg.storage)
        key = plan_key(p)
        run = p.cfg.run
        what = f"docintel run {run_id or '(new)'} of {p.input_uri}"
        with _opening(fs, root):
            sink = sink_for(fs, root, p)
            found = sink.open()  # read only; refuses a file, or tables of no run
            found = _same_run(sink, p, key, run_id) or found
            _check(found, p, key, output_uri, run_id)
            lease = Lease(fs, root, p.cfg.storage, what, run.lease_ttl_s, run.lease_wait_s)
        if found.manifest is not None:
            return cls(p, output_uri, sink, found.manifest["run_id"], found.manifest, lease, key)
        with _opening(fs, root):
            lease.acquire()  # the first write: an output that cannot be written stops here
        try:
            with _opening(fs, root):
                return cls._open(p, output_uri, run_id, sink, lease, key)
        except BaseException:
            lease.release()
            raise

    @classmethod
    def _open(
        cls,
        p: Plan,
        output_uri: str,
        run_id: str,
        sink: RunSink,
        lease: Lease,
        key: dict[str, Any],
    ) -> RunOutput:
        """Under the lease: look again (another writer may have moved OUTPUT on since the
        checks), then resume the unfinished run or start a new one (its state first)."""
        found = sink.open()
        _check(found, p, key, output_uri, run_id)
        if found.manifest is not None:  # completed meanwhile: nothing to do
            return cls(p, output_uri, sink, found.manifest["run_id"], found.manifest, lease, key)
        if found.state is not None:
            out = cls(p, output_uri, sink, run_id, None, lease, key)
            for stats in sink.resume().values():  # footers read once, here
                out.resumed.add(stats.batch_id)
                out._count(stats)
            return out
        run_id = run_id or f"{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
        sink.start({"run_id": run_id, "input": p.input_uri, "started": _now(), "plan": key})
        return cls(p, output_uri, sink, run_id, None, lease, key)

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
        self.sink.written(stats)  # a sink that commits in groups may commit here

    def _count(self, stats: BatchStats) -> None:
        for key in ("documents", "sentences", "errors", "tokens", "found"):
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
        if counts["documents"] - counts["found"] != self.plan.n_documents:
            raise RunFailed(
                f"{self.uri}/documents has {counts['documents']} rows ({counts['found']} found "
                f"inside input files) but the input has {self.plan.n_documents} documents; "
                "the run is not committed"
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
        if not self.plan.n_documents:
            self.sink.write_empty(empty_schemas(self.plan))
            summary.warnings.append(
                f"{self.plan.input_uri} holds 0 documents: {self.uri} has empty documents, "
                "sentences and errors tables"
            )
        try:
            self.sink.commit(self._manifest(summary, models))
        except OSError as e:  # a full disk, lost access: exit 1, and the run resumes
            raise RunFailed(
                f"the manifest of run {self.run_id!r} could not be written to {self.uri} "
                f"({e}); it is not committed, and every batch written stays. Free space (or "
                f"fix the storage), then rerun with --run-id {self.run_id} to finish it"
            ) from e
        self.committed = True
        return summary

    def _manifest(self, summary: RunSummary, models: dict[str, str]) -> dict[str, Any]:
        p = self.plan
        return {
            "run_id": summary.run_id,
            "finished": _now(),
            # each file's identity (uri, path, size, mtime_ns, key): the plan's "input"
            "input": {"uri": p.input_uri, "files": self.key["input"]},
            "plan": {k: v for k, v in self.key.items() if k != "input"},
            "output": summary.output,
            "config": recorded_config(p.cfg),
            # whether the text was redacted, with which types and pattern names
            privacy.NAME: privacy.manifest_record(p.cfg),
            "models": models,
            "stages": list(p.stages),  # the chain, in order (the report orders by it)
            "labels": p.labels,
            # the extra classifier heads ([classify.heads]): name, dir, version, labels
            "heads": p.heads,
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


def empty_schemas(p: Plan) -> dict[str, pa.Schema]:
    """The contract's schemas of a run's tables before any batch: the labels, the chain's
    backend and model columns, and the embeddings' size as the embedding stage's check
    says (user stages' own sentence columns come only with rows)."""
    chain = registry.resolve(p.cfg, p.chain)
    dims = [f.embedding_dim for spec in chain for f in [spec.check(p.cfg)] if f.embedding_dim]
    dim = dims[0] if dims and p.cfg.run.embeddings else None
    heads = [h["name"] for h in p.heads]
    return {
        "documents": documents_schema(list(p.labels), ENTITIES in p.stages, heads),
        "sentences": sentences_schema(dim, list(p.stages), head_fields(heads)),
        "errors": ERRORS_SCHEMA,
    }


# What of the config a manifest records: an allow-list, so a key that may hold a secret is
# left out unless it is known not to. Sections of plain settings are recorded whole (their
# URL fields refuse userinfo and query strings at load); [output] only the keys below, and of
# its catalog_properties only the known non-secret ones (credentials belong in
# PYICEBERG_CATALOG__DOCINTEL__* variables); [stages.<name>] settings whose names look like
# secrets are redacted.
RECORDED_SECTIONS = (
    "input",
    "run",
    "pipeline",
    *registry.BUILTIN_NAMES,
    "resources",
    "storage",
    "job",
    "audit",
    "faults",
)  # fmt: skip (the built-in stages' sections hold model names and plain settings)
RECORDED_OUTPUT = ("format", "namespace", "catalog_type", "catalog_uri")
RECORDED_CATALOG_PROPERTIES = (
    "warehouse", "s3.region", "s3.endpoint", "s3.path-style-access", "client.region",
    "rest.signing-region", "rest.signing-name", "rest.sigv4-enabled",
)  # fmt: skip
SECRET_NAME = re.compile(
    r"(^|[._-])(key|pass|passwd|pwd|auth|dsn)($|[._-])|" + "|".join(SECRET_PROPERTY_WORDS),
    re.IGNORECASE,
)
REDACTED = "<redacted>"


def recorded_config(cfg: Config) -> dict[str, Any]:
    """The config as a manifest records it (see RECORDED_SECTIONS): no secret in it."""
    dumped = cfg.model_dump()
    out: dict[str, Any] = {k: dumped[k] for k in RECORDED_SECTIONS}
    output = {k: dumped["output"][k] for k in RECORDED_OUTPUT}
    props = dumped["output"]["catalog_properties"]
    output["catalog_properties"] = {
        k: (v if k in RECORDED_CATALOG_PROPERTIES else REDACTED) for k, v in props.items()
    }
    out["output"] = output
    out[privacy.NAME] = privacy.recorded_section(cfg)  # a user regex may spell out a value
    out["stages"] = {
        name: {
            k: REDACTED if SECRET_NAME.search(k.replace("_", "-")) else v
            for k, v in settings.items()
        }
        for name, settings in dumped["stages"].items()
    }
    return out


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()
