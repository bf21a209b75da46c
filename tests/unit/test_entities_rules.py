"""Watch-list matching rules (issue 34), one by one, on a real compiled list.

Every match is also checked for exact offsets: ``sentence[start:end] == match``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from docintel.pipeline.entities import Match, Matcher, compile_lists
from docintel.pipeline.entities.normalise import SUFFIXES

ROWS = [
    ("E1", "Acme", "", "company"),
    ("E2", "Hans Müller", "", "person"),
    ("E3", "Zorvex Holdings", "", "company"),
    ("E4", "Bank of America", "BofA", "company"),
    ("E5", "Bank of America Merrill Lynch", "", "company"),
    ("E6", "The Boring Company", "", "company"),
    ("E7", "Orlan Kestrel", "Kestrel Orlan|O. Kestrel", "person"),
    ("E8", "Coca-Cola", "", "company"),
    ("E9", "J.P. Morgan", "", "company"),
    ("E10", "Brightwater Corp", "", "company"),
    ("E11", "Brightwater", "", "company"),
    ("E12", "François Lefèvre", "", "person"),
    ("E13", "O'Brien Partners", "", "company"),
]


@pytest.fixture(scope="module")
def matcher(tmp_path_factory: pytest.TempPathFactory) -> Matcher:
    return Matcher(compile_lists([_write(tmp_path_factory.mktemp("lists"), ROWS)]))


@pytest.fixture(scope="module")
def fuzzy(tmp_path_factory: pytest.TempPathFactory) -> Matcher:
    path = _write(tmp_path_factory.mktemp("lists"), ROWS)
    return Matcher(compile_lists([path]), min_similarity=0.85)


def _write(folder: Path, rows: list[tuple[str, ...]], stem: str = "sanctions") -> Path:
    path = folder / f"{stem}.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["entity_id", "name", "aliases", "type"])
        writer.writerows(rows)
    return path


def found(m: Matcher, sentence: str) -> list[tuple[str, str]]:
    """(entity id, matched text) of each match, offsets checked."""
    matches = m.find(sentence)
    for x in matches:
        assert sentence[x.start : x.end] == x.match
    return [(x.entity_id, x.match) for x in matches]


def test_plain_match_carries_every_field(matcher: Matcher) -> None:
    sentence = "Shares of Zorvex Holdings fell."
    assert matcher.find(sentence) == [
        Match(
            entity_id="E3",
            name="Zorvex Holdings",
            list="sanctions",
            type="company",
            match="Zorvex Holdings",
            start=10,
            end=25,
            similarity=1.0,
        )
    ]


def test_case_insensitive(matcher: Matcher) -> None:
    assert found(matcher, "ZORVEX holdings and zorvex HOLDINGS") == [
        ("E3", "ZORVEX holdings"),
        ("E3", "zorvex HOLDINGS"),
    ]


def test_accents_ignored_both_ways(matcher: Matcher) -> None:
    assert found(matcher, "Hans Muller met Francois Lefevre") == [
        ("E2", "Hans Muller"),
        ("E12", "Francois Lefevre"),
    ]
    assert found(matcher, "HANS MÜLLER; Hans Mu\u0308ller (decomposed)") == [
        ("E2", "HANS MÜLLER"),
        ("E2", "Hans Mu\u0308ller"),
    ]


def test_umlaut_transliteration_of_a_listed_name(matcher: Matcher) -> None:
    assert found(matcher, "Hans Mueller resigned") == [("E2", "Hans Mueller")]


def test_punctuation_and_whitespace_ignored(matcher: Matcher) -> None:
    assert found(matcher, "Coca Cola, and coca-cola, and Coca--Cola") == [
        ("E8", "Coca Cola"),
        ("E8", "coca-cola"),
        ("E8", "Coca--Cola"),
    ]
    assert found(matcher, "Zorvex\n  Holdings;  Hans\tMüller") == [
        ("E3", "Zorvex\n  Holdings"),
        ("E2", "Hans\tMüller"),
    ]
    assert found(matcher, "OBrien Partners is not O'Brien  Partners") == [
        ("E13", "O'Brien  Partners")
    ]


def test_initials_with_or_without_dots(matcher: Matcher) -> None:
    assert found(matcher, "J.P. Morgan, JP Morgan, J. P. Morgan and J P Morgan") == [
        ("E9", "J.P. Morgan"),
        ("E9", "JP Morgan"),
        ("E9", "J. P. Morgan"),
        ("E9", "J P Morgan"),
    ]


@pytest.mark.parametrize(
    "suffix",
    ["Inc", "Corp", "Corporation", "Co", "Company", "Ltd", "Limited", "plc", "AG", "SA",
     "SpA", "NV", "Oy", "GmbH", "LLC", "Inc.", "S.p.A.", "N.V.", "L.L.C."],
)  # fmt: skip
def test_each_corporate_suffix_is_optional(matcher: Matcher, suffix: str) -> None:
    sentence = f"Zorvex Holdings {suffix} said; Zorvex Holdings said."
    assert found(matcher, sentence) == [
        ("E3", f"Zorvex Holdings {suffix.rstrip('.')}"),
        ("E3", "Zorvex Holdings"),
    ]


def test_the_suffix_list_is_the_issues() -> None:
    assert {
        "inc", "corp", "corporation", "co", "company", "ltd", "limited", "plc", "ag", "sa",
        "spa", "nv", "oy", "gmbh", "llc",
    } == SUFFIXES  # fmt: skip


def test_several_suffixes_and_a_comma(matcher: Matcher) -> None:
    assert found(matcher, "Zorvex Holdings, Co. Ltd. reported") == [
        ("E3", "Zorvex Holdings, Co. Ltd")
    ]


def test_listed_suffix_is_optional_in_the_sentence(matcher: Matcher) -> None:
    # "The Boring Company" is listed: "Boring" alone, "The Boring Co" and "Boring Company"
    assert found(matcher, "Boring said") == [("E6", "Boring")]
    assert found(matcher, "the boring co. said") == [("E6", "the boring co")]


def test_leading_the_optional(matcher: Matcher) -> None:
    assert found(matcher, "The Boring Company and Boring Company") == [
        ("E6", "The Boring Company"),
        ("E6", "Boring Company"),
    ]
    # a "The" before a name listed without one stays out of the match
    assert found(matcher, "The Zorvex Holdings board") == [("E3", "Zorvex Holdings")]


def test_possessive(matcher: Matcher) -> None:
    assert found(matcher, "Acme's results, Zorvex Holdings\u2019 debt, Acme Corp's CEO") == [
        ("E1", "Acme"),
        ("E3", "Zorvex Holdings"),
        ("E1", "Acme Corp"),
    ]


def test_whole_words_only(matcher: Matcher) -> None:
    assert found(matcher, "Acmeology, Acmes, reacme, acme2 and BofAs") == []
    assert found(matcher, "acme-based") == [("E1", "acme")]


def test_longest_match_wins(matcher: Matcher) -> None:
    assert found(matcher, "Bank of America Merrill Lynch cut rates") == [
        ("E5", "Bank of America Merrill Lynch")
    ]
    assert found(matcher, "Bank of America cut rates") == [("E4", "Bank of America")]


def test_no_overlapping_matches(matcher: Matcher) -> None:
    # "Orlan Kestrel" and "Kestrel Orlan" overlap in "Orlan Kestrel Orlan": the first wins
    matches = matcher.find("Orlan Kestrel Orlan spoke")
    assert [(x.entity_id, x.match) for x in matches] == [("E7", "Orlan Kestrel")]


def test_aliases_match_and_report_the_listed_name(matcher: Matcher) -> None:
    matches = matcher.find("BofA and Kestrel Orlan and O. Kestrel")
    assert [(x.entity_id, x.name, x.match) for x in matches] == [
        ("E4", "Bank of America", "BofA"),
        ("E7", "Orlan Kestrel", "Kestrel Orlan"),
        ("E7", "Orlan Kestrel", "O. Kestrel"),
    ]


def test_listed_suffix_decides_between_two_entities(matcher: Matcher) -> None:
    # "Brightwater Corp" (E10) and "Brightwater" (E11) share the core "brightwater"
    assert found(matcher, "Brightwater Corp said") == [("E10", "Brightwater Corp")]
    assert found(matcher, "Brightwater Corporation said") == [("E10", "Brightwater Corporation")]
    assert found(matcher, "Brightwater said") == [("E11", "Brightwater")]
    assert found(matcher, "Brightwater Ltd said") == [
        ("E10", "Brightwater Ltd"),
        ("E11", "Brightwater Ltd"),
    ]


def test_offsets_index_the_original_text(matcher: Matcher) -> None:
    sentence = "«Straße» — ÉTÉ: HANS  MÜLLER\u2019s 🚀 Coca\u2011Cola (J.P. Morgan)"
    matches = matcher.find(sentence)
    assert [x.match for x in matches] == ["HANS  MÜLLER", "Coca\u2011Cola", "J.P. Morgan"]
    for x in matches:
        assert sentence[x.start : x.end] == x.match


def test_nothing_in_an_empty_or_unlisted_sentence(matcher: Matcher) -> None:
    assert matcher.find("") == []
    assert matcher.find("!!! ...") == []
    assert matcher.find("Markets rallied on Tuesday.") == []


def test_fuzzy_off_by_default(matcher: Matcher) -> None:
    assert matcher.min_similarity is None
    assert found(matcher, "Zorvecs Holdings and Hans Mueler") == []


def test_fuzzy_finds_typos_and_transliterations(fuzzy: Matcher) -> None:
    matches = fuzzy.find("Zorvecs Holdings and Hans Mueler and Bank of Amerika")
    assert [(x.entity_id, x.match) for x in matches] == [
        ("E3", "Zorvecs Holdings"),
        ("E2", "Hans Mueler"),
        ("E4", "Bank of Amerika"),
    ]
    for x in matches:
        assert 0.85 <= x.similarity < 1.0


def test_fuzzy_keeps_exact_matches_exact(fuzzy: Matcher) -> None:
    matches = fuzzy.find("Zorvex Holdings' and Acme Corp's results")
    assert [(x.entity_id, x.match, x.similarity) for x in matches] == [
        ("E3", "Zorvex Holdings", 1.0),
        ("E1", "Acme Corp", 1.0),
    ]


def test_fuzzy_threshold(tmp_path: Path) -> None:
    path = _write(tmp_path, ROWS)
    strict = Matcher(compile_lists([path]), min_similarity=0.97)
    loose = Matcher(compile_lists([path]), min_similarity=0.8)
    sentence = "Orlan Kestrl spoke"  # 0.96 similar to "Orlan Kestrel"
    assert strict.find(sentence) == []
    assert [(x.entity_id, x.similarity) for x in loose.find(sentence)] == [("E7", 0.96)]


def test_fuzzy_does_not_match_short_or_unrelated_words(fuzzy: Matcher) -> None:
    assert found(fuzzy, "Acne and Acmeology and Bank of Asia") == []


def test_min_similarity_out_of_range(matcher: Matcher) -> None:
    with pytest.raises(ValueError, match="min_similarity"):
        Matcher(matcher.compiled, min_similarity=1.5)
    assert Matcher(matcher.compiled, min_similarity=1.0).find("Hans Mueler") == []


def test_homonyms_on_two_lists_are_both_reported(tmp_path: Path) -> None:
    pep = _write(tmp_path, [("P1", "Hans Müller", "", "pep")], stem="pep")
    clients = _write(tmp_path, [("C7", "Hans Muller", "", "client")], stem="clients")
    matches = Matcher(compile_lists([pep, clients])).find("Hans Muller resigned")
    assert [(x.entity_id, x.list, x.type, x.match) for x in matches] == [
        ("P1", "pep", "pep", "Hans Muller"),
        ("C7", "clients", "client", "Hans Muller"),
    ]
