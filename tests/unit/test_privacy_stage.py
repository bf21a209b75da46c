"""Issue 35: the ``privacy`` stage on its own (no Ray): where it joins the chain, what it
does to sentence rows, what a run records of its setting, and every refusal of a bad
setting, from the config file and the command line (exit 2, naming the culprit)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from docintel.jobs.cli import app
from docintel.jobs.cli_run import redact_setting
from docintel.pipeline import registry
from docintel.pipeline.batch import Batch
from docintel.pipeline.config import Config, load_config
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.exitcodes import exit_code
from docintel.pipeline.output.protocol import recorded_config
from docintel.pipeline.privacy import OffsetMap, Redaction, Redactor
from docintel.pipeline.privacy.stage import (
    PII,
    PII_TYPE,
    PRIVACY,
    PrivacyConfig,
    Redact,
    manifest_record,
    plan_setting,
    redact_document,
)
from docintel.pipeline.stages.base import run_stage
from docintel.pipeline.stages.sentencize import SentencizeConfig, Sentencizer, joined

VALUES = {
    "EMAIL_ADDRESS": "li.wei+billing@mail.example.co.uk",
    "PHONE_NUMBER": "+44 20 7946 0958",
    "CREDIT_CARD": "4111 1111 1111 1111",
    "IBAN_CODE": "DE89 3704 0044 0532 0130 00",
    "US_SSN": "536-22-1234",
    "IP_ADDRESS": "2001:db8::1",
}
CUSTOMER = "CU-004211"
SECRET_REGEX = r"CU-\d{6}|Jane Roe"  # a user regex may spell out a value itself
DOC = (
    f"Dear team, write to {VALUES['EMAIL_ADDRESS']} or call\n{VALUES['PHONE_NUMBER']} today. "
    f"Card {VALUES['CREDIT_CARD']} was charged twice. Refund to {VALUES['IBAN_CODE']}.\n\n"
    f"SSN {VALUES['US_SSN']}, login from {VALUES['IP_ADDRESS']}, customer {CUSTOMER}. "
    "Revenue rose 4.5% to $12.3 million in 2024."
)


def _cfg(**overrides: object) -> Config:
    return load_config(None, {"privacy.patterns": {"CUSTOMER_ID": SECRET_REGEX}, **overrides})


def _sentences(doc: str = DOC, doc_id: str = "d1") -> pa.Table:
    stage = Sentencizer(SentencizeConfig())
    stage.setup()
    return stage(pa.table({"doc_id": [doc_id], "text": [doc]}))


def _redact(table: pa.Table, cfg: PrivacyConfig) -> pa.Table:
    stage = Redact(cfg)
    stage.setup()
    return stage(table)


# --- the chain and the config -----------------------------------------------------------


def test_off_by_default_and_right_after_sentencize_when_asked() -> None:
    assert not load_config().privacy.on
    assert "privacy" not in registry.chain(load_config()).names
    for redact in (True, ["EMAIL_ADDRESS"]):
        names = registry.chain(load_config(None, {"privacy.redact": redact})).names
        assert names[names.index("sentencize") + 1] == "privacy"
        assert names.index("privacy") < names.index("embed") < names.index("classify")
    # an explicit stage list that leaves it out gets it right after sentencize
    cfg = load_config(
        None, {"privacy.redact": True, "pipeline.stages": ["sentencize", "embed", "classify"]}
    )
    chain = registry.chain(cfg).names
    assert chain[chain.index("sentencize") + 1] == "privacy"
    # named without the setting: refused, naming the setting
    with pytest.raises(ConfigError, match=r"\[privacy\] redact \(or --redact\)"):
        registry.chain(
            load_config(None, {"pipeline.stages": ["sentencize", "privacy", "embed", "classify"]})
        )


def test_its_declaration() -> None:
    assert PRIVACY.section is PrivacyConfig and not PRIVACY.has_weights
    assert PRIVACY.pool.gpu_share == 0  # the GPU stages' shares of a card stay as they were
    assert load_config().resources.pool("privacy").gpu_replicas == 0
    assert registry.check_columns(registry.chain(_cfg(**{"privacy.redact": True})))
    placeholder = PRIVACY.placeholder(load_config())(pa.table({"x": [1, 2]}))
    assert placeholder[PII].type == PII_TYPE and placeholder[PII].to_pylist() == [[], []]


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"privacy.redact": ["EMAIL_ADDRESS", "PASSPORT"]}, "'PASSPORT'"),
        ({"privacy.patterns": {"ORDER_NO": "ORD-(\\d+"}}, "ORDER_NO: invalid regular expression"),
        ({"privacy.patterns": {"ORDER_NO": "\\d*"}}, "ORDER_NO: the regular expression can match"),
        ({"privacy.patterns": {"ORDER_NO": "^|$"}}, "ORDER_NO: the regular expression can match"),
        ({"privacy.patterns": {"order_no": "ORD-\\d+"}}, "'order_no'"),
        ({"privacy.patterns": {"EMAIL_ADDRESS": "x+"}}, "EMAIL_ADDRESS: this is a built-in"),
        ({"privacy.redact": []}, "names no type"),
        ({"privacy.redact": "yes"}, "privacy.redact"),
    ],
)
def test_a_bad_setting_is_refused_at_load_naming_it(setting: dict, named: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, setting)
    assert named in str(e.value) and exit_code(e.value) == 2
    assert "ORD-(" not in str(e.value)  # the regex itself is not repeated


def test_patterns_are_checked_even_while_redaction_is_off(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[privacy]\nredact = false\n[privacy.patterns]\nX_ID = 'a?'\n")
    with pytest.raises(ConfigError, match=r"\[privacy.patterns\] X_ID"):
        load_config(path)
    path.write_text("[privacy]\nredact = []\n[privacy.patterns]\nX_ID = 'X-\\d+'\n")
    cfg = load_config(path)  # own patterns only: an empty list of built-in types
    assert cfg.privacy.on and cfg.privacy.redactor().types == ()


def test_the_command_line_options() -> None:
    assert redact_setting(None, None) is None  # the config's setting
    assert redact_setting(True, None) is True
    assert redact_setting(False, None) is False
    assert redact_setting(None, ["EMAIL_ADDRESS,PHONE_NUMBER", " US_SSN "]) == [
        "EMAIL_ADDRESS", "PHONE_NUMBER", "US_SSN",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="contradict"):
        redact_setting(False, ["EMAIL_ADDRESS"])


@pytest.mark.parametrize(
    ("args", "toml", "named"),
    [
        (["--redact-only", "EMAIL_ADDRESS,PASSPRT"], "", "'PASSPRT'"),
        (["--redact"], "[privacy.patterns]\nORDER_NO = 'ORD-(\\d+'\n", "ORDER_NO"),
        (["--redact"], "[privacy.patterns]\nORDER_NO = '(ORD)?'\n", "ORDER_NO"),
        (["--no-redact", "--redact-only", "US_SSN"], "", "contradict"),
    ],
)
def test_docintel_run_refuses_a_bad_setting_with_exit_2_before_any_work(
    tmp_path: Path, args: list[str], toml: str, named: str
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["run", str(tmp_path / "missing.parquet"), str(out), "-c", str(cfg), *args]
    )
    assert result.exit_code == 2, result.output
    assert named in " ".join(result.output.split())
    assert not out.exists()


# --- the stage on sentence rows -----------------------------------------------------------


def test_sentences_are_redacted_with_their_spans_and_original_offsets() -> None:
    sentences = _sentences()
    out = _redact(sentences, _cfg(**{"privacy.redact": True}).privacy)
    assert out.column_names == [*sentences.column_names, PII]
    assert out.schema.field(PII).type == PII_TYPE
    # everything but the text is the sentencizer's: start/end index the original document
    for name in sentences.column_names:
        if name != "text":
            assert out[name].equals(sentences[name])
    found: list[str] = []
    for row, before in zip(out.to_pylist(), sentences.to_pylist(), strict=True):
        original = joined(DOC[row["start_char"] : row["end_char"]])
        assert original == before["text"]
        assert row["text"] == Redactor(None, {"CUSTOMER_ID": SECRET_REGEX}).redact(original)[0]
        for span in row[PII]:
            assert row["text"][span["start"] : span["end"]] == f"<{span['type']}>"
            found.append(span["type"])
    assert sorted(found) == sorted([*VALUES, "CUSTOMER_ID"])
    stored = json.dumps(out.to_pylist())
    for value in [*VALUES.values(), CUSTOMER]:
        assert value not in stored
    assert "Revenue rose 4.5% to $12.3 million in 2024." in out["text"].to_pylist()


def test_a_value_the_sentencizer_cut_in_two_is_found_and_its_sentences_become_one() -> None:
    """spaCy ends a sentence inside ``J.Smith@Corp-Bank.COM`` (after ``Bank.``): the
    document's sentences are redacted as one text, and the two halves' rows become one."""
    doc = "Write to J.Smith@Corp-Bank.COM about it. Shares fell 3%. Call (212) 555-0147 now."
    sentences = _sentences(doc)
    assert sentences.num_rows == 4 and sentences["text"][1].as_py().startswith("COM")
    out = _redact(sentences, load_config(None, {"privacy.redact": True}).privacy).to_pylist()
    assert [r["text"] for r in out] == [
        "Write to <EMAIL_ADDRESS> about it.", "Shares fell 3%.", "Call <PHONE_NUMBER> now.",
    ]  # fmt: skip
    assert [r["sent_index"] for r in out] == [0, 1, 2]  # counted again from 0
    redactor = Redactor()
    for r in out:
        assert r["text"] == redactor.redact(doc[r["start_char"] : r["end_char"]])[0]
        assert [r["text"][p["start"] : p["end"]] for p in r[PII]] == [
            f"<{p['type']}>" for p in r[PII]
        ]
    # the sentences of other documents keep their index
    on = load_config(None, {"privacy.redact": True}).privacy
    other = _redact(_sentences("Shares fell 3%. Call (212) 555-0147 now.", "d2"), on)
    assert other["sent_index"].to_pylist() == [0, 1]


def test_redact_document_joins_sentences_by_what_lay_between_them() -> None:
    """Sentences that touched are joined with nothing between them, others with a blank;
    a value across a blank (a line break inside a number) joins them too."""
    texts, starts, ends = ["Tel +44 20", "7946 0958 today.", "Fine."], [0, 12, 29], [10, 28, 34]
    out = redact_document(Redactor(["PHONE_NUMBER"]), texts, starts, ends)
    assert [(s.text, s.start_char, s.end_char, s.row) for s in out] == [
        ("Tel <PHONE_NUMBER> today.", 0, 28, 0), ("Fine.", 29, 34, 2),
    ]  # fmt: skip
    assert out[0].pii == [{"type": "PHONE_NUMBER", "start": 4, "end": 18}]
    clean = redact_document(Redactor(), ["A b.", "C d."], [0, 5], [4, 9])
    assert [(s.text, s.row, s.pii) for s in clean] == [("A b.", 0, []), ("C d.", 1, [])]


def test_only_the_chosen_types() -> None:
    out = _redact(_sentences(), load_config(None, {"privacy.redact": ["US_SSN"]}).privacy)
    text = " ".join(out["text"].to_pylist())
    assert "<US_SSN>" in text and VALUES["US_SSN"] not in text
    assert VALUES["EMAIL_ADDRESS"] in text and CUSTOMER in text
    assert [s["type"] for spans in out[PII].to_pylist() for s in spans] == ["US_SSN"]


def test_rows_without_values_are_unchanged_and_an_empty_batch_keeps_the_schema() -> None:
    clean = _sentences("Shares fell 3% on Tuesday. The bank cut 1,200 jobs.")
    out = _redact(clean, _cfg(**{"privacy.redact": True}).privacy)
    assert out["text"].equals(clean["text"]) and out[PII].to_pylist() == [[], []]
    empty = _redact(clean.slice(0, 0), _cfg(**{"privacy.redact": True}).privacy)
    assert empty.num_rows == 0 and empty.schema.field(PII).type == PII_TYPE


def test_the_stage_pickles_as_its_config_and_rebuilds_in_the_replica() -> None:
    stage = pickle.loads(pickle.dumps(Redact(_cfg(**{"privacy.redact": True}).privacy)))
    stage.setup()
    assert stage.backend == "cpu-fp32" and stage.version.startswith("redact:phonenumbers-")
    assert SECRET_REGEX not in stage.version


class _Failing:
    """A redactor that fails on one sentence with the sentence in its message, as a
    library's exception may quote what it was given."""

    def redact_mapped(self, text: str) -> Redaction:
        if "charged" in text:
            raise ValueError(f"cannot parse {text!r}")
        return Redaction(text.upper(), [], OffsetMap())


def test_a_failure_is_an_error_row_without_the_text_and_the_document_goes_no_further() -> None:
    sentences = pa.concat_tables([_sentences(DOC, "d1"), _sentences("All fine here.", "d2")])
    stage = Redact(_cfg(**{"privacy.redact": True}).privacy)
    stage.setup()
    stage.redactor = _Failing()  # type: ignore[assignment]
    batch = run_stage(stage, Batch("b0", pa.array(["d1", "d2"]), sentences))
    assert set(batch.table["doc_id"].to_pylist()) == {"d2"}  # d1's rows are gone, all of them
    (error,) = batch.errors.to_pylist()
    assert (error["doc_id"], error["stage"], error["error_type"]) == (
        "d1", "privacy", "RedactionFailed",
    )  # fmt: skip
    assert "ValueError" in error["message"] and "charged" not in error["message"]
    for value in VALUES.values():
        assert value not in json.dumps(batch.errors.to_pylist())


# --- what a run records --------------------------------------------------------------------


def test_what_the_manifest_and_the_plan_key_record() -> None:
    off = load_config()
    assert manifest_record(off) == {"redacted": False} == plan_setting(off)
    on = _cfg(**{"privacy.redact": ["PHONE_NUMBER", "EMAIL_ADDRESS"]})
    assert manifest_record(on) == {
        "redacted": True,
        "types": ["EMAIL_ADDRESS", "PHONE_NUMBER"],
        "patterns": ["CUSTOMER_ID"],
    }
    key = plan_setting(on)
    assert key["types"] == ["EMAIL_ADDRESS", "PHONE_NUMBER"]
    assert key["patterns"]["CUSTOMER_ID"].startswith("sha256:")
    other = _cfg(**{"privacy.redact": ["PHONE_NUMBER", "EMAIL_ADDRESS"]}).with_overrides(
        {"privacy.patterns": {"CUSTOMER_ID": r"CU-\d{7}"}}
    )
    assert plan_setting(other) != key  # another regex under the same name: another plan
    recorded = json.dumps([recorded_config(on), manifest_record(on), key])
    assert "CU-" not in recorded and "Jane Roe" not in recorded
    assert recorded_config(on)["privacy"]["patterns"] == key["patterns"]


def test_no_user_stage_may_run_before_redaction(user_package: Path) -> None:
    """A user stage listed before ``privacy`` (or before sentencize) would see the raw text:
    refused while redaction is on; after it, or without redaction, it is welcome."""
    from tests.userstage import ENTRY

    words = {"stages.keywords.words": ["fell"], "privacy.redact": True}
    for stages in (
        ["sentencize", ENTRY, "privacy", "embed", "classify"],
        [ENTRY, "sentencize", "embed", "classify"],
    ):
        with pytest.raises(ConfigError, match=r"user stage\(s\) \['keywords'\] before 'privacy'"):
            registry.chain(load_config(None, {**words, "pipeline.stages": stages}))
    after = ["sentencize", ENTRY, "embed", "classify"]  # privacy goes in right after sentencize
    names = registry.chain(load_config(None, {**words, "pipeline.stages": after})).names
    assert names[names.index("sentencize") + 1] == "privacy"
    assert names.index("keywords") > names.index("privacy")
    off = load_config(None, {"stages.keywords.words": ["fell"], "pipeline.stages": after})
    assert "keywords" in registry.chain(off).names
