"""What changed tonight, document by document: the ids of the new, changed and removed
documents (from the doc index before and after the night), and for a changed document the
sentences added and removed since its previous version (matched by sentence text).

The previous version of a changed document is in the run of the night that last processed
it: the old index's ``processed_date`` (its partition, or its snapshots of the Iceberg
tables; tables.py). Only the changed documents' sentences are read (a filtered scan of
that night's sentences and of tonight's), so memory grows
with the number of changed documents, never with the corpus; the sentence diff is computed
for the first :data:`DETAIL_MAX` changed documents (by id), their ids are all listed.

For a run screened against watch lists, the report adds ``entities`` to these changes: the
listed names in tonight's new risk sentences (those of new documents and the ``added``
sentences of changed ones), counted in the same pass as the rest of its figures
(pipeline/report/entities.py), so no table is read again here.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from docintel.pipeline.audit.state import CONTENT_HASH, PROCESSED_DATE
from docintel.pipeline.audit.tables import NightTables
from docintel.pipeline.output.tables import RunTables
from docintel.pipeline.schema import DOC_ID, LABEL, SCORE, SENT_INDEX, TEXT

NEW, CHANGED, REMOVED, REPROCESSED = "new", "changed", "removed", "reprocessed"
CHANGE = "change"
PREVIOUS_DATE = "previous_date"
DETAIL_MAX = 1000  # changed documents whose added/removed sentences are worked out
SENTENCE_COLUMNS = [DOC_ID, SENT_INDEX, TEXT, LABEL, SCORE]


def diff_index(old: pa.Table, new: pa.Table, day: str) -> pa.Table:
    """One row per document that is new, changed, removed or reprocessed tonight:
    ``doc_id``, ``change`` and ``previous_date`` (the night that processed its previous
    version; null for a new document), sorted by id. Unchanged documents are left out."""
    left = new.select([DOC_ID, CONTENT_HASH, PROCESSED_DATE])
    right = old.select([DOC_ID, CONTENT_HASH, PROCESSED_DATE]).rename_columns(
        [DOC_ID, "old_hash", PREVIOUS_DATE]
    )
    j = left.join(right, keys=DOC_ID, join_type="full outer")
    today = pa.scalar(dt.date.fromisoformat(day), pa.date32())
    is_new = pc.is_null(j["old_hash"])
    removed = pc.is_null(j[CONTENT_HASH])
    both = pc.invert(pc.or_(is_new, removed))
    changed = pc.and_(both, pc.not_equal(j[CONTENT_HASH], j["old_hash"]))
    redone = pc.and_(
        pc.and_(both, pc.invert(changed)),
        pc.and_(pc.equal(j[PROCESSED_DATE], today), pc.not_equal(j[PREVIOUS_DATE], today)),
    )
    kind = pc.case_when(
        pc.make_struct(is_new, removed, changed, redone),
        NEW,
        REMOVED,
        CHANGED,
        REPROCESSED,
    )
    out = pa.table({DOC_ID: j[DOC_ID], CHANGE: kind, PREVIOUS_DATE: j[PREVIOUS_DATE]})
    return out.filter(pc.is_valid(out[CHANGE])).sort_by(DOC_ID)


def _ids(diff: pa.Table, kind: str) -> list[str]:
    return diff.filter(pc.equal(diff[CHANGE], kind))[DOC_ID].to_pylist()


def read_sentences(tables: RunTables, ids: list[str]) -> pa.Table:
    """The sentences of ``ids`` in a night's run (empty when it has none)."""
    table = tables.read("sentences", SENTENCE_COLUMNS, ids)
    if table is None:
        return pa.table({c: pa.array([], t) for c, t in _SENTENCE_TYPES.items()})
    return table.cast(pa.schema([(c, _SENTENCE_TYPES[c]) for c in SENTENCE_COLUMNS]))


_SENTENCE_TYPES = {
    DOC_ID: pa.string(),
    SENT_INDEX: pa.int32(),
    TEXT: pa.string(),
    LABEL: pa.string(),
    SCORE: pa.float32(),
}


def _by_doc(table: pa.Table) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in table.sort_by([(DOC_ID, "ascending"), (SENT_INDEX, "ascending")]).to_pylist():
        out.setdefault(r[DOC_ID], []).append(r)
    return out


def _rounded(score: float | None) -> float | None:
    """A sentence's score for the report (null: unlabelled, a language the model was not
    trained on)."""
    return None if score is None else round(float(score), 6)


def _minus(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sentences of ``a`` whose text ``b`` does not hold (as many times), in order."""
    left = Counter(s[TEXT] for s in b)
    out = []
    for s in a:
        if left[s[TEXT]]:
            left[s[TEXT]] -= 1
        else:
            out.append({"text": s[TEXT], "label": s[LABEL], "score": _rounded(s[SCORE])})
    return out


def _sentence_diffs(night: NightTables, day: str, changed: pa.Table) -> list[dict[str, Any]]:
    """Added and removed sentences of each changed document (``changed``: doc_id and
    previous_date), tonight's version against the previous one."""
    ids = changed[DOC_ID].to_pylist()
    now = _by_doc(read_sentences(night(day), ids))
    before: dict[str, list[dict[str, Any]]] = {}
    for prev in pc.unique(changed[PREVIOUS_DATE]).to_pylist():
        rows = changed.filter(pc.equal(changed[PREVIOUS_DATE], prev))
        before.update(_by_doc(read_sentences(night(prev.isoformat()), rows[DOC_ID].to_pylist())))
    out = []
    for doc, prev in zip(ids, changed[PREVIOUS_DATE].to_pylist(), strict=True):
        added = _minus(now.get(doc, []), before.get(doc, []))
        removed = _minus(before.get(doc, []), now.get(doc, []))
        out.append(
            {
                "doc_id": doc,
                "previous_date": prev.isoformat(),
                "added": [s["text"] for s in added],
                "removed": [s["text"] for s in removed],
                "added_detail": added,
                "removed_detail": removed,
            }
        )
    return out


def describe_changes(night: NightTables, day: str, diff: pa.Table) -> dict[str, Any]:
    """The report's ``changes``: every new, changed and removed id; for the first
    :data:`DETAIL_MAX` changed documents, their added and removed sentences."""
    changed = diff.filter(pc.equal(diff[CHANGE], CHANGED))
    detailed = _sentence_diffs(night, day, changed.slice(0, DETAIL_MAX))
    rest = [{"doc_id": d} for d in changed[DOC_ID].to_pylist()[DETAIL_MAX:]]
    return {
        "new": _ids(diff, NEW),
        "changed": detailed + rest,
        "removed": _ids(diff, REMOVED),
        "reprocessed": len(_ids(diff, REPROCESSED)),
        "detail_max": DETAIL_MAX,
    }
