"""Sentencizer: offsets into the original text, blanks, huge and odd documents, chunking."""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import pyarrow as pa
import pytest

from docintel.pipeline.config import SentencizeConfig
from docintel.pipeline.errors import ModelError
from docintel.pipeline.schema import DOC_ID, END_CHAR, SENT_INDEX, START_CHAR, TEXT
from docintel.pipeline.stages.sentencize import SENTENCES_SCHEMA, Sentencizer, chunk_spans, joined


def assert_offsets_hold(out: pa.Table, texts: dict[str, str]) -> None:
    """Each row's span of the original, its line breaks joined, is its stored text."""
    for row in out.to_pylist():
        original = texts[row[DOC_ID]]
        assert joined(original[row[START_CHAR] : row[END_CHAR]]) == row[TEXT], row


def assert_sent_index_dense(out: pa.Table) -> None:
    per_doc: dict[str, list[int]] = {}
    for doc, idx in zip(out[DOC_ID].to_pylist(), out[SENT_INDEX].to_pylist(), strict=True):
        per_doc.setdefault(doc, []).append(idx)
    for doc, idxs in per_doc.items():
        assert idxs == list(range(len(idxs))), doc


def assert_covers_non_whitespace(out: pa.Table, doc: str, text: str) -> None:
    """Every non-whitespace character lies in exactly one sentence; sentences do not overlap."""
    sub = out.filter(pa.compute.equal(out[DOC_ID], doc))
    cover = np.zeros(len(text) + 1, dtype=np.int64)
    for a, b in zip(sub[START_CHAR].to_pylist(), sub[END_CHAR].to_pylist(), strict=True):
        assert 0 <= a < b <= len(text)
        cover[a] += 1
        cover[b] -= 1
    cover = np.cumsum(cover)[: len(text)]
    assert cover.max() <= 1, "sentences overlap"
    non_ws = np.fromiter((not c.isspace() for c in text), dtype=bool, count=len(text))
    assert (cover[non_ws] == 1).all(), "a non-whitespace character is in no sentence"


def test_offsets_point_into_the_original_text(sentencizer, docs_table):
    texts = {
        "plain": "Revenue rose 5%. Margins fell to 12.3% in Q2! Will it last? Analysts doubt it.",
        "padded": "   \n  Leading blanks. \t Inner tabs.\n\nNew paragraph here.   ",
        "unicode": "Ünïcödé names: Société Générale gained 2€. 😀 Emoji too! 日本語の文。Done.",
        "one": "no punctuation at all here",
        "newlines": "Line one\nLine two.\r\nLine three.",
    }
    out = sentencizer(docs_table(list(texts), list(texts.values())))
    assert out.schema == SENTENCES_SCHEMA
    assert set(out[DOC_ID].to_pylist()) == set(texts)
    assert_offsets_hold(out, texts)
    assert_sent_index_dense(out)
    for doc, text in texts.items():
        assert_covers_non_whitespace(out, doc, text)
    plain = out.filter(pa.compute.equal(out[DOC_ID], "plain"))[TEXT].to_pylist()
    assert plain == [
        "Revenue rose 5%.",
        "Margins fell to 12.3% in Q2!",
        "Will it last?",
        "Analysts doubt it.",
    ]
    # stripped: no sentence starts or ends with whitespace
    assert all(t == t.strip() and t for t in out[TEXT].to_pylist())


def test_blank_empty_and_null_texts_give_no_rows(sentencizer, docs_table):
    ids = ["spaces", "empty", "none", "mixed_ws", "real"]
    texts = ["     ", "", None, " \t\n\r\u3000\u00a0 ", "A real sentence."]
    out = sentencizer(docs_table(ids, texts))
    assert out[DOC_ID].to_pylist() == ["real"]
    assert out[SENT_INDEX].to_pylist() == [0]


def test_only_blank_texts_give_an_empty_table_with_the_schema(sentencizer, docs_table):
    out = sentencizer(docs_table(["a", "b", "c"], ["", None, "\n\n"]))
    assert out.num_rows == 0
    assert out.schema == SENTENCES_SCHEMA


def test_sent_index_counts_from_zero_per_document(sentencizer, docs_table):
    ids = [f"d{i}" for i in range(6)]
    texts = [" ".join(f"Sentence {j} of doc {i}." for j in range(i + 1)) for i in range(6)]
    out = sentencizer(docs_table(ids, texts))
    assert_sent_index_dense(out)
    counts = {d: out[DOC_ID].to_pylist().count(d) for d in ids}
    assert counts == {f"d{i}": i + 1 for i in range(6)}


@pytest.fixture(scope="module")
def roomy_sentencizer():
    """A cap above this file's 50,000-sentence document: these tests are about chunking."""
    stage = Sentencizer(SentencizeConfig(max_sentences=100_000))
    stage.setup()
    yield stage
    stage.teardown()


def test_one_million_character_document(roomy_sentencizer, docs_table):
    sentencizer = roomy_sentencizer
    unit = "Revenue rose 5%. "
    no_spaces = "x" * 150_000  # longer than a whole chunk (100,000 chars): a forced cut
    head = unit * 40_000  # 680,000 chars
    tail_len = 1_000_000 - len(head) - len(no_spaces)
    tail = (unit * (tail_len // len(unit) + 1))[:tail_len]
    text = head + no_spaces + tail
    assert len(text) == 1_000_000
    out = sentencizer(docs_table(["big", "small"], [text, "Small doc. Two sentences."]))
    texts = {"big": text, "small": "Small doc. Two sentences."}
    assert_offsets_hold(out, texts)
    assert_sent_index_dense(out)
    assert_covers_non_whitespace(out, "big", text)
    big = out.filter(pa.compute.equal(out[DOC_ID], "big"))
    # chunk cuts (at most ~12 of them) may split a sentence; all the others are whole
    whole = big[TEXT].to_pylist().count("Revenue rose 5%.")
    expected = text.count("Revenue rose 5%.")
    assert expected - 15 <= whole <= expected
    assert out.filter(pa.compute.equal(out[DOC_ID], "small")).num_rows == 2


def test_long_text_without_punctuation_or_spaces(sentencizer, docs_table):
    text = "".join(random.Random(1).choices("abcdefghijklmnopqrstuvwxyz0123456789", k=10_000))
    out = sentencizer(docs_table(["blob"], [text]))
    assert out.num_rows == 1
    row = out.to_pylist()[0]
    assert (row[START_CHAR], row[END_CHAR], row[TEXT]) == (0, 10_000, text)


def test_control_characters_keep_offsets(sentencizer, docs_table):
    texts = {
        "nul": "Null\x00byte inside. Next one.",
        "bell": "\x07Bell first. Then\x07 more!",
        "zwsp": "Zero\u200bwidth space. \u200b Another\u200b sentence.\u200b",
        "only_ctrl": "\x00\x07\u200b",
        "mix": "\x00 \x1f\x0b A. \u200b\u200b B.\x00",
    }
    out = sentencizer(docs_table(list(texts), list(texts.values())))
    assert_offsets_hold(out, texts)
    assert_sent_index_dense(out)
    for doc, text in texts.items():
        assert_covers_non_whitespace(out, doc, text)


def test_small_chunk_limit_keeps_offsets(docs_table):
    stage = Sentencizer(SentencizeConfig(chunk_chars=1_000))
    stage.setup()
    rng = random.Random(7)
    words = ["Revenue", "rose", "5%", "margin", "Q2", "guidance", "cut", "beat", "EPS"]
    parts = []
    while sum(map(len, parts)) < 20_000:
        n = rng.randint(3, 15)
        parts.append(
            " ".join(rng.choice(words) for _ in range(n)) + rng.choice([". ", "! ", "? ", "\n"])
        )
    text = "".join(parts)
    out = stage(docs_table(["doc"], [text]))
    assert_offsets_hold(out, {"doc": text})
    assert_sent_index_dense(out)
    assert_covers_non_whitespace(out, "doc", text)


def _check_spans(text: str, spans: list[tuple[int, int]], limit: int) -> None:
    assert spans[0][0] == 0
    assert spans[-1][1] == len(text)
    for (_, b), (c, _) in itertools.pairwise(spans):
        assert b == c, "spans must be contiguous"
    for a, b in spans:
        assert 0 < b - a <= limit or (a == b == len(text) == 0)


def test_chunk_spans_cut_at_whitespace_and_cover_the_text():
    rng = random.Random(3)
    for _ in range(200):
        limit = rng.randint(20, 80)
        words = [
            "".join(rng.choices("abcXYZ.,!", k=rng.randint(1, 8)))
            for _ in range(rng.randint(1, 120))
        ]
        seps = [rng.choice([" ", "  ", "\n", "\t"]) for _ in words]
        text = "".join(w + s for w, s in zip(words, seps, strict=True))
        spans = chunk_spans(text, limit)
        _check_spans(text, spans, limit)
        assert "".join(text[a:b] for a, b in spans) == text
        # words are at most 8 chars, far below limit/2: every cut follows whitespace
        for _, b in spans[:-1]:
            assert text[b - 1].isspace(), (text, spans, limit)


def test_chunk_spans_without_whitespace_cut_at_the_limit():
    text = "y" * 1_005
    spans = chunk_spans(text, 100)
    _check_spans(text, spans, 100)
    assert spans == [(i, min(i + 100, 1_005)) for i in range(0, 1_005, 100)]


def test_chunk_spans_short_text_is_one_span():
    assert chunk_spans("short text", 100) == [(0, 10)]
    assert chunk_spans("", 100) == [(0, 0)]


def test_unknown_installed_pipeline_raises_model_error():
    name = "xx_docintel_no_such_pipeline_sm"
    stage = Sentencizer(SentencizeConfig(spacy_model=name))
    with pytest.raises(ModelError, match=name):
        stage.setup()


def test_a_saved_spacy_pipeline_loads_by_path(tmp_path, docs_table):
    """Any installed or saved pipeline works; one without a sentence component gets the
    rule-based sentencizer added."""
    import spacy

    nlp = spacy.blank("en")
    nlp.meta["name"] = "audit_pipeline"
    nlp.to_disk(tmp_path / "my_pipeline")
    stage = Sentencizer(SentencizeConfig(spacy_model=str(tmp_path / "my_pipeline")))
    stage.setup()
    assert stage.nlp.has_pipe("sentencizer")
    assert "en_audit_pipeline" in stage.version
    out = stage(docs_table(["d"], ["Sales rose. Costs fell."]))
    assert out[TEXT].to_pylist() == ["Sales rose.", "Costs fell."]


def test_a_document_over_the_sentence_cap_becomes_an_error_row(sentencizer, docs_batch):
    """300,000 sentences (a log dump, not prose): one error row naming the count and the
    limit; its batch-mate gets its sentences; no rows of the refused document are kept."""
    from docintel.pipeline.stages import run_stage

    flood = "Up. " * 300_000  # 1.2 M chars: sentencized chunk by chunk, counted, refused
    batch = docs_batch(["flood", "fine"], [flood, "Profits fell. Guidance was cut."])
    out = run_stage(sentencizer, batch)
    assert out.table[DOC_ID].to_pylist() == ["fine", "fine"]
    (err,) = out.errors.to_pylist()
    assert (err[DOC_ID], err["stage"], err["error_type"]) == (
        "flood", "sentencize", "TooManySentences",
    )  # fmt: skip
    assert "300,000 sentences, over the limit of 20,000" in err["message"]
    assert "max_sentences" in err["message"]


def test_a_blank_pipeline_loads_without_torch() -> None:
    """thinc would import torch (seconds of start-up per replica); a rule-based pipeline
    never uses it, so a fresh process running one must not load it, and torch still
    imports normally afterwards."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from docintel.pipeline.config import SentencizeConfig\n"
        "from docintel.pipeline.stages.sentencize import Sentencizer\n"
        "import pyarrow as pa\n"
        "s = Sentencizer(SentencizeConfig()); s.setup()\n"
        "t = s(pa.table({'doc_id': ['a'], 'text': ['One here. Two there.']}))\n"
        "assert t.num_rows == 2, t\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "print('ok', torch.__version__)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]


def test_a_blank_line_is_a_hard_boundary(sentencizer, docs_table):
    """Issue 32 item 5: a headline and the first sentence are never one sentence, and no
    sentence spans a blank line (spaCy's rule-based sentencizer alone fuses them)."""
    texts = {
        "news": "Bank cuts 1,000 jobs\n\nThe bank said on Tuesday it would cut jobs.\n \t\n"
        "Shares fell 3% in early trade",
        "heading": "Outlook\n\n\nRevenue should grow",
    }
    out = sentencizer(docs_table(list(texts), list(texts.values())))
    got = {d: out.filter(pa.compute.equal(out[DOC_ID], d))[TEXT].to_pylist() for d in texts}
    assert got["news"] == [
        "Bank cuts 1,000 jobs",
        "The bank said on Tuesday it would cut jobs.",
        "Shares fell 3% in early trade",
    ]
    assert got["heading"] == ["Outlook", "Revenue should grow"]
    assert_offsets_hold(out, texts)
    for row in out.to_pylist():  # no stored sentence spans a blank line of the original
        span = texts[row[DOC_ID]][row[START_CHAR] : row[END_CHAR]]
        assert not re.search(r"\n[ \t]*\n", span)


def test_quotes_stay_with_their_sentence(sentencizer, docs_table):
    texts = {
        "straight": 'Profits dropped. "We expect a recovery," the CEO said. "It will take '
        'time." Analysts disagreed.',
        "curly": "Markets rallied. \u201cInflation is easing,\u201d said Smith. \u201cWe are "
        "cautious.\u201d Bonds fell.",
        "colon": 'He said: "Profits fell." "Costs rose," she added.',
    }
    out = sentencizer(docs_table(list(texts), list(texts.values())))
    got = {d: out.filter(pa.compute.equal(out[DOC_ID], d))[TEXT].to_pylist() for d in texts}
    assert got["straight"] == [
        "Profits dropped.",
        '"We expect a recovery," the CEO said.',
        '"It will take time."',
        "Analysts disagreed.",
    ]
    assert got["curly"] == [
        "Markets rallied.",
        "\u201cInflation is easing,\u201d said Smith.",
        "\u201cWe are cautious.\u201d",
        "Bonds fell.",
    ]
    assert got["colon"] == ['He said: "Profits fell."', '"Costs rose," she added.']
    assert_offsets_hold(out, texts)


def test_line_breaks_inside_a_sentence_are_joined(sentencizer, docs_table):
    text = "The bank said it would cut\n1,000 jobs   \r\n  by 2027. It gave no timeline."
    out = sentencizer(docs_table(["d"], [text]))
    rows = out.to_pylist()
    assert [r[TEXT] for r in rows] == [
        "The bank said it would cut 1,000 jobs by 2027.",
        "It gave no timeline.",
    ]
    assert text[rows[0][START_CHAR] : rows[0][END_CHAR]].startswith("The bank")
    assert rows[0][END_CHAR] == text.index("2027.") + len("2027.")
