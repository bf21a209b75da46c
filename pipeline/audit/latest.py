"""The ``latest/`` view: one row per current document (its latest version) and its sentences.

Every night's run holds the versions that night processed, so reading all partitions (or
a whole Iceberg table) counts a changed document once per version. ``OUTPUT/latest/``
holds each current document once, as Parquet in either output format::

    latest/documents/part-<date>-<key>.parquet   the rows of the night's file <key>
    latest/sentences/part-<date>-<key>.parquet   (run_date=<date>/documents/part-<key>, or
                                                 a data file of its Iceberg snapshots) whose
                                                 document's latest version is that night's
                                                 (doc index ``processed_date``), plus a
                                                 run_date column; no embedding
    latest/_latest.json                          the audit date it reflects, its counts

A docintel reader (or ``read_parquet('OUTPUT/latest/sentences/*.parquet')`` in DuckDB)
reads it like a run's output. Each audit updates it before committing its state: first it
drops the superseded and removed documents from the parts of the nights that held them,
then adds tonight's parts, each file replaced atomically. The nights' rows are read
through tables.py, so the view is the same whichever format the nights were written in.
A reader during the update may miss a changed document for a moment, but never counts one
twice. The update is idempotent (a crashed audit redoes it); a ``latest/`` that does not
match the last completed audit (made before this view existed, or edited) is rebuilt from
the nights' runs and the index.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from docintel.pipeline.audit.changes import CHANGE, NEW, PREVIOUS_DATE
from docintel.pipeline.audit.state import (
    PARTITION_KEY,
    PROCESSED_DATE,
    AuditLayout,
    read_json,
    write_json,
)
from docintel.pipeline.audit.tables import NightTables
from docintel.pipeline.formats.parquet import PART, SUFFIX, part_files
from docintel.pipeline.output.sink import atomic_write
from docintel.pipeline.output.tables import Part, plain
from docintel.pipeline.report.review import owning_ids
from docintel.pipeline.schema import DOC_ID, EMBEDDING, LABEL, UNLABELLED

LATEST_DIR = "latest"
LATEST_MARKER = "_latest.json"
TABLES = ("documents", "sentences")
READ_BATCH_ROWS = 16_384


def latest_root(lay: AuditLayout) -> str:
    return f"{lay.root}/{LATEST_DIR}"


def _latest_parts(lay: AuditLayout, table: str) -> dict[str, str]:
    """{path: night date} of the view's parts of ``table``."""
    out = {}
    for path in part_files(lay.fs, latest_root(lay), table):
        key = path.rsplit("/", 1)[1][len(PART) : -len(SUFFIX)]
        out[path] = key[:10]
    return out


def update_latest(
    lay: AuditLayout,
    day: str,
    index: pa.Table,
    diff: pa.Table,
    last_done: str | None,
    night: NightTables,
) -> dict[str, Any]:
    """Bring ``latest/`` to the state after ``day`` (``index``: the doc index after it,
    ``diff``: tonight's changes, ``night``: a night's run as tables); returns the corpus
    counts it now holds."""
    marker = read_json(lay, f"{latest_root(lay)}/{LATEST_MARKER}")
    # a view that does not reflect the last completed audit is rebuilt whole
    rebuild = (marker or {}).get("date") not in (last_done, day)
    held = {d for t in TABLES for d in _latest_parts(lay, t).values()}
    if rebuild or last_done is None:
        dates = held | {d.isoformat() for d in pc.unique(index[PROCESSED_DATE]).to_pylist()}
    else:
        gone = diff.filter(pc.not_equal(diff[CHANGE], NEW))[PREVIOUS_DATE]
        dates = {d.isoformat() for d in pc.unique(gone).to_pylist() if d is not None}
    dates.discard(day)
    for d in sorted(dates):  # superseded versions leave first: never counted twice
        _refresh_date(lay, night(d).parts, d, index, bool(rebuild))
    _refresh_date(lay, night(day).parts, day, index, True)
    corpus = corpus_counts(lay)
    write_json(lay, f"{latest_root(lay)}/{LATEST_MARKER}", {"date": day, **corpus})
    return corpus


def _refresh_date(
    lay: AuditLayout,
    parts: Callable[[str], list[Part]],
    day: str,
    index: pa.Table,
    copy: bool,
) -> None:
    """The view's parts of night ``day``: its run's rows (``parts``: its files of a table)
    of the documents whose latest version is that night's. ``copy``: write every part from
    the run; else rewrite only the view's parts that hold a document no longer current."""
    when = pa.scalar(dt.date.fromisoformat(day), pa.date32())
    current = index.filter(pc.equal(index[PROCESSED_DATE], when))[DOC_ID]
    for table in TABLES:
        held = {p for p, d in _latest_parts(lay, table).items() if d == day}
        wanted = set()
        for src in parts(table):
            dst = f"{latest_root(lay)}/{table}/{PART}{day}-{src.key}{SUFFIX}"
            if dst in held and not copy and _all_current(lay, dst, current):
                wanted.add(dst)
                continue
            if _write_current(lay, src, dst, current, when):
                wanted.add(dst)
        for stale in held - wanted:
            lay.fs.delete_file(stale)


def _all_current(lay: AuditLayout, path: str, current: pa.ChunkedArray) -> bool:
    with lay.fs.open_input_file(path) as f:
        ids = pq.read_table(f, columns=[DOC_ID])[DOC_ID]
    return pc.all(_is_current(ids, current)).as_py() is not False


def _is_current(ids: pa.ChunkedArray, current: pa.ChunkedArray) -> pa.ChunkedArray:
    """Whether each id's document is current: its own index row's, or (an e-mail
    attachment's document, not in the index) its e-mail's."""
    return pc.or_(pc.is_in(ids, value_set=current), pc.is_in(owning_ids(ids), value_set=current))


def _write_current(
    lay: AuditLayout, src: Part, dst: str, current: pa.ChunkedArray, when: pa.Scalar
) -> bool:
    """``src``'s rows of current documents (no embedding, plus run_date) to ``dst``;
    False when there are none."""
    with src.opener() as f:
        pf = pq.ParquetFile(f)
        cols = [c for c in pf.schema_arrow.names if c != EMBEDDING]
        table = pa.Table.from_batches([plain(b) for b in pf.read(columns=cols).to_batches()])
    rows = table.filter(_is_current(table[DOC_ID], current))
    if rows.num_rows == 0:
        return False  # the caller deletes ``dst``
    rows = rows.append_column(PARTITION_KEY, pa.array([when.as_py()] * rows.num_rows, pa.date32()))
    atomic_write(lay.fs, dst, rows)
    return True


def corpus_counts(lay: AuditLayout) -> dict[str, Any]:
    """Documents, sentences and sentences per label in ``latest/`` (read batch by batch)."""
    docs = 0
    for path in part_files(lay.fs, latest_root(lay), "documents"):
        with lay.fs.open_input_file(path) as f:
            docs += pq.ParquetFile(f).metadata.num_rows
    labels: Counter[str] = Counter()
    for path in part_files(lay.fs, latest_root(lay), "sentences"):
        with lay.fs.open_input_file(path) as f:
            for b in pq.ParquetFile(f).iter_batches(batch_size=READ_BATCH_ROWS, columns=[LABEL]):
                for v in pc.value_counts(b.column(0)).to_pylist():
                    labels[v["values"] or UNLABELLED] += v["counts"]  # null: other languages
    n = sum(labels.values())
    return {
        "documents": docs,
        "sentences": n,
        "label_counts": dict(sorted(labels.items())),
        "label_shares": {lb: c / n for lb, c in sorted(labels.items())} if n else {},
    }
