"""Output: one batch's documents, sentences and errors parts, written atomically.

Each batch writes ``errors/part-<batch id>.parquet``, ``sentences/part-<batch id>.parquet``
and, last, ``documents/part-<batch id>.parquet``: a batch whose documents part exists is
complete. Files are written under a hidden temporary name and renamed, so readers
(which skip hidden files) never see half a file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.batch import Batch
from pipeline.schema import (
    DOC_ID,
    EMBEDDING,
    PROBS,
    STAGES,
    TRUNCATED,
    documents_schema,
    label_count_column,
    sentences_schema,
)

TABLES = ("documents", "sentences", "errors")
MANIFEST = "_manifest.json"


def resolve_output(uri: str) -> tuple[pafs.FileSystem, str]:
    from pathlib import Path

    target = uri if "://" in uri else str(Path(uri).expanduser().resolve())
    fs, root = pafs.FileSystem.from_uri(target)
    return fs, root.rstrip("/")


def part_path(root: str, table: str, batch_id: str) -> str:
    return f"{root}/{table}/part-{batch_id}.parquet"


def atomic_write(fs: pafs.FileSystem, path: str, data: pa.Table | bytes) -> None:
    """Write ``data`` to a hidden sibling, then rename it into place."""
    folder, _, name = path.rpartition("/")
    fs.create_dir(folder, recursive=True)
    tmp = f"{folder}/.{name}.tmp"
    if isinstance(data, pa.Table):
        pq.write_table(data, tmp, filesystem=fs, compression="zstd")
    else:
        with fs.open_output_stream(tmp) as out:
            out.write(data)
    fs.move(tmp, path)


def documents_table(batch: Batch, labels: list[str]) -> pa.Table:
    """Exactly one row per document of the batch, in input order."""
    n = batch.n_docs
    sents = batch.table
    idx = pc.index_in(sents[DOC_ID], value_set=batch.doc_ids).to_numpy(zero_copy_only=False)
    n_sent = np.bincount(idx, minlength=n).astype(np.int32)
    trunc = sents[TRUNCATED].to_numpy(zero_copy_only=False).astype(np.int64)
    n_trunc = np.bincount(idx, weights=trunc, minlength=n).astype(np.int32)
    k = len(labels)
    probs = sents[PROBS].combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, k)
    prob_sum = np.zeros((n, k), dtype=np.float64)
    np.add.at(prob_sum, idx, probs)
    best = probs.argmax(axis=1) if len(probs) else np.zeros(0, dtype=np.int64)
    counts = np.zeros((n, k), dtype=np.int32)
    np.add.at(counts, (idx, best), 1)
    has = n_sent > 0
    mean = np.divide(prob_sum, n_sent[:, None], out=np.zeros_like(prob_sum), where=has[:, None])
    top = mean.argmax(axis=1)
    failed = pc.is_in(batch.doc_ids, value_set=batch.errors[DOC_ID].combine_chunks())
    cols: dict[str, Any] = {
        DOC_ID: batch.doc_ids,
        "status": pc.if_else(failed, "error", "ok"),
        "n_sentences": n_sent,
        "n_truncated": n_trunc,
    }
    for j, lb in enumerate(labels):
        cols[label_count_column(lb)] = counts[:, j]
    cols["top_label"] = pa.array(
        [labels[t] if h else None for t, h in zip(top, has, strict=True)], pa.string()
    )
    cols["top_score"] = pa.array(
        np.where(has, mean[np.arange(n), top], np.nan), pa.float32(), mask=~has
    )
    cols["batch_id"] = pa.array([batch.batch_id] * n, pa.string())
    return pa.table(cols, schema=documents_schema(labels))


def sentences_table(batch: Batch, embeddings: bool) -> pa.Table:
    t = batch.table.drop_columns([PROBS])
    if not embeddings:
        t = t.drop_columns([EMBEDDING])
    n = t.num_rows
    for stage in STAGES:
        t = t.append_column(f"{stage}_backend", pa.array([batch.backends[stage]] * n, pa.string()))
    for stage in STAGES:
        t = t.append_column(f"{stage}_model", pa.array([batch.versions[stage]] * n, pa.string()))
    dim = t.schema.field(EMBEDDING).type.list_size if embeddings else None
    return t.select(sentences_schema(dim).names).cast(sentences_schema(dim))


@dataclass
class BatchStats:
    """What the driver learns about a written batch (small: no document data)."""

    batch_id: str
    documents: int
    sentences: int
    errors: int
    seconds: dict[str, float] = field(default_factory=dict)
    backends: dict[str, str] = field(default_factory=dict)


def write_batch(
    fs: pafs.FileSystem, root: str, batch: Batch, labels: list[str], embeddings: bool
) -> BatchStats:
    """Write a finished batch's three parts (documents last) and return its counts."""
    import time

    t0 = time.perf_counter()
    docs = documents_table(batch, labels)
    sents = sentences_table(batch, embeddings)
    atomic_write(fs, part_path(root, "errors", batch.batch_id), batch.errors)
    atomic_write(fs, part_path(root, "sentences", batch.batch_id), sents)
    atomic_write(fs, part_path(root, "documents", batch.batch_id), docs)
    return BatchStats(
        batch_id=batch.batch_id,
        documents=docs.num_rows,
        sentences=sents.num_rows,
        errors=pc.count_distinct(batch.errors[DOC_ID]).as_py(),
        seconds={**batch.seconds, "write": time.perf_counter() - t0},
        backends=dict(batch.backends),
    )


def write_manifest(fs: pafs.FileSystem, root: str, manifest: dict[str, Any]) -> None:
    """Commit the run: the manifest is written last, atomically."""
    atomic_write(fs, f"{root}/{MANIFEST}", json.dumps(manifest, indent=2, default=str).encode())


def read_manifest(fs: pafs.FileSystem, root: str) -> dict[str, Any] | None:
    path = f"{root}/{MANIFEST}"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode())
