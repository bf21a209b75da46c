"""Issue 35: the redaction API - placeholders' spans in the redacted text, the offset map
back to the original, overlaps, user patterns, determinism and pickling."""

from __future__ import annotations

import pickle
import random

import pytest

from docintel.pipeline.privacy import OffsetMap, Redactor, resolve, spans_within

DOCUMENT = (
    "Dear team, Ann Lee (ann.lee@example.com, +44 20 7946 0958) paid with card "
    "4111 1111 1111 1111 from 192.168.1.10. Refund to DE89 3704 0044 0532 0130 00, "
    "SSN 123-45-6789, or call (212) 555-0147. Ticket CU-004211 is open; 2001:db8::1 too."
)
VALUES = {
    "ann.lee@example.com": "EMAIL_ADDRESS",
    "+44 20 7946 0958": "PHONE_NUMBER",
    "4111 1111 1111 1111": "CREDIT_CARD",
    "192.168.1.10": "IP_ADDRESS",
    "DE89 3704 0044 0532 0130 00": "IBAN_CODE",
    "123-45-6789": "US_SSN",
    "(212) 555-0147": "PHONE_NUMBER",
    "CU-004211": "CUSTOMER_ID",
    "2001:db8::1": "IP_ADDRESS",
}


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor(None, {"CUSTOMER_ID": r"CU-\d{6}"})


def test_spans_point_at_placeholders_and_no_value_is_left(redactor: Redactor) -> None:
    redacted, spans = redactor.redact(DOCUMENT)
    assert [s["type"] for s in spans] == list(VALUES.values())
    for span in spans:
        assert set(span) == {"type", "start", "end"}
        assert redacted[span["start"] : span["end"]] == f"<{span['type']}>"
    for value in VALUES:
        assert value not in redacted
    assert "4111" not in redacted and "7946" not in redacted and "0532" not in redacted


def test_the_offset_map_leads_back_to_each_value(redactor: Redactor) -> None:
    redacted, spans, offsets = redactor.redact_mapped(DOCUMENT)
    assert (redacted, spans) == redactor.redact(DOCUMENT)
    for span, value in zip(spans, VALUES, strict=True):
        start = offsets.to_original(span["start"])
        end = offsets.to_original(span["end"], end=True)
        assert DOCUMENT[start:end] == value


def test_the_offset_map_keeps_text_between_placeholders(redactor: Redactor) -> None:
    """Every position outside a placeholder maps to the same character of the original."""
    redacted, spans, offsets = redactor.redact_mapped(DOCUMENT)
    inside = {i for s in spans for i in range(s["start"], s["end"])}
    for pos, char in enumerate(redacted):
        if pos not in inside:
            assert DOCUMENT[offsets.to_original(pos)] == char
    assert offsets.to_original(len(redacted)) == len(DOCUMENT)
    assert offsets.to_original(0) == 0


def test_a_range_cutting_a_placeholder_widens_to_the_whole_value() -> None:
    text = "Write to ann@example.com today."
    redacted, spans, offsets = Redactor().redact_mapped(text)
    inner = spans[0]["start"] + 3  # inside "<EMAIL_ADDRESS>"
    assert offsets.to_original(inner) == text.index("ann")
    assert offsets.to_original(inner, end=True) == text.index(" today")
    # a sentence of the redacted text maps back to the same sentence of the original
    start, end = redacted.index("Write"), len(redacted)
    assert text[offsets.to_original(start) : offsets.to_original(end, end=True)] == text


def test_text_without_values_is_returned_as_is() -> None:
    text = "Revenue rose 12.5% to $4,321.7 million in fiscal 2025."
    redacted, spans, offsets = Redactor().redact_mapped(text)
    assert (redacted, spans) == (text, [])
    assert offsets.to_original(7) == 7 and offsets.pairs == ()


def test_spans_within_rebases_a_sentence(redactor: Redactor) -> None:
    redacted, spans = redactor.redact(DOCUMENT)
    start = redacted.index("Refund")
    end = redacted.index(" Ticket")
    sentence = redacted[start:end]
    inner = spans_within(spans, start, end)
    assert [s["type"] for s in inner] == ["IBAN_CODE", "US_SSN", "PHONE_NUMBER"]
    for span in inner:
        assert sentence[span["start"] : span["end"]] == f"<{span['type']}>"


def test_overlaps_keep_the_longest_then_the_higher_priority() -> None:
    priority = {"A": 0, "B": 1}
    found = [("B", 0, 10), ("A", 2, 5), ("A", 9, 12), ("B", 20, 24), ("A", 21, 25)]
    assert resolve(found, priority) == [("B", 0, 10), ("A", 21, 25)]
    assert resolve([("B", 3, 8), ("A", 3, 8)], priority) == [("A", 3, 8)]
    # same length, same type: the first start wins
    assert resolve([("A", 5, 9), ("A", 3, 7)], priority) == [("A", 3, 7)]


def test_a_user_pattern_wins_a_tie_and_a_longer_value_wins_over_it() -> None:
    tie = Redactor(None, {"ACCOUNT": r"\d{3}-\d{2}-\d{4}"})
    assert tie.redact("id 123-45-6789.")[0] == "id <ACCOUNT>."
    short = Redactor(None, {"BANK": r"DE89"})
    assert short.redact("IBAN DE89370400440532013000")[0] == "IBAN <IBAN_CODE>"


def test_user_patterns_alone_and_with_inline_flags() -> None:
    redactor = Redactor([], {"REF": r"(?i)ref-\d+", "CASE": r"\bC\d{4}\b"})
    assert redactor.types == ()
    assert redactor.redact("REF-12, ref-7 and C2025 (not ann@example.com)") == (
        "<REF>, <REF> and <CASE> (not ann@example.com)",
        [
            {"type": "REF", "start": 0, "end": 5},
            {"type": "REF", "start": 7, "end": 12},
            {"type": "CASE", "start": 17, "end": 23},
        ],
    )


def test_deterministic_over_instances_and_calls(redactor: Redactor) -> None:
    again = Redactor(None, {"CUSTOMER_ID": r"CU-\d{6}"})
    first = redactor.redact(DOCUMENT)
    assert all(redactor.redact(DOCUMENT) == first for _ in range(3))
    assert again.redact(DOCUMENT) == first
    shuffled = Redactor(list(reversed(redactor.types)), {"CUSTOMER_ID": r"CU-\d{6}"})
    assert shuffled.types == redactor.types and shuffled.redact(DOCUMENT) == first


def test_pickle_round_trip(redactor: Redactor) -> None:
    clone = pickle.loads(pickle.dumps(redactor))
    assert clone.setting == redactor.setting
    assert clone.redact(DOCUMENT) == redactor.redact(DOCUMENT)
    result = redactor.redact_mapped(DOCUMENT)
    assert pickle.loads(pickle.dumps(result)) == result
    assert pickle.loads(pickle.dumps(result.offsets)) == result.offsets


def test_setting_names_types_and_patterns_only(redactor: Redactor) -> None:
    assert redactor.setting == {
        "types": [
            "EMAIL_ADDRESS",
            "IBAN_CODE",
            "CREDIT_CARD",
            "US_SSN",
            "IP_ADDRESS",
            "PHONE_NUMBER",
        ],
        "patterns": {"CUSTOMER_ID": r"CU-\d{6}"},
    }


def test_random_documents_map_back_exactly() -> None:
    """Seeded documents of values and filler: each span maps back to a value, in order."""
    rng = random.Random(35)
    values = [value for value, kind in VALUES.items() if kind != "CUSTOMER_ID"]
    redactor = Redactor()
    for _ in range(50):
        chosen = [rng.choice(values) for _ in range(rng.randint(0, 6))]
        fillers = [rng.choice((" ", " and ", "; see ", "\n", " (2025) ")) for _ in chosen]
        document = "Note: " + "".join(f"{f}{v} x" for f, v in zip(fillers, chosen, strict=True))
        redacted, spans, offsets = redactor.redact_mapped(document)
        back = [
            document[offsets.to_original(s["start"]) : offsets.to_original(s["end"], end=True)]
            for s in spans
        ]
        assert back == chosen
        assert not any(value in redacted for value in chosen)
        assert isinstance(offsets, OffsetMap)


def test_noise_never_breaks_the_redactor() -> None:
    """Seeded noise of digits, separators, '@', ':', '+' and non-ASCII digits: no exception,
    every span is its placeholder, and the text around placeholders maps back unchanged."""
    rng = random.Random(7)
    chars = "0123456789 -.:+()@/abcXYZ_\n\uff14\u0661\u0663\U0001d7d7\u00e9"  # non-ASCII 4 1 3 9 é
    redactor = Redactor(None, {"TAG": r"X[YZ]+"})
    for _ in range(2000):
        text = "".join(rng.choice(chars) for _ in range(rng.randint(0, 60)))
        redacted, spans, offsets = redactor.redact_mapped(text)
        inside = set()
        for span in spans:
            assert redacted[span["start"] : span["end"]] == f"<{span['type']}>"
            inside.update(range(span["start"], span["end"]))
        for pos, char in enumerate(redacted):
            if pos not in inside:
                assert text[offsets.to_original(pos)] == char
        assert offsets.to_original(len(redacted)) == len(text)
