"""The entities stage (issue 34), without Ray: in the chain only with lists, the lists
checked and summarised on the driver, compiled once into the cache, the columns it writes
(sentences.entities, documents.entity_ids), and the search filter on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from docintel.pipeline import registry
from docintel.pipeline.artefacts.derived import ensure_derived
from docintel.pipeline.batch import Batch
from docintel.pipeline.config import Config, load_config
from docintel.pipeline.entities import stage as es
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.output.sink import documents_table
from docintel.pipeline.run.layout import ClusterShape, stage_layout
from docintel.pipeline.schema import (
    DOC_ID,
    ENTITIES,
    ENTITIES_TYPE,
    ENTITY_IDS,
    LABEL,
    PROBS,
    TEXT,
    TRUNCATED,
    documents_schema,
)
from docintel.pipeline.search.source import Filters, names_entity

LIST = (
    "entity_id,name,aliases,type\n"
    "E1,Acme Corp,ACME|Acme Holdings,company\n"
    "E2,Jürgen Müller,,person\n"
    "E3,Bank of America,BofA,company\n"
)
SENTENCES = [
    "Acme's shares fell as Juergen Mueller quit.",
    "Nothing listed here, only Acmeology.",
    "BofA and ACME Inc. sued   Jürgen  Müller.",
    "",
]


def _list(tmp_path: Path, text: str = LIST, name: str = "clients.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _cfg(*lists: Path, **more: object) -> Config:
    return load_config(None, {"entities.lists": [str(p) for p in lists], **more})


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("DOCINTEL_CACHE_DIR", str(folder))
    return folder


def _stage(cfg: Config) -> es.EntityMatcher:
    ensure_derived(cfg, say=lambda _line: None, chain=registry.chain(cfg))
    stage = es.EntityMatcher(cfg.entities, es.compiled_path(cfg), es.lists_version(cfg))
    stage.setup()
    return stage


def test_the_stage_joins_the_chain_only_with_lists_after_sentencize(tmp_path: Path) -> None:
    assert "entities" not in registry.chain(load_config()).names
    names = registry.chain(_cfg(_list(tmp_path))).names
    assert names.index("sentencize") < names.index("entities") < names.index("embed")
    # CPU replicas only, light: the 2-core layout still leaves the I/O tasks their share
    layout = stage_layout(_cfg(_list(tmp_path)), ClusterShape.of(2))
    ((kind, replicas, cpus),) = [(p.kind, p.replicas, p.cpus) for p in layout["entities"]]
    assert (kind, replicas) == ("cpu", 1) and 0 < cpus <= es.ENTITIES_CPUS
    listed = _cfg(_list(tmp_path), **{"pipeline.stages": ["sentencize", "embed", "classify"]})
    assert "entities" in registry.chain(listed).names
    with pytest.raises(ConfigError, match=r"'entities'.*--watch-list"):
        registry.chain(load_config(None, {"pipeline.stages": ["sentencize", "entities"]}))


def test_the_column_holds_every_match_with_offsets_into_the_text(
    tmp_path: Path, cache: Path
) -> None:
    cfg = _cfg(_list(tmp_path))
    stage = _stage(cfg)
    assert (stage.backend, stage.version) == ("cpu-fp32", es.lists_version(cfg))
    assert stage.version.startswith("lists@")
    table = pa.table({DOC_ID: ["a", "a", "b", "c"], TEXT: SENTENCES})
    out = stage(table)
    assert out.column_names == [DOC_ID, TEXT, ENTITIES]
    assert out.schema.field(ENTITIES).type == ENTITIES_TYPE
    rows = out[ENTITIES].to_pylist()
    assert [[(m["entity_id"], m["match"]) for m in r] for r in rows] == [
        [("E1", "Acme"), ("E2", "Juergen Mueller")],
        [],
        [("E3", "BofA"), ("E1", "ACME Inc"), ("E2", "Jürgen  Müller")],
        [],
    ]
    for text, matches in zip(SENTENCES, rows, strict=True):
        for m in matches:
            assert text[m["start"] : m["end"]] == m["match"]
            assert (m["list"], m["similarity"]) == ("clients", 1.0)
    assert rows[0][0]["name"] == "Acme Corp" and rows[0][0]["type"] == "company"
    assert stage(table.slice(0, 0))[ENTITIES].type == ENTITIES_TYPE  # an empty batch


def test_fuzzy_matching_on_request(tmp_path: Path, cache: Path) -> None:
    cfg = _cfg(_list(tmp_path), **{"entities.min_similarity": 0.85})
    assert es.lists_version(cfg).endswith("~0.85")
    out = _stage(cfg)(pa.table({DOC_ID: ["a"], TEXT: ["Bank of Amerika was fined."]}))
    (match,) = out[ENTITIES].to_pylist()[0]
    assert match["entity_id"] == "E3" and 0.85 <= match["similarity"] < 1.0


def test_lists_are_compiled_once_into_the_cache_keyed_by_their_contents(
    tmp_path: Path, cache: Path
) -> None:
    path = _list(tmp_path)
    cfg = _cfg(path)
    said: list[str] = []
    ensure_derived(cfg, say=said.append, chain=registry.chain(cfg))
    compiled = es.compiled_path(cfg)
    assert compiled.parent == cache / "entities" and compiled.is_file()
    assert any("compiled watch lists" in line for line in said)
    built = compiled.stat().st_mtime_ns
    said.clear()
    ensure_derived(cfg, say=said.append, chain=registry.chain(cfg))  # a second run: built
    assert not said and compiled.stat().st_mtime_ns == built
    record, version = es.plan_record(cfg), es.lists_version(cfg)
    assert record["lists"][0]["list"] == "clients"
    assert (record["lists"][0]["entities"], record["lists"][0]["names"]) == (3, 6)
    assert "Acme" not in str(record)  # sizes and hashes, never the names
    path.write_text(LIST + "E4,Zorvex Holdings,,company\n", encoding="utf-8")
    assert es.plan_record(cfg) != record  # the same file, changed: read again
    assert es.lists_version(cfg) != version
    assert es.compiled_path(cfg) != compiled


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("id,name\nE1,Acme\n", r"clients\.csv, line 1 .*missing column\(s\) entity_id"),
        ("entity_id,name\nE1,Acme\nE2,\n", r"clients\.csv, line 3: empty name for id 'E2'"),
        (
            "entity_id,name\nE1,Acme\nE1,Acme Corp\n",
            r"clients\.csv, line 3: id 'E1' is named 'Acme Corp', but 'Acme' at line 2",
        ),
    ],
)
def test_a_bad_list_is_refused_naming_file_and_line(tmp_path: Path, text: str, said: str) -> None:
    cfg = _cfg(_list(tmp_path, text))
    with pytest.raises(ConfigError, match=said):
        registry.ENTITIES.check(cfg)


def test_an_unreadable_list_or_two_lists_of_one_name_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.csv: unreadable file"):
        registry.ENTITIES.check(_cfg(tmp_path / "missing.csv"))
    (tmp_path / "bad.csv").write_bytes(b"entity_id,name\nE1,\xff\xfe\n")
    with pytest.raises(ConfigError, match=r"bad\.csv: unreadable file"):
        registry.ENTITIES.check(_cfg(tmp_path / "bad.csv"))
    other = tmp_path / "other"
    other.mkdir()
    twins = _cfg(_list(tmp_path), _list(other))
    with pytest.raises(ConfigError, match="same name 'clients'"):
        registry.ENTITIES.check(twins)


def _batch(entities: list[list[dict]] | None) -> Batch:
    n = 3
    cols: dict[str, pa.Array] = {
        DOC_ID: pa.array(["d1", "d1", "d3"]),
        TEXT: pa.array(["x", "y", "z"]),
        TRUNCATED: pa.array([False] * n),
        LABEL: pa.array(["Bearish"] * n),
        PROBS: pa.FixedSizeListArray.from_arrays(pa.array([1.0, 0.0] * n, pa.float32()), 2),
    }
    if entities is not None:
        cols[ENTITIES] = pa.array(entities, ENTITIES_TYPE)
    return Batch("b1", pa.array(["d1", "d2", "d3"]), pa.table(cols), backends={}, versions={})


def _match(entity_id: str) -> dict:
    return {"entity_id": entity_id, "name": "N", "list": "l", "type": "", "match": "N",
            "start": 0, "end": 1, "similarity": 1.0}  # fmt: skip


def test_documents_get_the_sorted_distinct_ids_of_their_sentences() -> None:
    batch = _batch([[_match("E2"), _match("E1")], [_match("E2")], []])
    docs = documents_table(batch, ["Bearish", "Bullish"])
    assert docs.schema.field(ENTITY_IDS).type == pa.list_(pa.string())
    assert docs.schema == documents_schema(["Bearish", "Bullish"], entities=True)
    assert docs[ENTITY_IDS].to_pylist() == [["E1", "E2"], [], []]
    without = documents_table(_batch(None), ["Bearish", "Bullish"])
    assert ENTITY_IDS not in without.column_names  # a run without the stage: no column
    assert es.document_entity_ids(batch.table, np.array([0, 0, 2]), 3).to_pylist() == [
        ["E1", "E2"], [], [],
    ]  # fmt: skip


def test_the_search_filter_keeps_the_sentences_that_name_the_entity() -> None:
    column = pa.array([[_match("E1"), _match("E2")], [], [_match("E2")], []], ENTITIES_TYPE)
    assert names_entity(column, "E2").to_pylist() == [True, False, True, False]
    assert names_entity(column, "E9").to_pylist() == [False] * 4
    batch = pa.record_batch({DOC_ID: ["a", "b", "c", "d"], ENTITIES: column})
    assert Filters(entity_id="E1").mask(batch).to_pylist() == [True, False, False, False]
    assert Filters(entity_id="E1").columns == (ENTITIES,) and Filters().columns == ()
