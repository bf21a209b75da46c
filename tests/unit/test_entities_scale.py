"""Compiled watch lists (issue 34): compiled once, pickled (Ray's object store holds the
bytes once per run), and a 10^5-name list matching correctly, generated here."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest

from docintel.pipeline.entities import (
    CompiledLists,
    Matcher,
    WatchList,
    compile_lists,
    compile_watch_lists,
)
from docintel.pipeline.entities.synthetic import labelled_cases, names, typos

SENTENCES = [
    "Acme Corp's unit and Hans Mueller met the BofA board.",
    "Nothing listed here, only Acmeology.",
    "Zorvex Holdings AG sued Hans  MÜLLER.",
]


@pytest.fixture(scope="module")
def big() -> tuple[list[tuple[str, str, str]], CompiledLists, float]:
    rows = names(100_000)
    wl = WatchList(
        "big",
        "-",
        [r[0] for r in rows],
        [r[1] for r in rows],
        [() for _ in rows],
        [r[2] for r in rows],
    )
    start = time.perf_counter()
    compiled = compile_watch_lists([wl])
    return rows, compiled, time.perf_counter() - start


def _small(tmp_path: Path) -> CompiledLists:
    path = tmp_path / "pep.csv"
    path.write_text(
        "entity_id,name,aliases,type\n"
        "E1,Acme Corp,,company\nE2,Hans Müller,,person\nE3,Bank of America,BofA,company\n"
        "E4,Zorvex Holdings,,company\n",
        encoding="utf-8",
    )
    return compile_lists([path])


def _found(matcher: Matcher) -> list[list[tuple]]:
    return [
        [(m.entity_id, m.start, m.end, m.similarity) for m in matcher.find(s)] for s in SENTENCES
    ]


def test_pickle_round_trip_matches_the_same(tmp_path: Path) -> None:
    compiled = _small(tmp_path)
    expected = _found(Matcher(compiled))
    assert expected[0] == [("E1", 0, 9, 1.0), ("E2", 21, 33, 1.0), ("E3", 42, 46, 1.0)]
    for restored in (
        CompiledLists.from_bytes(compiled.to_bytes()),
        pickle.loads(pickle.dumps(compiled, protocol=5)),
    ):
        assert restored.lists == ("pep",)
        assert _found(Matcher(restored)) == expected
        assert _found(Matcher(restored, 0.85)) == _found(Matcher(compiled, 0.85))


def test_from_bytes_refuses_other_objects() -> None:
    with pytest.raises(TypeError, match="not compiled watch lists"):
        CompiledLists.from_bytes(pickle.dumps({"a": 1}))


def test_stats(tmp_path: Path) -> None:
    stats = _small(tmp_path).stats()
    assert stats["entities"] == 4
    assert stats["keys"] >= 6  # four names, an alias, Müller's transliteration
    assert stats["automaton_nodes"] > 0


def test_1e5_names_compile_fast(big: tuple) -> None:
    _, compiled, seconds = big
    assert compiled.entities.num_rows == 100_000
    assert seconds < 60, f"compiling 10^5 names took {seconds:.1f} s"  # ~3 s idle


def test_1e5_names_match_every_variant_and_no_decoy(big: tuple) -> None:
    rows, compiled, _ = big
    matcher = Matcher(CompiledLists.from_bytes(compiled.to_bytes()))
    sample = rows[::500]  # 200 listed names, people and companies
    cases = labelled_cases(sample, whole_list=rows)
    assert len(cases) > 1000
    start = time.perf_counter()
    wrong = []
    for case in cases:
        matches = matcher.find(case.sentence)
        got = tuple((m.entity_id, m.match) for m in matches)
        assert all(case.sentence[m.start : m.end] == m.match for m in matches)
        if got != case.expected:
            wrong.append((case.kind, case.sentence, got, case.expected))
    assert wrong == []
    assert time.perf_counter() - start < 15  # ~1 s on an idle core


def test_1e5_names_fuzzy_finds_typos(big: tuple) -> None:
    rows, compiled, _ = big
    matcher = Matcher(compiled, min_similarity=0.85)
    cases = typos(rows[1::1000])
    hits = sum(
        {(m.entity_id, m.match) for m in matcher.find(c.sentence)} >= set(c.expected) for c in cases
    )
    assert hits >= 0.9 * len(cases), f"{hits} of {len(cases)} typos found"
