"""Watch-listed names next to bad news: the report's ``entities`` (the adverse-media review).

A run screened against watch lists (the ``entities`` stage, ``docintel run --watch-list``)
has a ``sentences.entities`` column: per sentence, a list of structs (``entity_id``,
``name``, ``list``, ``type``, ``match``, ``start``, ``end``, ``similarity``). A run without
lists has no such column; its report has no "Watch-listed names" section and its
``entities`` key is an empty list.

With R the risk labels (``[audit] risk_label`` or ``risk_labels``, of any head:
``NAME.label``) and p a sentence's score (the probability of the risk labels it has, each
of its own head), an entity (one ``entity_id`` of one list) is ranked by its **risk
score**::

    E = sum of p over the night's sentences labelled R that name the entity

each such sentence counted once, however often it names the entity: the expected number
of risk sentences about it. Ties are broken by the number of those sentences, then by list
and id. ``documents`` counts the documents they are in.

A **new mention** is a risk sentence naming the entity in a document that is new tonight,
or one added to a changed document (its text is not in the document's previous version:
the audit's sentence diff, ``changes.changed[].added``; a changed document beyond the
diff's ``detail_max`` counts all its risk sentences as new). A reprocessed document (its
text unchanged, a model changed) adds none. ``previous_risk_sentences`` is the entity's
count in the previous audit's report (0 when that report screened and did not list it;
null when unknown: no earlier audit, one that did not screen, or one whose capped list may
have left it out).

Memory: one pass, shared with aggregate.py's, keeps per (entity, document) a few numbers
and per entity its :data:`ENTITY_SENTENCES` highest-scoring risk sentences as references
(doc id, sentence index, score, span), never their text; a second, filtered read takes
the text of the sentences of the first :data:`ENTITIES_JSON_MAX` entities only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from docintel.pipeline.labels import LabelRef, risk_of
from docintel.pipeline.output.tables import RunTables
from docintel.pipeline.report.review import table_csv
from docintel.pipeline.schema import DOC_ID, ENTITIES, SCORE, SENT_INDEX, TEXT

ENTITIES_CSV = "entities.csv"
ENTITIES_JSON_MAX = 1000  # ranked entities listed in report.json (entities.csv has all)
ENTITY_SENTENCES = 10  # risk sentences per entity in report.json and the drill-down
COMPACT_EVERY = 64  # per-batch partial results merged after this many batches

LIST, ENTITY_ID, NAME, TYPE, START, END = "list", "entity_id", "name", "type", "start", "end"
ENTITY_KEY = [LIST, ENTITY_ID]
_PAIR_KEYS = [LIST, ENTITY_ID, NAME, TYPE, DOC_ID]
_TOP_SORT = [(LIST, "ascending"), (ENTITY_ID, "ascending"), (SCORE, "descending"),
             (DOC_ID, "ascending"), (SENT_INDEX, "ascending")]  # fmt: skip
_RANK_SORT = [("risk_score", "descending"), ("risk_sentences", "descending"),
              (LIST, "ascending"), (ENTITY_ID, "ascending")]  # fmt: skip


def screened(tables: RunTables) -> bool:
    """Whether the run's sentences have the ``entities`` column (in every data file; a
    run with no sentence file has nothing to screen)."""
    import pyarrow.parquet as pq

    parts = tables.parts("sentences")
    if not parts:
        return False
    for part in parts:
        with part.opener() as f:
            if ENTITIES not in pq.ParquetFile(f).schema_arrow.names:
                return False
    return True


class EntityRisk:
    """The night's risk sentences per listed entity, summed batch by batch
    (:meth:`add`, fed by aggregate.py's pass over sentences/), then ranked (:meth:`result`)."""

    def __init__(self, risk: Sequence[LabelRef], changes: dict[str, Any] | None) -> None:
        self.risk = list(risk)  # the risk labels, of any head
        self.risk_label = ", ".join(map(str, self.risk))
        self.known = changes is not None  # without the audit's changes, "new" is unknown
        ch = changes or {}
        self.added = {c["doc_id"]: set(c["added"]) for c in ch.get("changed", []) if "added" in c}
        undetailed = [c["doc_id"] for c in ch.get("changed", []) if "added" not in c]
        self.all_new = pa.array([*ch.get("new", []), *undetailed], pa.string())
        self.pairs: list[pa.Table] = []  # per (entity, document): mass, n, new
        self.top: list[pa.Table] = []  # per entity: its best sentences, as references

    def add(self, b: pa.RecordBatch) -> None:
        mentions = self._mentions(b)
        if mentions is None:
            return
        self.pairs.append(_pair_sums(mentions))
        self.top.append(mentions.drop_columns([NAME, TYPE, "new"]))
        if len(self.pairs) >= COMPACT_EVERY:
            self.pairs = [_pair_sums(pa.concat_tables(self.pairs))]
            self.top = [_top_per_entity(pa.concat_tables(self.top))]

    def _mentions(self, b: pa.RecordBatch) -> pa.Table | None:
        """One row per (risk sentence, entity it names) of the batch; None when none."""
        ents = b.column(ENTITIES)
        named = pc.fill_null(pc.greater(pc.list_value_length(ents), 0), False)
        risky, mass = risk_of(b, self.risk)
        keep = pc.and_(pa.array(risky), named)
        rb = b.filter(keep)
        if rb.num_rows == 0:
            return None
        score = pa.array(mass).filter(keep)  # its risk labels' probability
        parents = pc.list_parent_indices(rb.column(ENTITIES))
        flat = pc.list_flatten(rb.column(ENTITIES))
        valid = pc.is_valid(flat)
        flat, parents = flat.filter(valid), parents.filter(valid)
        rows = pa.table(
            {
                LIST: pc.fill_null(flat.field(LIST), ""),
                ENTITY_ID: pc.fill_null(flat.field(ENTITY_ID), ""),
                NAME: flat.field(NAME),
                TYPE: flat.field(TYPE),
                DOC_ID: rb.column(DOC_ID).take(parents),
                SENT_INDEX: pc.cast(rb.column(SENT_INDEX).take(parents), pa.int32()),
                SCORE: score.take(parents),
                "new": self._new(rb).take(parents),
                START: pc.cast(flat.field(START), pa.int64()),
                END: pc.cast(flat.field(END), pa.int64()),
            }
        )
        # A sentence naming the entity twice counts once; its first match is kept (the
        # matches of one sentence do not overlap, so the least start and end are one).
        keys = [LIST, ENTITY_ID, NAME, TYPE, DOC_ID, SENT_INDEX]
        aggs = [(SCORE, "max"), ("new", "max"), (START, "min"), (END, "min")]
        once = rows.group_by(keys, use_threads=False).aggregate(aggs)
        return once.rename_columns([*keys, SCORE, "new", START, END]).select(
            list(rows.schema.names)
        )

    def _new(self, rb: pa.RecordBatch) -> pa.Array:
        """Per risk sentence of the batch: 1 when it is new tonight (module docstring)."""
        flags = pc.fill_null(pc.is_in(rb.column(DOC_ID), value_set=self.all_new), False)
        out = np.array(flags.to_numpy(zero_copy_only=False), dtype=np.int64)
        if self.added:
            docs = rb.column(DOC_ID).to_pylist()
            in_changed = [i for i, d in enumerate(docs) if d in self.added]
            texts = rb.column(TEXT).take(pa.array(in_changed, pa.int64())).to_pylist()
            for i, text in zip(in_changed, texts, strict=True):
                out[i] = int(text in self.added[docs[i]])
        return pa.array(out, pa.int64())

    def ranked(self) -> pa.Table:
        """Every entity named in a risk sentence, best first: rank, list, entity_id, name,
        type, risk_score, risk_sentences, documents, new_mentions (null when unknown)."""
        if not self.pairs:
            return _EMPTY_RANKED
        pairs = _pair_sums(pa.concat_tables(self.pairs))
        keys = [LIST, ENTITY_ID, NAME, TYPE]
        aggs = [("mass", "sum"), ("n", "sum"), (DOC_ID, "count"), ("new", "sum")]
        t = pairs.group_by(keys, use_threads=False).aggregate(aggs)
        t = t.rename_columns([*keys, "risk_score", "risk_sentences", "documents", "new_mentions"])
        if not self.known:
            t = t.set_column(7, "new_mentions", pa.nulls(t.num_rows, pa.int64()))
        t = t.sort_by(_RANK_SORT)
        return t.add_column(0, "rank", pa.array(range(1, t.num_rows + 1), pa.int64()))

    def result(self, tables: RunTables, previous: dict[str, Any] | None) -> dict[str, Any]:
        """The report's ``entities`` (the first :data:`ENTITIES_JSON_MAX` ranked, each with
        its risk sentences), ``entities_total``, ``_entities_ranked`` (all of them, for
        entities.csv) and, with the audit's changes, ``_entity_changes`` (merged into the
        report's ``changes``); the ``_`` keys never reach report.json."""
        ranked = self.ranked()
        head = ranked.slice(0, ENTITIES_JSON_MAX)
        top = pa.concat_tables(self.top) if self.top else None
        refs = _refs_of(head, top)
        texts = _texts(tables, refs)
        before = _previous_counts(previous)
        entities = []
        for r in head.to_pylist():
            key = (r[LIST], r[ENTITY_ID])
            sents = [
                {"doc_id": s[DOC_ID], "sent_index": s[SENT_INDEX],
                 "text": texts.get((s[DOC_ID], s[SENT_INDEX]), ""), "label": self.risk_label,
                 "score": round(s[SCORE], 6), START: s[START], END: s[END]}
                for s in refs.get(key, [])
            ]  # fmt: skip
            entities.append(
                {**{k: r[k] for k in ("rank", ENTITY_ID, NAME, LIST, TYPE)},
                 "risk_score": round(r["risk_score"], 6), "risk_sentences": r["risk_sentences"],
                 "documents": r["documents"], "new_mentions": r["new_mentions"],
                 "previous_risk_sentences": before(key), "sentences": sents}
            )  # fmt: skip
        out = {
            ENTITIES: entities,
            "entities_total": ranked.num_rows,
            "entities_screened": True,
            "_entities_ranked": ranked,
        }
        if self.known:
            total_new = int(pc.sum(pc.greater(ranked["new_mentions"], 0)).as_py() or 0)
            out["_entity_changes"] = entity_changes(entities, total_new)
        return out


_EMPTY_RANKED = pa.table(
    {
        "rank": pa.array([], pa.int64()),
        LIST: pa.array([], pa.string()),
        ENTITY_ID: pa.array([], pa.string()),
        NAME: pa.array([], pa.string()),
        TYPE: pa.array([], pa.string()),
        "risk_score": pa.array([], pa.float64()),
        "risk_sentences": pa.array([], pa.int64()),
        "documents": pa.array([], pa.int64()),
        "new_mentions": pa.array([], pa.int64()),
    }
)


def _pair_sums(t: pa.Table) -> pa.Table:
    """Per (entity, document): summed score ``mass``, sentences ``n``, new ones ``new``
    (from mention rows, or from earlier sums: both have the columns summed here)."""
    if "mass" not in t.column_names:
        t = t.append_column("mass", t[SCORE]).append_column(
            "n", pa.array(np.ones(t.num_rows, np.int64))
        )
    t = t.select([*_PAIR_KEYS, "mass", "n", "new"])
    out = t.group_by(_PAIR_KEYS, use_threads=False).aggregate(
        [("mass", "sum"), ("n", "sum"), ("new", "sum")]
    )
    return out.rename_columns([*_PAIR_KEYS, "mass", "n", "new"])


def _group_position(t: pa.Table, keys: list[str]) -> np.ndarray:
    """Each row's position within its run of equal ``keys`` (``t`` sorted by them)."""
    n = t.num_rows
    change = np.zeros(n, dtype=bool)
    if n:
        change[0] = True
    for k in keys:
        codes = pc.dictionary_encode(t[k].combine_chunks()).indices.to_numpy()
        change[1:] |= codes[1:] != codes[:-1]
    idx = np.arange(n)
    return idx - np.maximum.accumulate(np.where(change, idx, 0))


def _top_per_entity(t: pa.Table) -> pa.Table:
    """Each entity's :data:`ENTITY_SENTENCES` best risk sentences (score, then id)."""
    t = t.sort_by(_TOP_SORT)
    return t.filter(pa.array(_group_position(t, ENTITY_KEY) < ENTITY_SENTENCES))


def _refs_of(head: pa.Table, top: pa.Table | None) -> dict[tuple[str, str], list[dict]]:
    """The best sentence references of the entities in ``head``, by (list, entity_id)."""
    if top is None or head.num_rows == 0:
        return {}
    best = _top_per_entity(top.join(head.select(ENTITY_KEY), keys=ENTITY_KEY, join_type="inner"))
    out: dict[tuple[str, str], list[dict]] = {}
    for r in best.to_pylist():
        out.setdefault((r[LIST], r[ENTITY_ID]), []).append(r)
    return out


def _texts(tables: RunTables, refs: dict[tuple[str, str], list[dict]]) -> dict[tuple, str]:
    """The text of every referenced sentence: one filtered read of their documents."""
    wanted = {(s[DOC_ID], s[SENT_INDEX]) for rows in refs.values() for s in rows}
    table = tables.read("sentences", [DOC_ID, SENT_INDEX, TEXT], sorted({d for d, _ in wanted}))
    if table is None:
        return {}
    rows = zip(*(table[c].to_pylist() for c in (DOC_ID, SENT_INDEX, TEXT)), strict=True)
    return {(d, i): text for d, i, text in rows if (d, i) in wanted}


Previous = Callable[[tuple[str, str]], "int | None"]


def _previous_counts(previous: dict[str, Any] | None) -> Previous:
    """A function (list, entity_id) -> the entity's risk sentences in the previous audit's
    report: 0 when it screened and did not list it, None when that is unknown."""
    if previous is None or ENTITIES not in previous:
        return lambda _key: None
    if previous.get("ran") and not previous.get("entities_screened"):
        return lambda _key: None  # that night's run was not screened
    listed = previous[ENTITIES]
    counts = {(e[LIST], e[ENTITY_ID]): int(e["risk_sentences"]) for e in listed}
    complete = int(previous.get("entities_total", len(listed))) <= len(listed)
    return lambda key: counts.get(key, 0 if complete else None)


def entity_changes(entities: list[dict[str, Any]], total_new: int) -> dict[str, Any]:
    """The changes' ``entities``: the listed entities with new mentions tonight, most new
    mentions first, and how many there are in all (``entities_total``)."""
    new = [e for e in entities if e["new_mentions"]]
    new.sort(key=lambda e: (-e["new_mentions"], e["rank"]))
    keys = ("rank", ENTITY_ID, NAME, LIST, "new_mentions", "risk_sentences",
            "previous_risk_sentences")  # fmt: skip
    return {ENTITIES: [{k: e[k] for k in keys} for e in new], "entities_total": total_new}


def no_entities() -> dict[str, Any]:
    """A report without screening: the key is there, empty."""
    return {ENTITIES: [], "entities_total": 0, "entities_screened": False}


def entities_csv(ranked: pa.Table, entities: list[dict[str, Any]]) -> bytes:
    """entities.csv: every ranked entity; its top risk sentence where report.json has it."""
    top = {(e[LIST], e[ENTITY_ID]): e["sentences"][0]["text"] for e in entities if e["sentences"]}
    keys = zip(ranked[LIST].to_pylist(), ranked[ENTITY_ID].to_pylist(), strict=True)
    text = pa.array([top.get(k) for k in keys], pa.string())
    return table_csv(ranked.append_column("top_risk_sentence", text))
