"""Issue 35: each built-in type is found and replaced in several formats, and what fails a
checksum or a numbering plan (or is only a number of the news) is left alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from docintel.pipeline.privacy import BUILTIN_TYPES, Redactor

REDACTOR = Redactor()

FOUND = {
    "EMAIL_ADDRESS": [
        "ann@example.com",
        "li.wei+billing@mail.example.co.uk",
        "o_neil-2@uni-heidelberg.de",
        "J.Smith@Corp-Bank.COM",
    ],
    "PHONE_NUMBER": [
        "(212) 555-0147",
        "212-555-0147",
        "212.555.0147",
        "1-800-555-0199",
        "+1 (212) 555-0147",
        "+1 212 555 0147",
        "+44 20 7946 0958",
        "+44 (0)20 7946 0958",
        "(+44) 20 7946 0958",
        "0049 30 12345678",
        "+49 (30) 123456",
        "+49-1512-3456789",
        "+33 1 23 45 67 89",
        "+33612345678",
        "+91 98765 43210",
        "+81 3-1234-5678",
        "+61 412 345 678",
        "+55 11 96123-4567",
        "+86 131 2345 6789",
    ],
    "CREDIT_CARD": [
        "4111 1111 1111 1111",  # Visa
        "4111-1111-1111-1111",
        "4111111111111111",
        "5555 5555 5555 4444",  # Mastercard
        "2223 0031 2200 3222",  # Mastercard 2-series
        "3782 822463 10005",  # Amex 4-6-5
        "378282246310005",
        "6011 1111 1111 1117",  # Discover
        "3056 930902 5904",  # Diners 4-6-4
        "3530 1113 3330 0000",  # JCB
        "6200 0000 0000 0005",  # UnionPay
    ],
    "IBAN_CODE": [
        "DE89 3704 0044 0532 0130 00",
        "DE89370400440532013000",
        "GB82 WEST 1234 5698 7654 32",
        "FR14 2004 1010 0505 0001 3M02 606",
        "NL91 ABNA 0417 1643 00",
        "BE68 5390 0754 7034",
        "CH93 0076 2011 6238 5295 7",
        "ES91 2100 0418 4502 0005 1332",
        "IT60 X054 2811 1010 0000 0123 456",
        "NO93 8601 1117 947",
        "DE89-3704-0044-0532-0130-00",
        "de89 3704 0044 0532 0130 00",
    ],
    "US_SSN": ["123-45-6789", "536 22 1234", "536.22.1234"],
    "IP_ADDRESS": [
        "192.168.1.10",
        "8.8.8.8",
        "255.255.255.255",
        "2001:db8::1",
        "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
        "fe80::1ff:fe23:4567:890a",
        "::ffff:192.0.2.1",
    ],
}
CASES = [(kind, value) for kind, values in FOUND.items() for value in values]
TEMPLATES = ("{v}", "Contact: {v}.", "Her details ({v}) were on the form, she said.")


@pytest.mark.parametrize(("kind", "value"), CASES)
@pytest.mark.parametrize("template", TEMPLATES)
def test_each_type_is_found_and_replaced(kind: str, value: str, template: str) -> None:
    text = template.format(v=value)
    redacted, spans = REDACTOR.redact(text)
    assert redacted == template.format(v=f"<{kind}>")
    assert value not in redacted
    assert [s["type"] for s in spans] == [kind]


def test_all_six_types_are_built_in_with_presidio_names() -> None:
    assert set(BUILTIN_TYPES) == set(FOUND)


def test_ssn_digits_in_a_row_only_after_its_name() -> None:
    assert REDACTOR.redact("SSN 536221234 on file")[0] == "SSN <US_SSN> on file"
    assert REDACTOR.redact("social security number: 536221234")[0].endswith("<US_SSN>")
    assert REDACTOR.redact("Order 536221234 shipped")[0] == "Order 536221234 shipped"


NOT_FOUND = [
    # checksum / numbering-plan failures
    "4111 1111 1111 1112",  # Luhn fails
    "4111111111111112",
    "1234 5678 9012 3452",  # Luhn-valid, but no card brand starts with 1
    "DE88 3704 0044 0532 0130 00",  # IBAN check digits wrong
    "GB82 WEST 1234 5698 7654 33",
    "DE89 3704 0044 0532 0130",  # too short for Germany
    "000-12-3456",  # SSN area 000
    "666-12-3456",  # area 666
    "923-45-6789",  # 9xx: an ITIN, not an SSN
    "123-00-4567",  # group 00
    "078-05-1120",  # the advertised (wallet card) number
    "(555) 555-1234",  # area code 555 is not assigned
    "+1 555 555 1234",
    "+44 20 1234",  # too short for the UK
    "256.1.1.1",  # not an IPv4
    "1.2.3.4.5",  # a longer dotted number
    "01.02.03.04",  # leading zeros: a date, not an address
    "10:30:45",  # a time
    "bad@x",  # no TLD
    "@handle",
]


@pytest.mark.parametrize("value", NOT_FOUND)
def test_invalid_values_are_not_flagged(value: str) -> None:
    text = f"The form said {value} and nothing else."
    assert REDACTOR.redact(text) == (text, [])


NEWS = [
    "Revenue rose 12.5% to $4,321.7 million in fiscal 2025, the company said on 2025-03-14.",
    "Order #48213377 shipped on 14.03.2025; invoice INV2025004817 totals EUR 1,250.00.",
    "Shares of AAPL (ISIN US0378331005, CUSIP 037833100) closed at $187.44, up 1.2 percent.",
    "The 10-year yield rose 12 basis points to 4.35% at 10:45:30 GMT; the index +1.5%.",
    "Volume reached 123,456,789 shares between 09:30 and 16:00 ET; ratio 3:1.",
    "The 2024-2025 budget (ZIP 10001-1234) sets aside 1,234.5 million, 0.0012345 a share.",
    "ISBN 978-3-16-148410-0 sold 12 345 678 copies in 2019/2020; case 21-cv-01234.",
    "Bund DE0001102580 and LEI 5493001KJTIIGC8Y1R12 were cited, with ref RF18 5390 0754 7034.",
    "Serial 4111-2222-3333 was recalled; EPS of $2.15-$2.35 for FY2025.",
    "$TSLA $AAPL - Nomura points to weakness at Tesla https://t.co/bd0xbFGjkT",
]


@pytest.mark.parametrize("text", NEWS)
def test_numbers_of_the_news_are_not_flagged(text: str) -> None:
    assert REDACTOR.redact(text) == (text, [])


def test_a_value_running_into_the_next_number_is_cut_back() -> None:
    text = "call +44 20 7946 0958 2 times; IBAN BE68 5390 0754 7034 CODE"
    assert REDACTOR.redact(text)[0] == "call <PHONE_NUMBER> 2 times; IBAN <IBAN_CODE> CODE"
    text = "ref PAY-DE89370400440532013000-7 and BE68 5390 0754 7034-X"
    assert REDACTOR.redact(text)[0] == "ref PAY-<IBAN_CODE>-7 and <IBAN_CODE>-X"


def test_a_value_glued_to_a_word_by_a_dash_is_found() -> None:
    text = "ref-4111 1111 1111 1111, id-123-45-6789, tel-212-555-0147, ip-10.1.2.3"
    assert REDACTOR.redact(text)[0] == (
        "ref-<CREDIT_CARD>, id-<US_SSN>, tel-<PHONE_NUMBER>, ip-<IP_ADDRESS>"
    )
    # but not a part of a longer chain of numbers
    assert REDACTOR.redact("code 7-4111 1111 1111 1111 and 1.123-45-6789")[1] == []


def test_only_the_enabled_types_are_replaced() -> None:
    text = "ann@example.com, (212) 555-0147, 192.168.1.10"
    redacted, spans = Redactor(["IP_ADDRESS", "EMAIL_ADDRESS"], {}).redact(text)
    assert redacted == "<EMAIL_ADDRESS>, (212) 555-0147, <IP_ADDRESS>"
    assert [s["type"] for s in spans] == ["EMAIL_ADDRESS", "IP_ADDRESS"]
    assert Redactor([], {}).redact(text) == (text, [])


def test_detection_needs_no_model_nor_network_library() -> None:
    """Importing and running the redactor loads neither spaCy nor presidio nor tldextract."""
    code = (
        "import sys; from docintel.pipeline.privacy import Redactor; "
        "Redactor().redact('ann@example.com +44 20 7946 0958'); "
        "print(sorted(m for m in ('spacy', 'presidio_analyzer', 'tldextract', 'requests') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
