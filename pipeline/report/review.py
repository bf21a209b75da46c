"""Documents to review first: the night's documents ranked by a document risk score.

With R the risk labels (``[audit] risk_label``, or ``risk_labels``: labels of any head,
``NAME.label`` for an extra head's), N a document's sentences and p a sentence's score (its
label's probability, after calibration) when its label is in R (summed over its heads
when several heads give it a risk label)::

    risk mass  M = sum of p over the sentences labelled R   (expected risk sentences)
    risk score S = M * M / N                                 (0 when N is 0)

S is the expected number of risk sentences weighted by the share of the document they
make up (M / N): one risk sentence in a one-line document scores p squared, two strong
risk sentences in three score about 1.1, five in a fifty-sentence digest 0.4. It does not
saturate (it grows with the amount of risk text) and ties are rare (it sums probabilities).
Ties are broken by M, then by id. The sentences table keeps only the winning label's
probability, so sentences labelled otherwise add nothing.

Memory: one pass over sentences/ (shared with aggregate.py) sums (N, risk count, M) per
document into Arrow tables, one row per document; a second, filtered pass reads the
sentences of the first :data:`REVIEW_JSON_MAX` ranked documents only.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from docintel.pipeline.labels import LabelRef, label_columns, risk_of
from docintel.pipeline.output.tables import RunTables
from docintel.pipeline.schema import DOC_ID, LABEL, PAGE, SCORE, SENT_INDEX, TEXT
from docintel.pipeline.untrusted import csv_cell

REVIEW_CSV = "review.csv"
CHANGES_CSV = "changes.csv"
REVIEW_JSON_MAX = 1000  # ranked documents listed in report.json (review.csv has them all)
REVIEW_SENTENCES = 3  # top risk sentences per reviewed document
DRILL_SENTENCES = 200  # sentences shown per document in the drill-down
COMPACT_EVERY = 64  # per-batch partial sums merged after this many batches

_AGG = [("n", "sum"), ("risk", "sum"), ("mass", "sum")]


class DocScores:
    """Per-document sentence count, risk count and risk mass, summed batch by batch."""

    def __init__(self, risk: Sequence[LabelRef]) -> None:
        self.risk = list(risk)  # the risk labels, of any head
        self.parts: list[pa.Table] = []
        self.docs: list[pa.Table] = []

    def add_sentences(self, b: pa.RecordBatch) -> None:
        risky, mass = risk_of(b, self.risk)
        t = pa.table(
            {
                DOC_ID: b.column(DOC_ID),
                "n": pa.array([1] * b.num_rows, pa.int64()),
                "risk": pa.array(risky.astype(np.int64)),
                "mass": pa.array(mass),
            }
        )
        self.parts.append(_sums(t))
        if len(self.parts) >= COMPACT_EVERY:
            self.parts = [_sums(pa.concat_tables(self.parts))]

    def add_documents(self, b: pa.RecordBatch) -> None:
        self.docs.append(pa.table({DOC_ID: b.column(DOC_ID), "doc_status": b.column("status")}))

    def ranked(self, changes: dict[str, Any] | None) -> pa.Table:
        """Every document of the night, best first: rank, doc_id, status (new / changed /
        reprocessed; null without ``changes``), risk_score, risk_mass, risk_sentences,
        sentences, doc_status (ok / error)."""
        empty = pa.table({DOC_ID: pa.array([], pa.string()), "n": [], "risk": [], "mass": []})
        sums = _sums(pa.concat_tables(self.parts)) if self.parts else empty
        sums = sums.cast(
            pa.schema([(DOC_ID, pa.string()), ("n", pa.int64()), ("risk", pa.int64()),
                       ("mass", pa.float64())])
        )  # fmt: skip
        docs = pa.concat_tables(self.docs) if self.docs else _EMPTY_DOCS
        j = docs.join(sums, keys=DOC_ID, join_type="left outer")
        n = pc.fill_null(j["n"], 0)
        mass = pc.fill_null(j["mass"], 0.0)
        score = pc.if_else(pc.greater(n, 0), pc.divide(pc.multiply(mass, mass), n), 0.0)
        t = pa.table(
            {
                DOC_ID: j[DOC_ID],
                "status": _status(j[DOC_ID], changes),
                "risk_score": score,
                "risk_mass": mass,
                "risk_sentences": pc.fill_null(j["risk"], 0),
                "sentences": n,
                "doc_status": j["doc_status"],
            }
        )
        t = t.sort_by([("risk_score", "descending"), ("risk_mass", "descending"),
                       (DOC_ID, "ascending")])  # fmt: skip
        return t.add_column(0, "rank", pa.array(range(1, t.num_rows + 1), pa.int64()))


_EMPTY_DOCS = pa.table({DOC_ID: pa.array([], pa.string()), "doc_status": pa.array([], pa.string())})


def _sums(t: pa.Table) -> pa.Table:
    out = t.group_by(DOC_ID).aggregate(_AGG)
    out = out.rename_columns([c.removesuffix("_sum") for c in out.column_names])
    return out.select([DOC_ID, "n", "risk", "mass"])


def _status(ids: pa.ChunkedArray, changes: dict[str, Any] | None) -> pa.Array:
    if changes is None:
        return pa.nulls(len(ids), pa.string())
    changed = pa.array([c["doc_id"] for c in changes.get("changed", [])], pa.string())
    new = pa.array(changes.get("new", []), pa.string())
    files = owning_ids(ids)  # an e-mail attachment's document has its e-mail's status

    def among(some: pa.Array) -> pa.Array:
        return pc.or_(pc.is_in(ids, value_set=some), pc.is_in(files, value_set=some))

    return pc.if_else(among(changed), "changed", pc.if_else(among(new), "new", "reprocessed"))


# An e-mail's attachment is a document ``<path>.eml/<name>`` (pipeline/input/documents.py)
_ATTACHMENT = r"(?i)^(.*?\.eml)/.+$"


def owning_ids(ids: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Each document id, or for an e-mail attachment's document the e-mail's id: the audit's
    doc index holds one row per source file, and attachments follow their file."""
    return pc.replace_substring_regex(ids, _ATTACHMENT, r"\1")


def _has_column(tables: RunTables, table: str, column: str) -> bool:
    """Whether the run's ``table`` has ``column`` (one footer read)."""
    parts = tables.parts(table)
    if not parts:
        return False
    with parts[0].opener() as f:
        return column in pq.ParquetFile(f).schema_arrow.names


def _risk_sentence(s: dict[str, Any], risk: Sequence[LabelRef]) -> dict[str, Any] | None:
    """A sentence as the review lists it when it has one of the ``risk`` labels: its
    label (the risk labels it has, ``NAME.label`` for an extra head's) and their summed
    probability as its score; None when it has none."""
    hits = [ref for ref in risk if s.get(ref.label_column) == ref.label]
    if not hits:
        return None
    score = sum(s[ref.score_column] or 0.0 for ref in hits)
    return {**s, LABEL: ", ".join(map(str, hits)), SCORE: round(score, 6)}


def _sentences_of(
    tables: RunTables, ids: list[str], risk: Sequence[LabelRef] = ()
) -> dict[str, list[dict]]:
    """The sentences of ``ids`` in the run, by document, in order (one filtered scan),
    with the columns of the ``risk`` labels' heads."""
    columns = [DOC_ID, SENT_INDEX, TEXT, *label_columns(risk)]
    if _has_column(tables, "sentences", PAGE):  # runs written before pages lack it
        columns.append(PAGE)
    table = tables.read("sentences", columns, ids)
    if table is None:
        return {}
    table = table.sort_by([(DOC_ID, "ascending"), (SENT_INDEX, "ascending")])
    out: dict[str, list[dict]] = {}
    for r in table.to_pylist():
        r[SCORE] = None if r[SCORE] is None else round(float(r[SCORE]), 6)  # null: unlabelled
        out.setdefault(r.pop(DOC_ID), []).append(r)
    return out


def review_sections(
    tables: RunTables, ranked: pa.Table, risk: Sequence[LabelRef], top_n: int
) -> dict[str, Any]:
    """The report's ``review`` (the first :data:`REVIEW_JSON_MAX` ranked documents with
    their top risk sentences: those with one of the ``risk`` labels, by their probability),
    ``review_total`` and ``drilldown`` (every sentence of the first ``top_n`` documents, at
    most :data:`DRILL_SENTENCES` each)."""
    head = ranked.slice(0, REVIEW_JSON_MAX).to_pylist()
    sents = _sentences_of(tables, [r[DOC_ID] for r in head], risk)
    review, drill = [], []
    for r in head:
        mine = sents.get(r[DOC_ID], [])
        risky = [x for s in mine if (x := _risk_sentence(s, risk)) is not None]
        risky.sort(key=lambda s: (-s[SCORE], s[SENT_INDEX]))
        review.append(
            {
                "rank": r["rank"],
                "doc_id": r[DOC_ID],
                "status": r["status"],
                "risk_score": round(r["risk_score"], 6),
                "risk_mass": round(r["risk_mass"], 6),
                "risk_sentences": r["risk_sentences"],
                "n_sentences": r["sentences"],
                "doc_status": r["doc_status"],
                "sentences": risky[:REVIEW_SENTENCES],
            }
        )
        if r["rank"] <= top_n:
            drill.append({"doc_id": r[DOC_ID], "rank": r["rank"],
                          "sentences": mine[:DRILL_SENTENCES],
                          "more": max(0, len(mine) - DRILL_SENTENCES)})  # fmt: skip
    return {"review": review, "review_total": ranked.num_rows, "drilldown": drill}


def review_csv(ranked: pa.Table, review: list[dict[str, Any]]) -> bytes:
    """review.csv: every ranked document; the top risk sentence where report.json has it."""
    top = {r["doc_id"]: r["sentences"][0]["text"] for r in review if r["sentences"]}
    text = pa.array([top.get(d) for d in ranked[DOC_ID].to_pylist()], pa.string())
    return table_csv(ranked.drop_columns(["doc_status"]).append_column("top_risk_sentence", text))


def changes_csv(changes: dict[str, Any]) -> bytes:
    """changes.csv: doc_id, change (new / changed / removed), every document of the night."""
    rows = [(d, "new") for d in changes.get("new", [])]
    rows += [(c["doc_id"], "changed") for c in changes.get("changed", [])]
    rows += [(d, "removed") for d in changes.get("removed", [])]
    table = pa.table(
        {DOC_ID: pa.array([r[0] for r in rows], pa.string()),
         "change": pa.array([r[1] for r in rows], pa.string())}
    )  # fmt: skip
    return table_csv(table)


def table_csv(table: pa.Table) -> bytes:
    """The table as CSV, every string cell through :func:`csv_cell` (never a formula)."""
    cols = [
        pa.array([None if v is None else csv_cell(v) for v in col.to_pylist()], pa.string())
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
        else col
        for col in table.columns
    ]
    buf = io.BytesIO()
    pacsv.write_csv(pa.table(cols, names=table.column_names), buf)
    return buf.getvalue()
