"""The report's watch-listed names (pipeline/report/entities.py, entity_sections.py) on real
Parquet runs written here with the entities stage's column (``sentences.entities``: a list
of match structs), and on the same runs without it.

Expected rankings are recomputed here with pandas over the written tables (explode the
matches, keep the risk sentences, one row per sentence and entity, sum the scores), not
with the report's own helpers.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from docintel.pipeline.report import aggregate, write_report
from docintel.pipeline.report import entities as entities_mod
from docintel.pipeline.schema import (
    ENTITIES,
    ENTITIES_TYPE,
    ERRORS_SCHEMA,
    documents_schema,
    label_count_column,
    sentences_schema,
)
from tests.unit.test_report import LABELS, RISK, STAGES, audit_dict

# The entities stage's column, as the stage types it: one match struct each, [] for none.
ENTITIES_FIELD = pa.field(ENTITIES, ENTITIES_TYPE)

ACME = ("E1", "Acme Corporation", "sanctions", "organisation")
GLOBEX = ("P7", "Globex", "peps", "organisation")
HOOLI = ("P8", "Hooli", "peps", "organisation")
INITECH = ("I1", "Initech", "clients", "organisation")
UMBRELLA = ("U1", "Umbrella", "clients", "organisation")
VANDELAY = ("V1", "Vandelay Industries", "clients", "organisation")
EVIL_NAME = "<img src=x onerror=alert(1)>\u202eEvil"
EVIL = ("H1", EVIL_NAME, "clients<b>", "person")
EVIL_TEXT = f"<script>alert(1)</script> {EVIL_NAME} collapses & flees"

Sentence = tuple[str, str, float, list[tuple[tuple[str, str, str, str], str]]]

NIGHT_ONE: dict[str, list[Sentence]] = {
    "d1": [
        ("Acme Corp faces a fraud probe.", RISK, 0.9, [(ACME, "Acme Corp")]),
        ("Acme Corp's shares fell; Acme Corp denies it.", RISK, 0.8,
         [(ACME, "Acme Corp"), (ACME, "Acme Corp")]),
        ("Initech reports growth.", "Bullish", 0.7, [(INITECH, "Initech")]),
    ],
    "d2": [
        ("Globex sued over a spill.", RISK, 0.6, [(GLOBEX, "Globex")]),
        ("Acme Corp partners with Globex.", "Neutral", 0.5,
         [(ACME, "Acme Corp"), (GLOBEX, "Globex")]),
    ],
    "d3": [(EVIL_TEXT, RISK, 0.95, [(EVIL, EVIL_NAME)]), ("Nothing here.", RISK, 0.4, [])],
    "d4": [("Hooli misses its targets.", RISK, 0.6, [(HOOLI, "Hooli")]),
           ("Vandelay Industries warns.", RISK, 0.4, [(VANDELAY, "Vandelay Industries")]),
           ("Vandelay's debt grows.", RISK, 0.35, [(VANDELAY, "Vandelay")])],
}  # fmt: skip
ADDED = "Acme Corp fined over sanctions breaches."
NIGHT_TWO: dict[str, list[Sentence]] = {
    "d1": [NIGHT_ONE["d1"][0], (ADDED, RISK, 0.85, [(ACME, "Acme Corp")])],  # changed
    "d5": [("Umbrella and Globex face a recall.", RISK, 0.7,
            [(UMBRELLA, "Umbrella"), (GLOBEX, "Globex")])],  # new
    "d6": [("Hooli cuts jobs.", RISK, 0.5, [(HOOLI, "Hooli")])],  # reprocessed
}  # fmt: skip


def _match(ref: tuple[tuple[str, str, str, str], str], text: str, after: int) -> dict:
    """The match struct of ``ref`` (entity, matched text) at its first place from ``after``."""
    (eid, name, lst, kind), found = ref
    start = text.index(found, after)
    return {"entity_id": eid, "name": name, "list": lst, "type": kind, "match": found,
            "start": start, "end": start + len(found), "similarity": 1.0}  # fmt: skip


def _sentence_rows(doc_id: str, sents: list[Sentence], screened: bool) -> list[dict]:
    rows = []
    for j, (text, label, score, refs) in enumerate(sents):
        matches: list[dict] = []
        ends: dict[str, int] = {}  # a name matched twice: the second after the first
        for ref in refs:
            matches.append(_match(ref, text, ends.get(ref[1], 0)))
            ends[ref[1]] = matches[-1]["end"]
        row = {
            "doc_id": doc_id, "sent_index": j, "start_char": 0, "end_char": len(text),
            "text": text, "label": label, "score": score, "n_tokens": len(text.split()),
            "truncated": False, **{f"{s}_backend": "cpu-fp32" for s in STAGES},
            **{f"{s}_model": f"{s}-v1" for s in STAGES},
        }  # fmt: skip
        if screened:
            row["entities"] = matches
        rows.append(row)
    return rows


def write_night(root: Path, docs: dict[str, list[Sentence]], screened: bool = True) -> None:
    """A committed run in ``root``: one part per document (so several record batches),
    the sentences with the ``entities`` column when ``screened``."""
    extra = [ENTITIES_FIELD] if screened else []
    for table in ("documents", "sentences", "errors"):
        (root / table).mkdir(parents=True, exist_ok=True)
    for k, (doc_id, sents) in enumerate(docs.items()):
        batch = f"b{k:03d}"
        labels = [s[1] for s in sents]
        doc = {
            "doc_id": doc_id, "status": "ok", "source_format": "txt",
            "n_sentences": len(sents), "n_truncated": 0, "top_label": labels[0],
            "top_score": 0.7, "batch_id": batch,
            **{label_count_column(lb): labels.count(lb) for lb in LABELS},
        }  # fmt: skip
        sent_table = pa.Table.from_pylist(
            _sentence_rows(doc_id, sents, screened), schema=sentences_schema(None, STAGES, extra)
        )
        for name, t in (
            ("documents", pa.Table.from_pylist([doc], schema=documents_schema(LABELS))),
            ("sentences", sent_table),
            ("errors", ERRORS_SCHEMA.empty_table()),
        ):
            pq.write_table(t, root / name / f"part-{batch}.parquet")
    manifest = {"run_id": root.name, "labels": LABELS, "timings": {}, "backends": {}}
    (root / "_manifest.json").write_text(json.dumps(manifest))


def report_of(
    root: Path, changes: dict[str, Any] | None = None, history: list[dict] | None = None
) -> dict[str, Any]:
    audit = audit_dict(root.name.removeprefix("run_date="))
    if changes is not None:
        audit["changes"] = changes
    return write_report(pafs.LocalFileSystem(), str(root), audit, history or [], RISK, 3)


def expected_ranking(root: Path) -> pd.DataFrame:
    """Per (list, entity_id): summed score of its risk sentences, each sentence once."""
    s = pd.read_parquet(root / "sentences", columns=["doc_id", "sent_index", "label", "score",
                                                      "entities"])  # fmt: skip
    s = s[s.label == RISK].explode("entities").dropna(subset=["entities"])
    s["list"] = [m["list"] for m in s.entities]
    s["entity_id"] = [m["entity_id"] for m in s.entities]
    s = s.drop_duplicates(["list", "entity_id", "doc_id", "sent_index"])
    g = s.groupby(["list", "entity_id"]).agg(
        risk_score=("score", "sum"),
        risk_sentences=("score", "size"),
        documents=("doc_id", "nunique"),
    )
    g = g.reset_index().sort_values(
        ["risk_score", "risk_sentences", "list", "entity_id"], ascending=[False, False, True, True]
    )
    return g.reset_index(drop=True)


@pytest.fixture
def night_one(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    root = tmp_path / "run_date=2026-03-01"
    write_night(root, NIGHT_ONE)
    changes = {"new": list(NIGHT_ONE), "changed": [], "removed": [], "reprocessed": 0}
    return root, report_of(root, changes)


def test_entities_ranked_by_risk_score(night_one: tuple[Path, dict[str, Any]]) -> None:
    root, rep = night_one
    want = expected_ranking(root)
    got = rep["entities"]
    assert [(e["list"], e["entity_id"]) for e in got] == list(
        zip(want.list, want.entity_id, strict=True)
    )
    assert [e["entity_id"] for e in got] == ["E1", "H1", "V1", "P7", "P8"]  # P7/P8 tie: by id
    assert [e["risk_score"] for e in got] == pytest.approx(want.risk_score.tolist(), abs=1e-5)
    assert [e["risk_sentences"] for e in got] == want.risk_sentences.tolist()
    assert [e["documents"] for e in got] == want.documents.tolist()
    assert [e["rank"] for e in got] == [1, 2, 3, 4, 5]
    assert rep["entities_total"] == 5 and rep["entities_screened"] is True
    assert "I1" not in {e["entity_id"] for e in got}  # named only outside risk sentences
    acme = got[0]
    assert acme["risk_sentences"] == 2  # the sentence naming it twice counts once
    assert [e["new_mentions"] for e in got] == [2, 1, 2, 1, 1]  # all documents new
    assert all(e["previous_risk_sentences"] is None for e in got)  # no earlier audit


def test_report_json_shape(night_one: tuple[Path, dict[str, Any]]) -> None:
    root, rep = night_one
    on_disk = json.loads((root / "report.json").read_text())
    assert on_disk == rep and "_entities_ranked" not in on_disk
    sents = pd.read_parquet(root / "sentences").set_index(["doc_id", "sent_index"])
    for e in rep["entities"]:
        assert {"entity_id", "name", "list", "risk_sentences", "sentences"} <= set(e)
        assert len(e["sentences"]) == e["risk_sentences"]  # all, under the cap
        scores = [s["score"] for s in e["sentences"]]
        assert scores == sorted(scores, reverse=True)
        for s in e["sentences"]:
            assert {"doc_id", "sent_index", "text", "label", "score"} <= set(s)
            row = sents.loc[(s["doc_id"], s["sent_index"])]
            assert s["text"] == row.text and s["label"] == RISK == row.label
            assert s["score"] == pytest.approx(row.score, abs=1e-6)
            assert s["text"][s["start"] : s["end"]] in {m["match"] for m in row.entities}
    assert rep["entities"][0]["name"] == "Acme Corporation"
    rows = list(csv.DictReader(io.StringIO((root / "entities.csv").read_text())))
    assert [r["entity_id"] for r in rows] == ["E1", "H1", "V1", "P7", "P8"]
    assert rows[0]["top_risk_sentence"] == "Acme Corp faces a fraud probe."


def test_section_and_drilldown_on_the_page(night_one: tuple[Path, dict[str, Any]]) -> None:
    root, _ = night_one
    page = (root / "report.html").read_text()
    assert 'id="entities"' in page and "Watch-listed names" in page
    section = page[page.index('id="entities-table"') : page.index("</table>", page.index(
        'id="entities-table"'))]  # fmt: skip
    # ranked order on the page, and each shown name linked to its drill-down
    assert section.index("Acme Corporation") < section.index("Evil") < section.index("Vandelay")
    assert "Globex" not in section  # top_n = 3 shown; report.json has them all
    for rank in (1, 2, 3):
        assert f'href="#entity-{rank}"' in page and f'id="entity-{rank}"' in page
    assert 'id="entity-4"' not in page
    drill = page[page.index('id="entity-1"') : page.index('id="entity-2"')]
    assert drill.count("<mark>Acme Corp</mark>") == 2 and drill.count("<tr>") == 1 + 2
    assert 'id="changes-entities"' in page  # the new mentions, in what changed tonight


def test_hostile_names_and_sentences_are_escaped(night_one: tuple[Path, dict[str, Any]]) -> None:
    root, _ = night_one
    page = (root / "report.html").read_text()
    assert "<script" not in page.lower() and "<img" not in page.lower()
    assert "clients<b>" not in page and "clients&lt;b&gt;" in page
    assert "\u202e" not in page and "\\u202e" in page  # the bidi override made visible
    # the match is marked, escaped inside and out
    assert "<mark>&lt;img src=x onerror=alert(1)&gt;\\u202eEvil</mark> collapses &amp;" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; <mark>" in page
    text = (root / "report.json").read_text()
    assert "\u202e" not in text and "\\u202e" in text
    assert json.loads(text)["entities"][1]["name"] == EVIL_NAME  # the value kept exact
    assert "'=" not in (root / "entities.csv").read_text()


def test_two_nights_name_new_mentions(
    night_one: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _, first = night_one
    root = tmp_path / "run_date=2026-03-02"
    write_night(root, NIGHT_TWO)
    changed = {
        "doc_id": "d1", "previous_date": "2026-03-01", "added": [ADDED],
        "removed": [NIGHT_ONE["d1"][1][0]],
        "added_detail": [{"text": ADDED, "label": RISK, "score": 0.85}],
        "removed_detail": [{"text": NIGHT_ONE["d1"][1][0], "label": RISK, "score": 0.8}],
    }  # fmt: skip
    changes = {"new": ["d5"], "changed": [changed], "removed": ["d2"], "reprocessed": 1}
    rep = report_of(root, changes, [first])
    by_id = {e["entity_id"]: e for e in rep["entities"]}
    assert set(by_id) == {"E1", "P7", "U1", "P8"}
    # d1 kept its fraud-probe sentence (not new) and gained the fine (new); d6 reprocessed
    assert by_id["E1"]["new_mentions"] == 1 and by_id["E1"]["risk_sentences"] == 2
    assert by_id["P8"]["new_mentions"] == 0
    assert (by_id["U1"]["new_mentions"], by_id["P7"]["new_mentions"]) == (1, 1)
    assert {k: by_id[k]["previous_risk_sentences"] for k in by_id} == {
        "E1": 2, "P7": 1, "U1": 0, "P8": 1
    }  # fmt: skip
    named = rep["changes"]["entities"]
    assert [e["entity_id"] for e in named] == ["E1", "U1", "P7"]  # new mentions, then rank
    assert rep["changes"]["entities_total"] == 3
    assert rep["changes"]["new"] == ["d5"]  # the audit's own changes kept
    page = (root / "report.html").read_text()
    para = page[page.index('id="changes-entities"') :].split("</p>", 1)[0]
    assert "+1 (last audit 2)" in para and "Umbrella" in para and "not named last audit" in para
    assert "Hooli" not in para


def test_run_without_the_column_has_no_section(tmp_path: Path) -> None:
    plain = tmp_path / "plain" / "run_date=2026-03-01"
    write_night(plain, NIGHT_ONE, screened=False)
    changes = {"new": list(NIGHT_ONE), "changed": [], "removed": [], "reprocessed": 0}
    rep = report_of(plain, changes)
    assert rep["entities"] == [] and rep["entities_screened"] is False
    assert "entities" not in rep["changes"]
    page = (plain / "report.html").read_text()
    assert 'id="entities"' not in page and 'id="entity-' not in page and "#entity-" not in page
    assert 'id="changes-entities"' not in page
    assert not (plain / "entities.csv").exists()
    assert json.loads((plain / "report.json").read_text())["entities"] == []
    # the rest of the report is the screened run's
    screened = tmp_path / "screened" / "run_date=2026-03-01"
    write_night(screened, NIGHT_ONE)
    other = report_of(screened, changes)
    for key in ("counts", "review", "top_risk", "label_distribution"):
        assert rep[key] == other[key]


def test_what_the_last_audit_said(tmp_path: Path, night_one: tuple[Path, dict[str, Any]]) -> None:
    first = night_one[1]
    idle = tmp_path / "run_date=2026-03-05"
    rep = write_report(
        pafs.LocalFileSystem(), str(idle), audit_dict("2026-03-05", ran=False), [first], RISK, 3
    )
    assert rep["entities"] == [] and 'id="entities"' not in (idle / "report.html").read_text()
    later = tmp_path / "run_date=2026-03-06"
    write_night(later, NIGHT_ONE)

    def previous(history: list[dict[str, Any]]) -> list[int | None]:
        got = report_of(later, None, history)
        assert "changes" not in got  # no audit changes given: new mentions unknown
        assert all(e["new_mentions"] is None for e in got["entities"])
        return [e["previous_risk_sentences"] for e in got["entities"]]

    assert previous([first]) == [2, 1, 2, 1, 1]
    assert previous([first, rep]) == [0] * 5  # nothing ran last night: none named
    assert previous([{**first, "entities": [], "entities_screened": False}]) == [None] * 5
    assert previous([{k: v for k, v in first.items() if not k.startswith("entit")}]) == [None] * 5
    capped = {**first, "entities": first["entities"][:1], "entities_total": 5}
    assert previous([capped]) == [2, None, None, None, None]  # beyond last night's cap: unknown


def test_caps_and_batch_by_batch_merging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = {
        f"x{i:02d}": [(f"Acme Corp warns, part {i}.", RISK, 0.5 + i / 100, [(ACME, "Acme Corp")]),
                      (f"Globex slips {i}.", RISK, 0.3, [(GLOBEX, "Globex")])]
        for i in range(12)
    }  # fmt: skip
    root = tmp_path / "run_date=2026-03-01"
    write_night(root, docs)
    whole = report_of(root)
    monkeypatch.setattr(entities_mod, "ENTITY_SENTENCES", 4)
    monkeypatch.setattr(entities_mod, "COMPACT_EVERY", 2)
    monkeypatch.setattr(aggregate, "READ_BATCH_ROWS", 1)  # one sentence per batch
    capped = report_of(root)
    acme = capped["entities"][0]
    assert acme["risk_sentences"] == 12 and len(acme["sentences"]) == 4
    assert [s["doc_id"] for s in acme["sentences"]] == ["x11", "x10", "x09", "x08"]
    strip = [{k: v for k, v in e.items() if k != "sentences"} for e in capped["entities"]]
    assert strip == [{k: v for k, v in e.items() if k != "sentences"} for e in whole["entities"]]
    assert whole["entities"][0]["sentences"][:4] == acme["sentences"]
    monkeypatch.setattr(entities_mod, "ENTITIES_JSON_MAX", 1)
    one = report_of(root)
    assert len(one["entities"]) == 1 and one["entities_total"] == 2
    rows = list(csv.DictReader(io.StringIO((root / "entities.csv").read_text())))
    assert len(rows) == 2 and rows[1]["top_risk_sentence"] == ""
