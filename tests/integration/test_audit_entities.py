"""The adverse-media review end to end: two audit nights of a corpus screened against a
watch list (``[entities] lists``), the entities stage writing ``sentences.entities`` and the
report ranking the listed names in risk sentences and naming tonight's new mentions.
Expected values are recomputed here from the nights' sentences tables."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from docintel.actors.runner import execute
from docintel.pipeline.audit import run_audit
from tests.integration.test_audit import _cfg, _write

pytestmark = pytest.mark.usefixtures("ray_cluster")

D1, D2 = "2026-04-01", "2026-04-02"
BAD = [
    "Acme Corp shares plunged 40% after fraud charges were filed against its chief executive.",
    "Globex Ltd warned of heavy losses and cut its dividend as sales collapsed.",
    "Acme Corp defaulted on its bonds and filed for bankruptcy protection.",
]
ADDED = "Regulators fined Acme Corp $2 billion and shares crashed to a record low."
NEW_DOC = "Initech slumped after a profit warning, and Globex's lenders pulled credit lines."


def _entities(out: Path, day: str, risk: str) -> pd.DataFrame:
    """Per (list, entity_id): the summed score and count of the night's risk sentences
    naming it, each sentence once; best first."""
    s = pd.read_parquet(out / f"run_date={day}" / "sentences")
    s = s[s.label == risk].explode("entities").dropna(subset=["entities"])
    s["list"] = [m["list"] for m in s.entities]
    s["entity_id"] = [m["entity_id"] for m in s.entities]
    s = s.drop_duplicates(["list", "entity_id", "doc_id", "sent_index"])
    g = s.groupby(["list", "entity_id"]).agg(score=("score", "sum"), n=("score", "size"))
    return g.reset_index().sort_values(
        ["score", "n", "list", "entity_id"], ascending=[False, False, True, True]
    )


def test_two_screened_nights(tmp_path: Path) -> None:
    src, out = tmp_path / "source", tmp_path / "out"
    watch = tmp_path / "counterparties.csv"
    watch.write_text(
        "entity_id,name,aliases,type\nE1,Acme Corporation,,company\n"
        "P7,Globex,Globex Holdings,company\nI1,Initech,,company\n"
    )
    cfg = _cfg(**{"entities.lists": [str(watch)]})
    texts = [BAD[0] + " " + BAD[2], BAD[1], "Acme Corp opened a new office in Leeds."]
    _write(src / "a.parquet", ["a1", "a2", "a3"], texts)
    run_audit(cfg, str(src), str(out), D1, execute)
    texts[1] += " " + ADDED.replace("Acme Corp", "Globex")  # a2 changed: one sentence added
    _write(src / "a.parquet", ["a1", "a2", "a3"], texts, bump=5)
    _write(src / "b.parquet", ["b1"], [NEW_DOC])
    run_audit(cfg, str(src), str(out), D2, execute)

    one = json.loads((out / f"run_date={D1}" / "report.json").read_text())
    two = json.loads((out / f"run_date={D2}" / "report.json").read_text())
    risk = one["risk_label"]
    for rep, day in ((one, D1), (two, D2)):
        want = _entities(out, day, risk)
        assert rep["entities_screened"] is True and rep["entities_total"] == len(want)
        got = [(e["list"], e["entity_id"]) for e in rep["entities"]]
        assert got == list(zip(want.list, want.entity_id, strict=True))
        assert [e["risk_score"] for e in rep["entities"]] == pytest.approx(
            want.score.tolist(), abs=1e-5
        )
        for e in rep["entities"]:
            assert e["list"] == "counterparties" and e["sentences"]
            assert all(s["label"] == risk for s in e["sentences"])
    assert one["entities"], f"no listed name in a {risk} sentence: {one['label_distribution']}"
    assert {e["entity_id"] for e in one["entities"]} <= {"E1", "P7"}
    # night two: a2 gained one sentence (new if it is a risk one), b1 is new, a1 unchanged
    sents = pd.read_parquet(out / f"run_date={D2}" / "sentences")
    assert set(sents.doc_id) == {"a2", "b1"}
    before = {e["entity_id"]: e["risk_sentences"] for e in one["entities"]}
    for e in two["entities"]:
        assert e["previous_risk_sentences"] == before.get(e["entity_id"], 0)
        mine = sents[sents.label == risk]
        mine = mine[[any(m["entity_id"] == e["entity_id"] for m in ms) for ms in mine.entities]]
        fresh = mine[(mine.doc_id == "b1") | mine.text.str.startswith("Regulators fined")]
        assert e["new_mentions"] == len(fresh)
    named = two["changes"]["entities"]
    assert [e["entity_id"] for e in named] == [
        e["entity_id"]
        for e in sorted(two["entities"], key=lambda e: (-e["new_mentions"], e["rank"]))
        if e["new_mentions"]
    ]
    page = (out / f"run_date={D2}" / "report.html").read_text()
    assert ('id="entities-table"' in page) and ('id="changes-entities"' in page)
    assert (out / f"run_date={D2}" / "entities.csv").is_file()
