"""The hard bound on a batch's sentences: a batch split into pieces after the stage that
makes sentence rows.

The commit unit is a batch of documents, cut before anything is known of its sentences
(pipeline/input/source.py). A batch whose documents split into more than ``[run]
max_batch_sentences`` sentence rows is split, right after the stage that made the rows
(sentencize), into pieces of at most that many rows, at document boundaries, in document
order. Nothing is refused: every document lands in exactly one piece (a document has at
most ``[sentencize] max_sentences`` sentences, checked against the bound before any work).

The stage returns the pieces as one object; the calls after it pass a small
:class:`Split` marker on to the write (they do no work), and the driver, reading the
write's answer as it does for every batch, hands the pieces out. From there each piece is
a batch of its own: its own calls to the later stages, its own
write and its own commit, under the id ``<batch id>-p<i>of<n>``. The split is
deterministic (the same input and sentencizer give the same rows), so a resumed run cuts
the same pieces, skips those already committed, and counts the batch done when all ``n``
are (:func:`completed`). The in-flight cap counts pieces, so the embeddings in memory stay
within ``cap x max_batch_sentences`` rows whatever the documents' shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from docintel.pipeline.batch import Batch
from docintel.pipeline.schema import DOC_ID

_PIECE = re.compile(r"^(?P<parent>.+)-p(?P<i>\d+)of(?P<n>\d+)$")


@dataclass(frozen=True)
class Split:
    """What the calls after the splitting stage pass on, up to the write, for a batch that
    split, until the driver hands out its pieces: the number of pieces. The driver learns
    of a split from the write's answer, which it reads anyway: a batch that does not split
    costs nothing more."""

    n: int


@dataclass(frozen=True)
class Pieces:
    """What the splitting stage returns for a batch over the bound: its pieces, in order.
    Each later call is told which piece it serves (:func:`take`)."""

    pieces: tuple[Batch, ...]


def piece_id(batch_id: str, i: int, n: int) -> str:
    return f"{batch_id}-p{i}of{n}"


def parent(batch_id: str) -> tuple[str, int, int] | None:
    """(the batch, piece index, piece count) of a piece id; None for a whole batch."""
    m = _PIECE.match(batch_id)
    return (m["parent"], int(m["i"]), int(m["n"])) if m else None


def completed(committed: Iterable[str]) -> set[str]:
    """The committed ids, plus every batch all of whose pieces are committed (a resume
    skips it whole, read included)."""
    done = set(committed)
    seen: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for batch_id in done:
        p = parent(batch_id)
        if p is not None:
            seen.setdefault(p[0], set()).add(p[1])
            counts[p[0]] = p[2]
    done.update(b for b, got in seen.items() if len(got) == counts[b])
    return done


def passed_on(obj: object, piece: int) -> Split | None:
    """The :class:`Split` marker a call passes on instead of working (a split batch not yet
    handed out as pieces), else None."""
    if isinstance(obj, Split):
        return obj
    if isinstance(obj, Pieces) and piece < 0:
        return Split(len(obj.pieces))
    return None


def take(obj: Batch | Pieces, piece: int) -> Batch:
    """The batch a call serves: the piece ``piece`` of a split batch, else the batch. A
    piece asked of a batch that did not split (a retried piece whose batch now splits
    otherwise: the split must be deterministic) fails the call, rather than letting the
    whole batch be written beside pieces already committed."""
    if isinstance(obj, Pieces):
        return obj.pieces[piece]
    if piece >= 0:
        raise RuntimeError(
            f"batch {obj.batch_id} was split into pieces before, but not this time: "
            "the stage that makes sentence rows must be deterministic"
        )
    return obj


def _groups(doc_ids: list[str], rows: dict[str, int], cap: int) -> list[tuple[int, int]]:
    """Runs [start, end) of consecutive documents with at most ``cap`` rows each (a
    document over ``cap`` alone: it cannot happen under the config check, but is kept
    whole, never dropped)."""
    out, start, total = [], 0, 0
    for k, doc in enumerate(doc_ids):
        n = rows.get(doc, 0)
        if k > start and total + n > cap:
            out.append((start, k))
            start, total = k, 0
        total += n
    out.append((start, len(doc_ids)))
    return out


def split(batch: Batch, cap: int) -> list[Batch]:
    """``batch`` (sentence rows) cut into pieces of at most ``cap`` rows at document
    boundaries; ``[batch]`` itself when it fits. Errors go with their document; the
    stages' seconds are shared out by rows (the manifest's timings add up)."""
    if batch.table.num_rows <= cap:
        return [batch]
    counts = pc.value_counts(batch.table.column(DOC_ID)).to_pylist()
    rows = {c["values"]: c["counts"] for c in counts}
    doc_ids = batch.doc_ids.to_pylist()
    groups = _groups(doc_ids, rows, cap)
    if len(groups) == 1:
        return [batch]
    total = batch.table.num_rows
    pieces = []
    for i, (start, end) in enumerate(groups):
        ids = batch.doc_ids.slice(start, end - start)
        value_set = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        table = batch.table.filter(pc.is_in(batch.table.column(DOC_ID), value_set=value_set))
        errors = batch.errors.filter(pc.is_in(batch.errors.column(DOC_ID), value_set=value_set))
        share = table.num_rows / total
        pid = piece_id(batch.batch_id, i, len(groups))
        at = errors.schema.get_field_index("batch_id")
        ids_col = pa.array([pid] * errors.num_rows, pa.string())
        errors = errors.set_column(at, errors.schema.field(at), ids_col)
        pieces.append(
            replace(
                batch,
                batch_id=pid,
                doc_ids=ids,
                table=table,
                errors=errors,
                seconds={s: v * share for s, v in batch.seconds.items()},
                backends=dict(batch.backends),
                versions=dict(batch.versions),
                documents=_documents_of(batch, value_set),
            )
        )
    return pieces


def _documents_of(batch: Batch, ids: pa.Array) -> pa.Table | None:
    """The document columns of the documents ``ids`` (document input), else None."""
    docs = batch.documents
    return None if docs is None else docs.filter(pc.is_in(docs.column(DOC_ID), value_set=ids))
