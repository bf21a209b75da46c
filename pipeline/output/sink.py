"""The output sink interface: one class owns how OUTPUT is stored, from open to commit.

:class:`RunSink` is shaped like Ray Data's ``Datasink`` (``on_write_start`` → ``write`` →
``on_write_complete`` / ``on_write_failed``), stretched to the needs of an exactly-once,
resumable run (docs/design.md, "The output contract"):

    driver    open()              what OUTPUT holds: a committed manifest, an unfinished
                                  run's state, or nothing (read only)
              start(state) |      a new run claims the output (run state first), or a
              resume()            resumed one settles what a crash left and learns the
                                  committed batches' stats
    workers   write(batch)        inside a Ray write task: one batch, atomically
    driver    written(stats)      as each written batch is recorded (a sink that commits
                                  in groups commits here; Parquet parts: nothing)
              finish(task_map)    after the last write (compaction), on tasks the runner runs
              commit(manifest)    the manifest, last and atomically: the run is committed
              abort()             the run stops uncommitted: keep what a resume needs

``pipeline/output/protocol.py`` (:class:`~docintel.pipeline.output.protocol.RunOutput`)
keeps the run-level protocol (lease, error budget, counts, what the manifest says) and
calls only this interface. Each table format is one module of ``pipeline/formats/`` (its
sink, its reader, its marker files and its detection), chosen through the registry there,
with no change to the executor or the runner. The sink object travels to every write task
(the executor puts it in the object store once per run), so it holds only small, picklable
things: a filesystem, a root path, the labels, flags.

Also here, because every format shares them: the output location, atomic files, the
tables' rows as the contract writes them (:func:`documents_table`, :func:`sentences_table`)
and a batch's stats.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline.batch import Batch
from docintel.pipeline.config import StorageConfig
from docintel.pipeline.entities.stage import document_entity_ids
from docintel.pipeline.output.documents import document_columns, found_documents, page_column
from docintel.pipeline.schema import (
    CONTRACT_SENTENCE_COLUMNS,
    DOC_ID,
    EMBEDDING,
    ENTITIES,
    ENTITY_IDS,
    HEAD_PROBS_PREFIX,
    LABEL,
    LANGUAGE,
    N_TOKENS,
    N_UNLABELLED,
    PAGE,
    PROBS,
    TRUNCATED,
    backend_column,
    documents_schema,
    head_columns,
    head_probs,
    label_count_column,
    model_column,
    sentences_schema,
)
from docintel.pipeline.stages.language import document_languages
from docintel.pipeline.storage import check_bucket, is_local, resolve_uri

TABLES = ("documents", "sentences", "errors")
MANIFEST = "_manifest.json"  # the contract's commit marker, whatever the table format
RUN_STATE = "_run.json"  # written first: marks the folder as holding (part of) this run
COMPRESSION = "zstd"  # small files, fast to decode; every reader we target supports it

_T = TypeVar("_T")
_R = TypeVar("_R")


# --- what every sink shares: the output location, atomic files, the tables' rows ---------


def resolve_output(uri: str, storage: StorageConfig) -> tuple[pafs.FileSystem, str]:
    """The filesystem and root path of the output; on S3, the bucket must exist."""
    fs, root = resolve_uri(uri, storage, "output")
    check_bucket(fs, root, "output")
    return fs, root.rstrip("/") or "/"


def atomic_write(fs: pafs.FileSystem, path: str, data: pa.Table | bytes) -> None:
    """Make ``path`` appear whole or not at all.

    Locally: write a hidden sibling, then rename it into place. Object stores have no
    atomic rename (pyarrow's move there is copy + delete), but each PUT is atomic per
    object: encode in memory first, then upload the finished bytes straight to ``path``.
    """
    if not is_local(fs):
        payload = _encode(data)
        with fs.open_output_stream(path) as out:
            out.write(payload)
        return
    folder, _, name = path.rpartition("/")
    fs.create_dir(folder, recursive=True)
    tmp = f"{folder}/.{name}.{uuid.uuid4().hex[:12]}.tmp"  # unique per writer: no shared temp
    if isinstance(data, pa.Table):
        pq.write_table(data, tmp, filesystem=fs, **parquet_options(data.schema))
    else:
        with fs.open_output_stream(tmp) as out:
            out.write(data)
    fs.move(tmp, path)


def _floats(t: pa.DataType) -> bool:
    while pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return pa.types.is_floating(t)


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """zstd everywhere; dictionary encoding only for columns that repeat values (ids,
    labels, backends), not floats. A dictionary of 384-d embeddings never pays: Parquet
    builds it, overflows its page and falls back, and in a batch-sized file the attempt
    costs a third of the file (1.46 MB -> 0.92 MB for 640 sentences, bench/compaction.py)."""
    return {
        "compression": COMPRESSION,
        "use_dictionary": [f.name for f in schema if not _floats(f.type)],
    }


def _encode(data: pa.Table | bytes) -> bytes | pa.Buffer:
    if not isinstance(data, pa.Table):
        return data
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, **parquet_options(data.schema))
    return sink.getvalue()


def read_json(fs: pafs.FileSystem, path: str) -> dict[str, Any] | None:
    """A small JSON file (manifest, run state), or None when it does not exist."""
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode())


def write_manifest(fs: pafs.FileSystem, root: str, manifest: dict[str, Any]) -> None:
    """Commit the run: the manifest is written last, atomically."""
    atomic_write(fs, f"{root}/{MANIFEST}", json.dumps(manifest, indent=2, default=str).encode())


def read_manifest(fs: pafs.FileSystem, root: str) -> dict[str, Any] | None:
    """The committed run's manifest (readers: the report, the audit), or None."""
    return read_json(fs, f"{root}/{MANIFEST}")


def documents_table(batch: Batch, labels: list[str]) -> pa.Table:
    """Exactly one row per document of the batch, in input order."""
    n = batch.n_docs
    sents = batch.table
    idx = pc.index_in(sents[DOC_ID], value_set=batch.doc_ids).to_numpy(zero_copy_only=False)
    n_sent = np.bincount(idx, minlength=n).astype(np.int32)
    trunc = sents[TRUNCATED].to_numpy(zero_copy_only=False).astype(np.int64)
    n_trunc = np.bincount(idx, weights=trunc, minlength=n).astype(np.int32)
    failed = pc.is_in(batch.doc_ids, value_set=batch.errors[DOC_ID].combine_chunks())
    cols: dict[str, Any] = {
        DOC_ID: batch.doc_ids,
        "status": pc.if_else(failed, "error", "ok"),
        **document_columns(batch),
        LANGUAGE: document_languages(sents, idx, n),
        "n_sentences": n_sent,
        "n_truncated": n_trunc,
        **_label_columns(sents, idx, n, labels),
    }
    cols["batch_id"] = pa.array([batch.batch_id] * n, pa.string())
    entities = ENTITIES in sents.column_names  # the run has the entities stage
    if entities:
        cols[ENTITY_IDS] = document_entity_ids(sents, idx, n)
    heads = head_probs(sents.schema)  # the extra heads, from their probabilities' columns
    for name, head_labels in heads.items():
        cols.update(_head_document_columns(sents, idx, n, name, head_labels))
    return pa.table(cols, schema=documents_schema(labels, entities, list(heads)))


def _head_document_columns(
    sents: pa.Table, idx: np.ndarray, n: int, name: str, labels: list[str]
) -> dict[str, pa.Array]:
    """An extra head's document label (the arg-max of the mean of its labelled sentences'
    probabilities) and that mean probability; null for a document without labelled ones."""
    k = len(labels)
    column = sents[f"{HEAD_PROBS_PREFIX}{name}"].combine_chunks()
    probs = column.flatten().to_numpy(zero_copy_only=False).reshape(-1, k)
    label_col, score_col = head_columns(name)
    labelled = pc.is_valid(sents[label_col]).to_numpy(zero_copy_only=False).astype(bool)
    mean, has = _mean_probs(idx[labelled], probs[labelled], n)
    top = mean.argmax(axis=1)
    names = np.asarray(labels, dtype=object)[top]
    return {
        label_col: pa.array(names.tolist(), pa.string(), mask=~has),
        score_col: pa.array(mean[np.arange(n), top], pa.float32(), mask=~has),
    }


def _label_columns(sents: pa.Table, idx: np.ndarray, n: int, labels: list[str]) -> dict[str, Any]:
    """``n_unlabelled``, the per-label counts and the top label and its mean score of each
    document, over its labelled sentences only (a null label: a language the head was not
    trained on)."""
    k = len(labels)
    probs = sents[PROBS].combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, k)
    labelled = pc.is_valid(sents[LABEL]).to_numpy(zero_copy_only=False).astype(bool)
    unlabelled = (~labelled).astype(np.int64)
    n_unlabelled = np.bincount(idx, weights=unlabelled, minlength=n).astype(np.int32)
    idx, probs = idx[labelled], probs[labelled]
    best = probs.argmax(axis=1) if len(probs) else np.zeros(0, dtype=np.int64)
    counts = np.zeros((n, k), dtype=np.int32)
    np.add.at(counts, (idx, best), 1)
    mean, has = _mean_probs(idx, probs, n)
    top = mean.argmax(axis=1)
    cols: dict[str, Any] = {N_UNLABELLED: n_unlabelled}
    for j, lb in enumerate(labels):
        cols[label_count_column(lb)] = counts[:, j]
    cols["top_label"] = pa.array(
        [labels[t] if h else None for t, h in zip(top, has, strict=True)], pa.string()
    )
    cols["top_score"] = pa.array(
        np.where(has, mean[np.arange(n), top], np.nan), pa.float32(), mask=~has
    )
    return cols


def _mean_probs(idx: np.ndarray, probs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each of ``n`` documents' mean probability vector over its sentences (rows of
    ``probs``, document ``idx``), and whether it has any (a mean of zeros where not)."""
    count = np.bincount(idx, minlength=n)
    total = np.zeros((n, probs.shape[1]), dtype=np.float64)
    np.add.at(total, idx, probs)
    has = count > 0
    return np.divide(total, count[:, None], out=np.zeros_like(total), where=has[:, None]), has


def sentences_table(batch: Batch, embeddings: bool) -> pa.Table:
    """The batch's sentence rows as written.

    The chain is whatever stages ran, in the order run_stage recorded their backends;
    columns the contract does not name were added by user-defined stages and are kept with
    their own types, in table order, so a new stage needs no change here."""
    internal = [c for c in batch.table.column_names if c.startswith(HEAD_PROBS_PREFIX)]
    t = batch.table.drop_columns([PROBS, *internal])  # the heads' probabilities: internal
    if PAGE not in t.column_names:
        t = t.append_column(PAGE, page_column(batch, t))
    if LANGUAGE not in t.column_names:  # a chain without the language stage (tests, tools)
        t = t.append_column(LANGUAGE, pa.nulls(t.num_rows, pa.string()))
    if not embeddings and EMBEDDING in t.column_names:
        t = t.drop_columns([EMBEDDING])
    stages = list(batch.backends)
    extra = [f for f in t.schema if f.name not in CONTRACT_SENTENCE_COLUMNS]
    n = t.num_rows
    for stage in stages:
        backend = pa.array([batch.backends[stage]] * n, pa.string())
        t = t.append_column(backend_column(stage), backend)
    for stage in stages:
        t = t.append_column(model_column(stage), pa.array([batch.versions[stage]] * n, pa.string()))
    dim = t.schema.field(EMBEDDING).type.list_size if EMBEDDING in t.column_names else None
    schema = sentences_schema(dim, stages, extra)
    return t.select(schema.names).cast(schema)


@dataclass
class BatchStats:
    """What the driver learns about a written batch (small: no document data)."""

    batch_id: str
    documents: int
    sentences: int
    errors: int
    tokens: int = 0
    # documents found inside the input's files (e-mail attachments): rows beyond the input
    found: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    backends: dict[str, str] = field(default_factory=dict)


def batch_stats(batch: Batch, docs: pa.Table, sents: pa.Table) -> BatchStats:
    """The counts of a batch about to be written (any format: from its tables)."""
    return BatchStats(
        batch_id=batch.batch_id,
        documents=docs.num_rows,
        found=found_documents(batch),
        sentences=sents.num_rows,
        errors=pc.count_distinct(batch.errors[DOC_ID]).as_py(),
        tokens=int(pc.sum(sents[N_TOKENS]).as_py() or 0),
        backends=dict(batch.backends),
    )


# --- the interface ---------------------------------------------------------------------


class TaskMap(Protocol):
    """Runs ``fn`` on each item where the caller decides (the runner: Ray tasks, a bounded
    window in flight, under the output's lease; tests and tools: this process) and yields
    the results in any order. ``fn`` is a picklable bound method of a sink and idempotent:
    a task may run it twice. It is how ``finish`` spreads work without importing Ray."""

    def __call__(self, fn: Callable[[_T], _R], items: Sequence[_T], /) -> Iterator[_R]: ...


def in_process(fn: Callable[[_T], _R], items: Sequence[_T], /) -> Iterator[_R]:
    """A :class:`TaskMap` that runs every item here, one after the other."""
    return map(fn, items)


@dataclass(frozen=True)
class Existing:
    """What OUTPUT holds before a run touches it (:meth:`RunSink.open`)."""

    manifest: dict[str, Any] | None  # a committed run
    state: dict[str, Any] | None  # an unfinished run's record (run id, input, started)


class RunSink(ABC):
    """One run's output storage. Implementations own every name, file and commit point;
    the caller (RunOutput) holds the lease and decides, from :meth:`open`, between start,
    resume and "already complete". Instances are pickled into write tasks: keep them small.
    """

    @abstractmethod
    def open(self) -> Existing:
        """Look at OUTPUT without changing it: a committed manifest, else an unfinished
        run's state, else neither. Refuses (UsageError) an OUTPUT no run may write, so the
        caller refuses before it takes the lease; :meth:`start` checks again under it."""

    def completed(self) -> Iterator[dict[str, Any]]:
        """The manifests of the completed runs OUTPUT holds besides this one (a warehouse
        of appending runs; one run per folder: none), so that a run of the same input and
        plan is a no-op."""
        return iter(())

    @abstractmethod
    def start(self, state: dict[str, Any]) -> None:
        """A new run claims OUTPUT: refuse one that holds tables but no run, then persist
        ``state`` before any batch (so a crash leaves a resumable run, not debris)."""

    @abstractmethod
    def resume(self) -> dict[str, BatchStats]:
        """This run resumes: settle what a crash left (exactly one copy of every batch),
        then the stats of every committed batch, by batch id, read once from storage."""

    @abstractmethod
    def write(self, batch: Batch) -> BatchStats:
        """On a worker: write one finished batch so that it is committed whole or not at
        all (idempotent: a retried task rewrites the same batch), and return its stats."""

    def written(self, stats: BatchStats) -> None:  # noqa: B027 (optional hook)
        """On the driver, as a written batch is recorded (its stats): a sink that commits
        batches in groups commits here. By default nothing: a batch is committed by its
        own write."""

    @abstractmethod
    def finish(self, task_map: TaskMap) -> dict[str, Any]:
        """After the last write, before the commit: reorganise what was written (compact
        small files) on ``task_map``; what it did, for the manifest's ``parts``."""

    @abstractmethod
    def write_empty(self, schemas: dict[str, pa.Schema]) -> None:
        """A run of 0 documents: leave each table readable and empty, with ``schemas``
        (the contract's), so readers of the output find the tables they expect."""

    @abstractmethod
    def table_files(self) -> dict[str, dict[str, int]]:
        """Files and bytes per table as the output holds them now (for the manifest)."""

    @abstractmethod
    def commit(self, manifest: dict[str, Any]) -> None:
        """Write ``manifest`` last and atomically: from then on the run is committed."""

    @abstractmethod
    def abort(self) -> None:
        """The run stops uncommitted (failure, Ctrl-C): leave everything a resume with the
        same run id needs, and drop only what no resume can use."""


S3_DELETE_BATCH = 1000  # keys per DeleteObjects request (S3's limit)


def delete_parts(fs: pafs.FileSystem, paths: list[str]) -> None:
    """Delete files that may already be gone. On S3 through boto3's batch delete (1,000
    keys a request): pyarrow's delete_file checks each key first and leaves folder markers
    behind."""
    if is_local(fs):
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(path)
        return
    client = fs.boto3_client()  # type: ignore[attr-defined]
    by_bucket: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        bucket, _, key = path.partition("/")
        by_bucket[bucket].append(key)
    for bucket, keys in by_bucket.items():
        for i in range(0, len(keys), S3_DELETE_BATCH):
            chunk = [{"Key": k} for k in keys[i : i + S3_DELETE_BATCH]]
            answer = client.delete_objects(Bucket=bucket, Delete={"Objects": chunk, "Quiet": True})
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise OSError(
                    f"S3 refused to delete {len(answer['Errors'])} part(s) in {bucket}, "
                    f"first {first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )
