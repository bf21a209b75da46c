"""The built-in detectors: a cheap candidate regex per type, then a validator on each candidate.

Each detector is ``find(text) -> list[(start, end)]`` of validated values in ``text``. A
hint that every value of the type must contain (a character test, or a short regex that
starts with a character class, which the regex engine scans for fast) gates the candidate
regex, so a sentence that holds nothing (most sentences) costs a few microseconds. The
validators (phonenumbers, python-stdnum, :mod:`ipaddress`) run only on what a candidate
regex found. A candidate that fails validation but runs on into the next number
("+44 20 7946 0958 2025") is cut back at its group boundaries, longest first, until one
prefix validates (:func:`_longest_valid`).

What each type finds, and what it leaves:

- ``EMAIL_ADDRESS``: ``local@domain.tld``, the TLD alphabetic (2-24 letters); no look-up of
  the public-suffix list (nothing is downloaded).
- ``PHONE_NUMBER``: international numbers written with ``+`` or ``00`` and a country code,
  in any grouping (spaces, dots, dashes, slashes, ``(0)``), valid by phonenumbers' metadata
  for that country; North American national numbers ``(212) 555-0147``, ``212-555-0147``,
  ``212.555.0147``, ``1-800-555-0199``, valid for a NANP country. Not: other countries'
  national formats without a country code, or ten digits written without separators
  (too close to order ids and amounts).
- ``CREDIT_CARD``: 13-19 digits, compact or grouped 4-4-4-4(-3) / 4-6-4(5) by one kind of
  separator, Luhn-valid, and with a known brand prefix and length (Visa, Mastercard, Amex,
  Discover, Diners, JCB, UnionPay, Maestro, Mir).
- ``IBAN_CODE``: compact or in groups of four (spaces or dashes), any case; the country's
  length and structure and the ISO 7064 mod-97 check digits (python-stdnum's IBAN
  registry). A country's own account-number check (``check_country``) is not required.
- ``US_SSN``: ``AAA-GG-SSSS`` with one kind of separator (``-``, space, ``.``), or nine
  digits right after "SSN" / "social security number"; python-stdnum's rules (no area 000,
  666 or 9xx, no group 00, no serial 0000, not the known advertised numbers).
- ``IP_ADDRESS``: IPv4 dotted quads (no leading zeros, not part of a longer dotted number)
  and IPv6 in full, compressed or IPv4-mapped forms, as :mod:`ipaddress` parses them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

import phonenumbers
from stdnum import iban as stdnum_iban
from stdnum import luhn
from stdnum.us import ssn as stdnum_ssn

Span = tuple[int, int]

# ---------------------------------------------------------------------------- EMAIL_ADDRESS
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+"
    r"[A-Za-z]{2,24}(?![A-Za-z0-9-])"
)


def find_emails(text: str) -> list[Span]:
    if "@" not in text:
        return []
    return [m.span() for m in _EMAIL.finditer(text)]


# ---------------------------------------------------------------------------- IP_ADDRESS
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\d|\.\d)")
_IPV4_HINT = re.compile(r"\d\.\d{1,3}\.\d{1,3}\.\d")
_IPV6 = re.compile(
    r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4}|:)?(?::[0-9A-Fa-f]{0,4}){2,8}"
    r"(?:\.\d{1,3}){0,3}(?![\w:])"
)


def _ipv6_ok(candidate: str) -> bool:
    groups = [g for g in candidate.split(":") if g]
    if len(groups) < 2 or ("::" not in candidate and len(groups) < 7):
        return False  # "10:30:45" and the like: too few groups to be an address
    if sum(len(g) for g in groups) < 4:
        return False  # "A::B", "1::2": prose or code, not a host (loopback ::1 is no one's)
    try:
        ipaddress.IPv6Address(candidate)
    except ValueError:
        return False
    return True


def find_ips(text: str) -> list[Span]:
    found = [m.span() for m in _IPV4.finditer(text)] if _IPV4_HINT.search(text) else []
    if text.count(":") < 2:
        return found
    for m in _IPV6.finditer(text):
        start, end = m.span()
        candidate = m.group()
        if candidate.endswith(":") and not candidate.endswith("::"):
            candidate, end = candidate[:-1], end - 1  # "... fe80::1: next" - the colon is prose
        if _ipv6_ok(candidate):
            found.append((start, end))
    return found


# ---------------------------------------------------------------------------- helpers


def _cut_points(candidate: str, is_part: Callable[[str], bool]) -> list[int]:
    """Ends of the groups of ``candidate`` (a group: a run of characters ``is_part`` accepts),
    longest first."""
    cuts = [
        i
        for i in range(1, len(candidate) + 1)
        if is_part(candidate[i - 1]) and (i == len(candidate) or not is_part(candidate[i]))
    ]
    return cuts[::-1]


def _longest_valid(
    candidate: str, cuts: list[int], valid: Callable[[str], bool], max_tries: int = 4
) -> int:
    """The longest prefix ``candidate[:cut]`` that ``valid`` accepts (its length), 0 if none.
    Only the ``max_tries`` longest prefixes are tried: a value runs into at most a few
    following groups."""
    for cut in cuts[:max_tries]:
        if valid(candidate[:cut]):
            return cut
    return 0


# ---------------------------------------------------------------------------- PHONE_NUMBER
_PHONE_INTL = re.compile(r"(?<![\w+])(?:\(\+\d{1,3}\)[ .-]?|\+|\b00(?=[1-9]))\d[\d()\-. /]{4,24}\d")
_PHONE_NANP = re.compile(
    r"(?<![\w+])(?<!\d[.-])(?:\+?1[ .-]?)?(?:\(\d{3}\)[ .-]?|\d{3}[ .-])\d{3}[ .-]\d{4}"
    r"(?![\w]|[-.]\d)"
)
_PHONE_NANP_HINT = re.compile(r"\d{3}[ .-]\d{4}")
_PHONE_PART = "0123456789)"


def _intl_valid(candidate: str) -> bool:
    digits = sum(c.isdigit() for c in candidate)
    if not 7 <= digits <= 17 or candidate.count("(") != candidate.count(")"):
        return False
    number = "+" + candidate[2:] if candidate.startswith("00") else candidate
    try:
        parsed = phonenumbers.parse(number, None)
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_valid_number(parsed)


def _nanp_valid(candidate: str) -> bool:
    try:
        parsed = phonenumbers.parse(candidate, "US")
    except phonenumbers.NumberParseException:
        return False
    return parsed.country_code == 1 and phonenumbers.is_valid_number(parsed)


def find_phones(text: str) -> list[Span]:
    found: list[Span] = []
    if "+" in text or "00" in text:
        for m in _PHONE_INTL.finditer(text):
            cuts = _cut_points(m.group(), lambda c: c in _PHONE_PART)
            if length := _longest_valid(m.group(), cuts, _intl_valid):
                found.append((m.start(), m.start() + length))
    if _PHONE_NANP_HINT.search(text):
        found.extend(m.span() for m in _PHONE_NANP.finditer(text) if _nanp_valid(m.group()))
    return found


# ---------------------------------------------------------------------------- CREDIT_CARD
_CARD = re.compile(
    r"(?<!\d)(?<!\d[.-])(?:\d{13,19}"
    r"|\d{4}(?P<a>[ -])\d{4}(?P=a)\d{4}(?P=a)\d{4}(?:(?P=a)\d{3})?"
    r"|\d{4}(?P<b>[ -])\d{6}(?P=b)\d{4,5})(?!\d|-\d)"
)
_CARD_HINT = re.compile(r"\d{4}[ -]?\d{4}")
# (issuer prefixes, lengths) of the card brands
_BRANDS: tuple[tuple[tuple[str, ...], frozenset[int]], ...] = (
    (("4",), frozenset({13, 16, 19})),  # Visa
    (tuple(str(p) for p in range(51, 56)), frozenset({16})),  # Mastercard
    (tuple(str(p) for p in range(2221, 2721)), frozenset({16})),  # Mastercard 2-series
    (("34", "37"), frozenset({15})),  # American Express
    (("6011", "65", *(str(p) for p in range(644, 650))), frozenset(range(16, 20))),  # Discover
    (
        ("300", "301", "302", "303", "304", "305", "36", "38", "39"),
        frozenset(range(14, 20)),
    ),  # Diners
    (tuple(str(p) for p in range(3528, 3590)), frozenset(range(16, 20))),  # JCB
    (("62",), frozenset(range(16, 20))),  # UnionPay
    (("50", "56", "57", "58", "67"), frozenset(range(13, 20))),  # Maestro
    (("2200", "2201", "2202", "2203", "2204"), frozenset(range(16, 20))),  # Mir
)


def _card_valid(digits: str) -> bool:
    brand = any(
        len(digits) in lengths and digits.startswith(prefixes) for prefixes, lengths in _BRANDS
    )
    return brand and luhn.is_valid(digits)


def find_cards(text: str) -> list[Span]:
    found: list[Span] = []
    if not _CARD_HINT.search(text):
        return found
    for m in _CARD.finditer(text):
        if _card_valid(m.group().replace(" ", "").replace("-", "")):
            found.append(m.span())
    return found


# ---------------------------------------------------------------------------- IBAN_CODE
_IBAN = re.compile(
    r"(?<![A-Za-z0-9])[A-Za-z]{2}\d{2}(?:[ -]?[A-Za-z0-9]{4}){2,8}(?:[ -]?[A-Za-z0-9]{1,3})?"
    r"(?![A-Za-z0-9])"
)

_IBAN_HINT = re.compile(r"\d\d[ -]?[A-Za-z0-9]{4}[ -]?[A-Za-z0-9]{4}")


def _iban_valid(candidate: str) -> bool:
    compact = candidate.replace(" ", "").replace("-", "").upper()
    return len(compact) >= 15 and stdnum_iban.is_valid(compact, check_country=False)


def find_ibans(text: str) -> list[Span]:
    found: list[Span] = []
    if not _IBAN_HINT.search(text):
        return found
    for m in _IBAN.finditer(text):
        cuts = _cut_points(m.group(), str.isalnum)
        if length := _longest_valid(m.group(), cuts, _iban_valid):
            found.append((m.start(), m.start() + length))
    return found


# ---------------------------------------------------------------------------- US_SSN
_SSN = re.compile(r"(?<!\d)(?<!\d[-.])\d{3}(?P<s>[- .])\d{2}(?P=s)\d{4}(?!\d|[-.]\d)")
_SSN_HINT = re.compile(r"\d{3}[- .]\d{2}[- .]\d{4}")
_NINE_DIGITS = re.compile(r"\d{9}")
_SSN_CONTEXT = re.compile(
    r"(?i:\b(?:SSN|social security (?:number|no|#)))[\s#:.]{0,4}(?:is\s+)?(\d{9})(?!\d)"
)


def _ssn_valid(candidate: str) -> bool:
    return stdnum_ssn.is_valid("".join(c for c in candidate if c.isdigit()))


def find_ssns(text: str) -> list[Span]:
    found: list[Span] = []
    if _SSN_HINT.search(text):
        found.extend(m.span() for m in _SSN.finditer(text) if _ssn_valid(m.group()))
    if _NINE_DIGITS.search(text):
        found.extend(m.span(1) for m in _SSN_CONTEXT.finditer(text) if stdnum_ssn.is_valid(m[1]))
    return found


# Priority when two values of the same length overlap: the most specific (checksummed or
# most structured) type first; phone numbers, the loosest, last.
DETECTORS: dict[str, Callable[[str], list[Span]]] = {
    "EMAIL_ADDRESS": find_emails,
    "IBAN_CODE": find_ibans,
    "CREDIT_CARD": find_cards,
    "US_SSN": find_ssns,
    "IP_ADDRESS": find_ips,
    "PHONE_NUMBER": find_phones,
}
BUILTIN_TYPES: tuple[str, ...] = tuple(DETECTORS)
