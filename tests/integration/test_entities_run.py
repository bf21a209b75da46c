"""Watch-list screening end to end (issue 34), on a local Ray: a run with a list writes
sentences.entities and documents.entity_ids and records the list in its manifest; a resume
with a changed list is refused and the unchanged one finishes it exactly once; search
--entity keeps the sentences that name the entity; bad lists are refused by the CLI with
exit 2 before any work; a 10^5-name synthetic list runs to the end into Delta tables."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from docintel.actors.runner import execute
from docintel.pipeline import registry
from docintel.pipeline.entities.stage import lists_version
from docintel.pipeline.entities.synthetic import names
from docintel.pipeline.errors import UsageError
from docintel.pipeline.search.query import search
from docintel.pipeline.search.source import Filters
from tests.cli.test_cli import docintel
from tests.conftest import assert_exactly_once, run_config, write_docs

LIST = (
    "entity_id,name,aliases,type\n"
    "C1,Acme Corp,ACME,company\n"
    "P1,Jürgen Müller,,person\n"
    "C2,Northwind Traders Ltd,Northwind,company\n"
)
PLANTED = {
    0: "Acme Corp's shares fell sharply. Juergen Mueller resigned as chief executive.",
    5: "Regulators fined Northwind for late filings. ACME Inc. declined to comment.",
    9: "The Acme Corporation board met on Monday.",
}


def _docs(tmp_path: Path, headlines: list[str], n: int = 12) -> tuple[Path, list[str]]:
    ids = [f"d{i:02d}" for i in range(n)]
    texts = [PLANTED.get(i, headlines[i]) for i in range(n)]
    return write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=4), ids


@pytest.mark.usefixtures("ray_cluster")
def test_a_run_with_a_list_its_columns_manifest_resume_and_search(
    tmp_path: Path, headlines: list[str]
) -> None:
    inp, ids = _docs(tmp_path, headlines)
    watch = tmp_path / "clients.csv"
    watch.write_text(LIST, encoding="utf-8")
    out = tmp_path / "out"
    base = {"run.run_id": "r1", "run.part_target_mb": 0, "entities.lists": [str(watch)]}
    cfg = run_config(**base)
    assert execute(cfg, str(inp), str(out)).batches == 3
    tables = assert_exactly_once(out, ids)
    sents, docs = tables["sentences"], tables["documents"]
    found = sorted(
        (row.doc_id, m["entity_id"], m["match"])
        for row in sents.itertuples()
        for m in row.entities
        if row.text[m["start"] : m["end"]] == m["match"]
    )
    assert found == [
        ("d00", "C1", "Acme Corp"), ("d00", "P1", "Juergen Mueller"),
        ("d05", "C1", "ACME Inc"), ("d05", "C2", "Northwind"),
        ("d09", "C1", "Acme Corporation"),
    ]  # fmt: skip
    assert sum(len(e) for e in sents.entities) == len(found)  # every match: offsets hold
    by_doc = {d: list(e) for d, e in zip(docs.doc_id, docs.entity_ids, strict=True)}
    assert by_doc["d00"] == ["C1", "P1"] and by_doc["d05"] == ["C1", "C2"]
    assert by_doc["d01"] == [] and by_doc["d09"] == ["C1"]
    assert set(sents.entities_backend) == {"cpu-fp32"}
    assert set(sents.entities_model) == {lists_version(cfg)}
    manifest = json.loads((out / "_manifest.json").read_text())
    (recorded,) = manifest["plan"]["watch_lists"]["lists"]
    assert (recorded["list"], recorded["entities"], recorded["names"]) == ("clients", 3, 5)
    assert "Acme" not in json.dumps(manifest)  # hashes and sizes, never a listed name
    stages = registry.chain(cfg).names
    assert manifest["stages"] == stages and "entities" in stages  # the lists bring the stage

    hits = search(str(out), ["shares fell"], 10, Filters(entity_id="P1"), cfg).hits[0]
    assert [(h["doc_id"], h["sent_index"]) for h in hits] == [("d00", 1)]

    (out / "_manifest.json").unlink()  # a crash before the last batch committed
    for part in sorted((out / "documents").iterdir())[-1:]:
        part.unlink()
    watch.write_text(LIST + "C3,Zorvex Holdings,,company\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"watch_lists .*--watch-list"):
        execute(run_config(**base), str(inp), str(out))
    watch.write_text(LIST, encoding="utf-8")
    resumed = execute(run_config(**base), str(inp), str(out))
    assert (resumed.batches, resumed.skipped_batches) == (1, 2)
    assert_exactly_once(out, ids)


BAD_LISTS = {
    "no_name.csv": ("entity_id,alias\nE1,Acme\n", "line 1 (the header): missing column(s) name"),
    "empty.csv": ("entity_id,name\nE1,Acme\nE2,  \n", "line 3: empty name for id 'E2'"),
    "twice.csv": ("entity_id,name\nE1,Acme\nE1,Acme Corp\n", "line 3: id 'E1' is named"),
    "unreadable.csv": (None, "unreadable file"),
}


def test_bad_lists_are_refused_by_the_cli_with_exit_2(tmp_path: Path) -> None:
    inp = write_docs(tmp_path / "in.parquet", ["a"], ["Acme fell."])
    for name, (text, said) in BAD_LISTS.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text, encoding="utf-8")
        r = docintel("run", inp, tmp_path / "out", "--watch-list", path, "--no-progress")
        assert r.returncode == 2, r.stderr[-2000:]
        assert "Traceback" not in r.stderr
        assert name in r.stderr and said in r.stderr, r.stderr[-2000:]
        assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.usefixtures("ray_cluster")
def test_a_100k_name_list_runs_into_delta_tables(tmp_path: Path, headlines: list[str]) -> None:
    from deltalake import DeltaTable

    rows = names(100_000)
    watch = tmp_path / "big.csv"
    with watch.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["entity_id", "name", "type"])
        w.writerows(rows)
    planted = {i: rows[i * 7919] for i in range(8)}  # (id, name, type) spread over the list
    ids = [f"b{i:02d}" for i in range(16)]
    texts = [
        f"Shares of {planted[i][1]} fell after the results. {headlines[i]}" if i in planted
        else headlines[i]
        for i in range(16)
    ]  # fmt: skip
    inp = write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=8)
    out = tmp_path / "warehouse"
    cfg = run_config(**{"entities.lists": [str(watch)], "output.format": "delta",
                        "run.batch_size": 8})  # fmt: skip
    summary = execute(cfg, str(inp), str(out))
    assert summary.documents == 16 and summary.errors == 0
    docs = DeltaTable(str(out / "documents")).to_pandas()
    sents = DeltaTable(str(out / "sentences")).to_pandas()
    got = {d: list(e) for d, e in zip(docs.doc_id, docs.entity_ids, strict=True)}
    for i, (entity_id, _, _) in planted.items():
        assert entity_id in got[f"b{i:02d}"]
    named = [m for ms in sents.entities for m in ms]
    assert {m["entity_id"] for m in named} >= {e for e, _, _ in planted.values()}
    assert all(m["list"] == "big" for m in named)
