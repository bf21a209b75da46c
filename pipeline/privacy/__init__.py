"""Personal data kept out (issue 35): detection and redaction of personal values in text.

    from docintel.pipeline.privacy import Redactor
    r = Redactor(["EMAIL_ADDRESS", "PHONE_NUMBER"], {"CUSTOMER_ID": r"CU-\\d{6}"})
    r.redact("Mail ann@example.com or call (212) 555-0147 about CU-004211.")
    # ('Mail <EMAIL_ADDRESS> or call <PHONE_NUMBER> about <CUSTOMER_ID>.', [{...}, ...])

Built-in types, named as in Presidio: EMAIL_ADDRESS, PHONE_NUMBER, CREDIT_CARD, IBAN_CODE,
US_SSN, IP_ADDRESS (what each finds: :mod:`docintel.pipeline.privacy.detectors`). User
patterns: ``[privacy.patterns] NAME = "regex"`` (:func:`compile_patterns`).

Why phonenumbers + python-stdnum + regexes, not presidio-analyzer: the values to find are
the ones a checksum or a numbering plan can confirm, and these two libraries are where that
knowledge lives (Presidio's own phone recogniser wraps phonenumbers). Presidio's
AnalyzerEngine loads a spaCy model through its NLP engine by default, and its e-mail
recogniser looks domains up with tldextract, which fetches the public-suffix list on first
use: both are to be kept off a run that may download nothing. Its pattern recognisers also
score and enhance each match with context words, which costs time on every sentence, while
a run needs redaction to be a small share of a CPU run (about 3.5 ms a sentence end to end):
here each type runs one candidate regex (a few microseconds on a sentence without a match,
most sentences) and the validators (phonenumbers' metadata, stdnum's IBAN registry, Luhn
and SSN rules, :mod:`ipaddress`) only on candidates. phonenumbers' own PhoneNumberMatcher
was measured at about 0.7 ms a sentence, too slow to run on every one. Both libraries ship
their data inside their wheels: nothing is downloaded at run time, no model is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from docintel.pipeline.privacy.detectors import BUILTIN_TYPES, DETECTORS
    from docintel.pipeline.privacy.patterns import check_types, compile_patterns
    from docintel.pipeline.privacy.redactor import (
        OffsetMap,
        Redaction,
        Redactor,
        resolve,
        spans_within,
    )

# Where each name lives. Imported on first use (PEP 562): the config tree declares the
# [privacy] section through the stage module (docintel.pipeline.privacy.stage), and every
# CLI start imports the config; phonenumbers and python-stdnum (~50 ms) load only when a
# setting is checked or a replica redacts.
_HOMES = {
    "BUILTIN_TYPES": "detectors",
    "DETECTORS": "detectors",
    "check_types": "patterns",
    "compile_patterns": "patterns",
    "OffsetMap": "redactor",
    "Redaction": "redactor",
    "Redactor": "redactor",
    "resolve": "redactor",
    "spans_within": "redactor",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "BUILTIN_TYPES",
    "DETECTORS",
    "OffsetMap",
    "Redaction",
    "Redactor",
    "check_types",
    "compile_patterns",
    "resolve",
    "spans_within",
]
