"""Redaction quality and cost (issue 35): recall per type on a generated, seeded test set of
personal values across countries and formats, false placeholders on clean news text full of
numbers, and throughput.

    .venv/bin/python bench/redact_quality.py                 # defaults: 300 values a type
    .venv/bin/python bench/redact_quality.py --per-type 1000 --seed 7 --show 20

Recall: a value counts as found when it is gone from the redacted sentence and a placeholder
of its own type covers it (through the offset map). Clean text: the written news sentences
(data/news_style_check), the tweets (data/twitter_fin_sentiment, all files) and generated
sentences of amounts, percentages, dates, times, order ids, ISINs, CUSIPs and tickers;
every placeholder there is false. Throughput: ``Redactor().redact`` over the clean
sentences, one process, one core; the cost is set against a CPU run's ~300 sentences/s.
"""

from __future__ import annotations

import argparse
import csv
import ipaddress
import random
import string
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import phonenumbers
from stdnum import iban as stdnum_iban
from stdnum import luhn
from stdnum.us import ssn as stdnum_ssn

from docintel.pipeline.privacy import BUILTIN_TYPES, Redactor

REPO = Path(__file__).resolve().parent.parent
NEWS_FILES = (
    REPO / "data" / "news_style_check" / "news_sentences.csv",
    *sorted((REPO / "data" / "twitter_fin_sentiment").glob("*.csv")),
)
CPU_RUN_SENTENCES_PER_S = 300  # a CPU run embeds ~250-300 sentences/s on 2 cores
COST_SHARE_TARGET = 0.15  # issue 35: redaction at most 15% of a CPU run

PHONE_REGIONS = (
    "US", "CA", "GB", "DE", "FR", "IN", "JP", "AU", "BR", "ES", "IT", "NL",
    "CH", "SE", "MX", "ZA", "SG", "CN", "KR", "PL", "IE", "AE",
)  # fmt: skip
# IBAN structure per country: (country, BBAN spec) with n digits, a letters, c alphanumerics
IBAN_SPECS = (
    ("DE", "18n"), ("GB", "4a14n"), ("FR", "10n11c2n"), ("ES", "20n"), ("IT", "1a10n12c"),
    ("NL", "4a10n"), ("BE", "12n"), ("CH", "5n12c"), ("AT", "16n"), ("PL", "24n"),
    ("SE", "20n"), ("NO", "11n"), ("IE", "4a14n"), ("PT", "21n"), ("DK", "14n"),
    ("FI", "14n"), ("LU", "3n13c"), ("SA", "2n18c"),
)  # fmt: skip
# (brand, issuer prefixes, length, grouping)
CARD_BRANDS = (
    ("visa", ("4",), 16, (4, 4, 4, 4)), ("visa13", ("4",), 13, None),
    ("mastercard", ("51", "52", "53", "54", "55", "2221", "2720"), 16, (4, 4, 4, 4)),
    ("amex", ("34", "37"), 15, (4, 6, 5)), ("discover", ("6011", "65"), 16, (4, 4, 4, 4)),
    ("diners", ("36",), 14, (4, 6, 4)), ("jcb", ("3528", "3589"), 16, (4, 4, 4, 4)),
    ("unionpay", ("62",), 16, (4, 4, 4, 4)), ("unionpay19", ("62",), 19, (4, 4, 4, 4, 3)),
    ("maestro", ("5018", "6759"), 16, (4, 4, 4, 4)),
)  # fmt: skip

TEMPLATES = {
    "EMAIL_ADDRESS": (
        "Please send the signed copy to {v} before Friday.",
        "Contact: {v}",
        "Her address ({v}) was on the complaint form.",
        "Reply to {v}, cc the compliance team.",
        "The complaint came from {v}.",
    ),
    "PHONE_NUMBER": (
        "Call me on {v} after 5pm.",
        "Tel.: {v}",
        "The customer left a number, {v}, and asked for a call back.",
        "Reach the branch at {v} (weekdays 9-17).",
        "Her mobile is {v}.",
        'He wrote "{v}" on the back of the 2023 invoice.',
    ),
    "CREDIT_CARD": (
        "The charge on card {v} was disputed on 2024-11-02.",
        "Card number: {v}",
        "Payment with {v} failed twice, so the order was held.",
        "She read out {v} over the phone.",
        "Cards used: {v}; expiry 09/27.",
    ),
    "IBAN_CODE": (
        "Please wire the deposit to {v} by the end of the month.",
        "IBAN: {v}",
        "The refund went to account {v}, not to the old one.",
        "Beneficiary account {v} (EUR).",
        "Account {v}, BIC DEUTDEFF, amount EUR 1,250.00.",
    ),
    "US_SSN": (
        "His SSN is {v} according to the form.",
        "Social security number: {v}",
        "The applicant ({v}) was born in 1981.",
        "We verified {v} against the records.",
    ),
    "IP_ADDRESS": (
        "The login came from {v} at 03:14 UTC.",
        "Blocked host: {v}",
        "Traffic from {v}, flagged twice, was dropped.",
        "The server ({v}) rejected the request.",
        "Logs show requests from {v}.",
    ),
}
SSN_CONTEXT = ("His SSN is {v} according to the form.", "Social security number: {v}", "SSN {v}")


def _valid_phone(rng: random.Random, region: str) -> phonenumbers.PhoneNumber:
    """A valid number of ``region``: its example number with random trailing digits."""
    kind = rng.choice(
        (phonenumbers.PhoneNumberType.MOBILE, phonenumbers.PhoneNumberType.FIXED_LINE)
    )
    example = phonenumbers.example_number_for_type(region, kind)
    national = str(example.national_number)
    for _ in range(100):
        keep = len(national) - min(4, len(national) - 3)
        digits = national[:keep] + "".join(rng.choice(string.digits) for _ in national[keep:])
        number = phonenumbers.PhoneNumber(example.country_code, int(digits))
        if phonenumbers.is_valid_number_for_region(number, region):
            return number
    return example


def make_phone(rng: random.Random) -> str:
    region = rng.choice(PHONE_REGIONS)
    number = _valid_phone(rng, region)
    intl = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.INTERNATIONAL)
    cc = str(number.country_code)
    forms = [intl, phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)]
    forms += [intl.replace(" ", "-"), intl.replace(" ", ".", 1), "00" + intl[1:]]
    forms.append(intl.replace(f"+{cc} ", f"(+{cc}) ", 1))
    if region in ("GB", "DE", "CH", "FR", "NL"):  # the trunk 0 some write in brackets
        forms.append(intl.replace(f"+{cc} ", f"+{cc} (0)", 1))
    groups = intl.split(" ")
    if len(groups) > 2:  # the area code in brackets: +49 (30) 123456
        forms.append(" ".join([groups[0], f"({groups[1]})", *groups[2:]]))
    if region in ("US", "CA"):
        n = str(number.national_number)
        area, exch, line = n[:3], n[3:6], n[6:]
        forms = [
            f"({area}) {exch}-{line}", f"{area}-{exch}-{line}", f"{area}.{exch}.{line}",
            f"1-{area}-{exch}-{line}", f"+1 ({area}) {exch}-{line}", intl,
        ]  # fmt: skip
    return rng.choice(forms)


def _bban(rng: random.Random, spec: str) -> str:
    out, count = [], ""
    alphabets = {"n": string.digits, "a": string.ascii_uppercase}
    for ch in spec:
        if ch.isdigit():
            count += ch
            continue
        chars = alphabets.get(ch, string.digits + string.ascii_uppercase)
        out.extend(rng.choice(chars) for _ in range(int(count)))
        count = ""
    return "".join(out)


def make_iban(rng: random.Random) -> str:
    country, spec = rng.choice(IBAN_SPECS)
    bban = _bban(rng, spec)
    compact = country + stdnum_iban.calc_check_digits(country + "00" + bban) + bban
    assert stdnum_iban.is_valid(compact, check_country=False), compact
    if rng.random() < 0.3:
        return compact
    return " ".join(compact[i : i + 4] for i in range(0, len(compact), 4))


def _card_digits(rng: random.Random, prefixes: tuple[str, ...], length: int) -> str:
    body = rng.choice(prefixes)
    body += "".join(rng.choice(string.digits) for _ in range(length - 1 - len(body)))
    return body + luhn.calc_check_digit(body)


def make_card(rng: random.Random) -> str:
    _, prefixes, length, groups = rng.choice(CARD_BRANDS)
    digits = _card_digits(rng, prefixes, length)
    if groups is None or rng.random() < 0.25:
        return digits
    parts, pos = [], 0
    for size in groups:
        parts.append(digits[pos : pos + size])
        pos += size
    return rng.choice((" ", "-")).join(parts)


def make_ssn(rng: random.Random) -> str:
    while True:
        area = rng.choice([a for a in range(1, 900) if a != 666])
        digits = f"{area:03d}{rng.randint(1, 99):02d}{rng.randint(1, 9999):04d}"
        if stdnum_ssn.is_valid(digits):
            break
    sep = rng.choice(("-", "-", " ", ".", ""))
    if not sep:  # nine digits in a row: only after "SSN" / "social security number"
        return digits
    return f"{digits[:3]}{sep}{digits[3:5]}{sep}{digits[5:]}"


def make_email(rng: random.Random) -> str:
    first = rng.choice(("anna", "j", "mohammed", "li.wei", "o'neil", "kim", "sofia", "pat"))
    last = rng.choice(("smith", "muller", "garcia", "tanaka", "okafor", "rossi", "", "x"))
    sep = rng.choice((".", "_", "-", "")) if last else ""
    local = first.replace("'", "") + sep + last + rng.choice(("", "", str(rng.randint(1, 99))))
    if rng.random() < 0.15:
        local += "+billing"
    host = rng.choice(("example", "mail.example", "corp-bank", "uni-heidelberg", "gmx"))
    tld = rng.choice(("com", "de", "co.uk", "fr", "io", "org", "com.au", "jp", "info"))
    return f"{local}@{host}.{tld}"


def make_ip(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return str(ipaddress.IPv4Address(rng.getrandbits(32)))
    address = ipaddress.IPv6Address(rng.getrandbits(128))
    form = rng.choice(("full", "compressed", "zeros", "mapped"))
    if form == "full":
        return address.exploded
    if form == "zeros":  # a run of zero groups, written compressed with ::
        text = f"2001:db8:{rng.randint(0, 0xFFFF):x}::{rng.randint(1, 0xFFFF):x}"
        return str(ipaddress.IPv6Address(text))
    if form == "mapped":
        return f"::ffff:{ipaddress.IPv4Address(rng.getrandbits(32))}"
    return address.compressed


MAKERS: dict[str, Callable[[random.Random], str]] = {
    "EMAIL_ADDRESS": make_email,
    "PHONE_NUMBER": make_phone,
    "CREDIT_CARD": make_card,
    "IBAN_CODE": make_iban,
    "US_SSN": make_ssn,
    "IP_ADDRESS": make_ip,
}


def personal_set(per_type: int, seed: int) -> list[tuple[str, str, int, int]]:
    """``(type, sentence, start, end)`` of the value in the sentence, ``per_type`` a type."""
    rng = random.Random(seed)
    rows = []
    for kind, make in MAKERS.items():
        for _ in range(per_type):
            value = make(rng)
            templates = SSN_CONTEXT if value.isdigit() else TEMPLATES[kind]
            before, after = rng.choice(templates).split("{v}")
            rows.append((kind, before + value + after, len(before), len(before) + len(value)))
    return rows


CLEAN_TEMPLATES = (
    "Revenue rose {pct}% to ${amt} million in fiscal {year}, the company said on {date}.",
    "Order {order} shipped on {date}; the invoice totals EUR {amt}.",
    "Shares of {ticker} (ISIN {isin}, CUSIP {cusip}) closed at ${price}, up {pct} percent.",
    "The {year} notes yield {pct}% and the 10-year rose {bp} basis points at {time} GMT.",
    "Volume reached {big} shares between 09:30 and 16:00 ET on {date2}.",
    "Net debt fell to {amt} billion yen from {amt2} billion yen a year earlier.",
    "Guidance: EPS of ${price}-${price2} for FY{year}, versus consensus of ${price}.",
    "The index gained {pct}% to {points} points; {ticker} rose +{pct2}% and {ticker2} fell {pct}%.",
    "Case no. {case} was filed on {date} under docket {order}; damages of ${big} are sought.",
    "Its fourth-quarter results ({qdate}) showed {big} units sold, a {pct}% increase.",
    "Stock {ticker} hit a 52-week high of {price} on volume of {big}; ratio {ratio}.",
    "Invoice {invoice} for {amt} EUR is due on {date2}; reference {ref}.",
    "The {year}/{year2} season brought {big} visitors, {pct} per cent more than in {year3}.",
    "Serial {serial} was recalled; call centre hours are 08:00-20:00, {date}.",
    "The {year}-{year2} budget (ZIP {zip}) sets aside {amt} million, +{pct2}% y/y (+{pct}% q/q).",
    "Flight LH {flight} left at {hm} on {qdate}; the score was 3-2 and the ratio {ratio}.",
    "ISBN {isbn} sold {big} copies; coordinates {lat}, -{lon}.",
    "A ${amt}-billion deal values the group at {points} times, or 0.00{small} per share.",
    "Transaction {txn} of {amt} USD cleared; range {big}-{big2} units.",
    "The {year} census counted {spaced} residents, up from {spaced} in {year3}.",
)


def _clean_fields(rng: random.Random) -> dict[str, str]:
    def digits(n: int) -> str:
        return str(rng.randint(10 ** (n - 1), 10**n - 1))

    letters = string.ascii_uppercase
    year = rng.randint(1990, 2030)
    return {
        "pct": f"{rng.uniform(0.1, 99):.1f}", "pct2": f"{rng.uniform(0.1, 9):.2f}",
        "amt": f"{rng.randint(1, 9999):,}.{rng.randint(0, 9)}", "amt2": f"{rng.randint(1, 999):,}",
        "year": str(year), "year2": str(year + 1), "year3": str(year - 1),
        "date": f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "date2": f"{rng.randint(1, 28):02d}.{rng.randint(1, 12):02d}.{year}",
        "qdate": f"{rng.randint(1, 12)}/{rng.randint(1, 28)}/{year}",
        "order": rng.choice((f"#{digits(8)}", f"PO-{year}-{digits(6)}", f"A1-{digits(7)}")),
        "ticker": "".join(rng.choice(letters) for _ in range(rng.randint(2, 4))),
        "ticker2": "$" + "".join(rng.choice(letters) for _ in range(3)),
        "isin": rng.choice(("US", "DE", "GB", "FR")) + digits(10),
        "cusip": digits(9), "price": f"{rng.uniform(1, 999):.2f}",
        "price2": f"{rng.uniform(1, 999):.2f}", "bp": str(rng.randint(1, 60)),
        "time": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
        "big": f"{rng.randint(10_000, 999_999_999):,}", "points": f"{rng.uniform(1e3, 4e4):,.2f}",
        "case": f"{digits(2)}-cv-{digits(5)}", "ratio": f"{rng.randint(1, 9)}:{rng.randint(1, 9)}",
        "invoice": f"INV{digits(10)}", "ref": f"RF{digits(2)} {digits(4)} {digits(4)}",
        "serial": f"{digits(4)}-{digits(4)}-{digits(4)}",
        "zip": f"{digits(5)}-{digits(4)}", "flight": digits(3),
        "hm": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}",
        "isbn": f"978-{rng.randint(0, 9)}-{digits(2)}-{digits(6)}-{rng.randint(0, 9)}",
        "lat": f"{rng.uniform(-80, 80):.4f}", "lon": f"{rng.uniform(0, 170):.4f}",
        "small": digits(4), "txn": digits(rng.randint(10, 12)),
        "big2": f"{rng.randint(10_000, 999_999_999):,}",
        "spaced": f"{rng.randint(1, 99)} {digits(3)} {digits(3)}",
    }  # fmt: skip


def clean_set(n_generated: int, seed: int) -> dict[str, list[str]]:
    """Clean sentences by source: each news/tweet file, and the generated number-heavy ones."""
    sets: dict[str, list[str]] = {}
    for path in NEWS_FILES:
        with path.open(encoding="utf-8", newline="") as f:
            sets[f"{path.parent.name}/{path.name}"] = [row["text"] for row in csv.DictReader(f)]
    rng = random.Random(seed)
    sets["generated numbers"] = [
        rng.choice(CLEAN_TEMPLATES).format(**_clean_fields(rng)) for _ in range(n_generated)
    ]
    return sets


def measure_recall(redactor: Redactor, rows: list[tuple[str, str, int, int]]) -> dict:
    """Per type: found (gone and covered by its own type's placeholder), missed, wrong type."""
    counts: dict[str, Counter] = {t: Counter() for t in BUILTIN_TYPES}
    misses: list[str] = []
    for kind, sentence, start, end in rows:
        redacted, spans, offsets = redactor.redact_mapped(sentence)
        covering = [
            s["type"]
            for s in spans
            if offsets.to_original(s["start"]) <= start
            and offsets.to_original(s["end"], end=True) >= end
        ]
        gone = sentence[start:end] not in redacted
        if gone and kind in covering:
            counts[kind]["found"] += 1
        else:
            counts[kind]["wrong type" if covering else "missed"] += 1
            misses.append(f"{kind}: {sentence[start:end]!r} -> {covering or 'nothing'}")
    return {"counts": counts, "misses": misses}


def measure_clean(redactor: Redactor, sets: dict[str, list[str]]) -> dict:
    """Per source: sentences and false placeholders (and the flagged examples)."""
    table, flagged = {}, []
    for name, sentences in sets.items():
        false = Counter()
        for sentence in sentences:
            for kind, start, end in redactor.find(sentence):
                false[kind] += 1
                flagged.append(f"{name}: {kind} {sentence[start:end]!r} in {sentence!r}")
        table[name] = (len(sentences), false)
    return {"table": table, "flagged": flagged}


def measure_speed(redactor: Redactor, sentences: list[str], rounds: int = 3) -> float:
    """Sentences per second of ``redactor.redact`` on ``sentences`` (best of ``rounds``)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for sentence in sentences:
            redactor.redact(sentence)
        best = min(best, time.perf_counter() - start)
    return len(sentences) / best


def print_recall(recall: dict, show: int) -> bool:
    print(f"\n{'type':<15}{'n':>7}{'found':>7}{'missed':>8}{'wrong':>7}{'recall':>9}")
    ok = True
    for kind, c in recall["counts"].items():
        n = sum(c.values())
        rate = c["found"] / n if n else float("nan")
        ok &= rate >= 0.97
        print(f"{kind:<15}{n:>7}{c['found']:>7}{c['missed']:>8}{c['wrong type']:>7}{rate:>9.4f}")
    for line in recall["misses"][:show]:
        print("  miss", line)
    return ok


def print_clean(clean: dict, show: int) -> bool:
    print(f"\n{'clean source':<46}{'sentences':>10}{'false':>7}{'per 1,000':>11}  types")
    total_n = total_false = 0
    for name, (n, false) in clean["table"].items():
        k = sum(false.values())
        total_n, total_false = total_n + n, total_false + k
        kinds = ", ".join(f"{t} {c}" for t, c in sorted(false.items())) or "-"
        print(f"{name:<46}{n:>10}{k:>7}{1000 * k / n:>11.2f}  {kinds}")
    rate = 1000 * total_false / total_n
    print(f"{'all':<46}{total_n:>10}{total_false:>7}{rate:>11.2f}")
    for line in clean["flagged"][:show]:
        print("  flagged", line)
    return rate <= 1.0


def print_speed(per_s: float, n: int, what: str) -> None:
    cost_us = 1e6 / per_s
    budget_us = 1e6 / CPU_RUN_SENTENCES_PER_S
    print(f"\nthroughput: {per_s:,.0f} sentences/s on {n:,} {what}, one core")
    print(
        f"cost: {cost_us:.1f} us a sentence = {cost_us / budget_us:.1%} of a CPU run's "
        f"{budget_us:,.0f} us a sentence (target <= {COST_SHARE_TARGET:.0%})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-type", type=int, default=300, help="personal values a type")
    parser.add_argument("--generated", type=int, default=3000, help="generated clean sentences")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--show", type=int, default=10, help="misses / false hits to print")
    args = parser.parse_args(argv)
    redactor = Redactor()
    personal = personal_set(args.per_type, args.seed)
    recall = measure_recall(redactor, personal)
    sets = clean_set(args.generated, args.seed)
    clean = measure_clean(redactor, sets)
    news = [s for name, sentences in sets.items() if name != "generated numbers" for s in sentences]
    ok = print_recall(recall, args.show)
    ok &= print_clean(clean, args.show)
    print_speed(measure_speed(redactor, news), len(news), "news sentences")
    with_values = [row[1] for row in personal]
    print_speed(measure_speed(redactor, with_values), len(with_values), "sentences with a value")
    print("\nverdict:", "PASS" if ok else "FAIL", "(recall >= 0.97 a type, <= 1 false per 1,000)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
