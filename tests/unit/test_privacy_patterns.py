"""Issue 35, bad input: a privacy setting is refused before any work (ConfigError, exit code
2), naming the type or pattern at fault."""

from __future__ import annotations

import re

import pytest

from docintel.pipeline.errors import ConfigError, UsageError
from docintel.pipeline.exitcodes import ExitCode, exit_code
from docintel.pipeline.privacy import BUILTIN_TYPES, Redactor, check_types, compile_patterns


def test_config_error_is_exit_code_two() -> None:
    assert issubclass(ConfigError, UsageError)
    assert exit_code(ConfigError("x")) == ExitCode.USAGE == 2


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("CU-(\\d{6}", "missing )"),
        ("[A-Z", "unterminated character set"),
        ("*abc", "nothing to repeat"),
        ("(?P<x>a)(?P<x>b)", "redefinition of group name"),
    ],
)
def test_an_invalid_regex_is_refused_by_name(pattern: str, says: str) -> None:
    with pytest.raises(ConfigError, match=r"\[privacy\.patterns\] CUSTOMER_ID: invalid") as err:
        compile_patterns({"OK_ONE": r"X\d+", "CUSTOMER_ID": pattern})
    assert says in str(err.value)
    with pytest.raises(ConfigError, match="CUSTOMER_ID"):
        Redactor(None, {"CUSTOMER_ID": pattern})


@pytest.mark.parametrize(
    "pattern", ["a*", "\\d?", "(abc)?", "x|", "\\b", "^", "$", "(?=abc)", "(?<=a)", "()", "a{0,3}"]
)
def test_a_pattern_matching_the_empty_string_is_refused(pattern: str) -> None:
    with pytest.raises(ConfigError, match=r"TICKET: the regular expression can match the empty"):
        compile_patterns({"TICKET": pattern})


@pytest.mark.parametrize("pattern", ["a+", "\\d{1,3}", "(?=ab)a", "\\bCU-\\d+\\b", "x|y"])
def test_a_pattern_of_at_least_one_character_is_accepted(pattern: str) -> None:
    assert compile_patterns({"TICKET": pattern}) == {"TICKET": re.compile(pattern)}


def test_an_unknown_type_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown type 'EMAIL'.*EMAIL_ADDRESS"):
        check_types(["PHONE_NUMBER", "EMAIL"])
    with pytest.raises(ConfigError, match="'PERSON'"):
        Redactor(["PERSON"], {})
    with pytest.raises(ConfigError, match="'phone_number'"):
        Redactor(["phone_number"], {})


def test_types_come_back_in_priority_order_once() -> None:
    assert check_types(None) == BUILTIN_TYPES
    assert check_types(["PHONE_NUMBER", "EMAIL_ADDRESS", "PHONE_NUMBER"]) == (
        "EMAIL_ADDRESS",
        "PHONE_NUMBER",
    )
    assert check_types("US_SSN") == ("US_SSN",)
    assert check_types([]) == ()


@pytest.mark.parametrize("name", ["customer_id", "1ID", "CUSTOMER-ID", "", "Customer", "A B"])
def test_a_pattern_name_must_be_an_upper_case_identifier(name: str) -> None:
    with pytest.raises(ConfigError, match="upper-case identifier") as err:
        compile_patterns({name: "x"})
    assert repr(name) in str(err.value)


def test_a_pattern_may_not_take_a_built_in_name() -> None:
    with pytest.raises(ConfigError, match="EMAIL_ADDRESS: this is a built-in type's name"):
        compile_patterns({"EMAIL_ADDRESS": "x@y"})


@pytest.mark.parametrize("pattern", ["", 5, None, ["x"]])
def test_a_pattern_must_be_a_non_empty_string(pattern: object) -> None:
    with pytest.raises(ConfigError, match="REF: the pattern must be a non-empty string"):
        compile_patterns({"REF": pattern})  # type: ignore[dict-item]


def test_patterns_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match="must be a table"):
        compile_patterns(["REF = x"])  # type: ignore[arg-type]
    assert compile_patterns(None) == {}
    assert compile_patterns({}) == {}


def test_the_order_given_is_kept() -> None:
    compiled = compile_patterns({"ZED": "z+", "ALPHA": "a+", "MID_1": "m+"})
    assert list(compiled) == ["ZED", "ALPHA", "MID_1"]
