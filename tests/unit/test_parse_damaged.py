"""docintel.pipeline.parse never crashes on damaged bytes: every file format made for the
parse tests, cut short and with bytes overwritten at seeded random places, either parses
or raises a ParseError (an error row), and does so quickly (no unbounded loop)."""

from __future__ import annotations

import random
import time
from email.message import EmailMessage
from pathlib import Path

import pytest

from docintel.pipeline.parse import ParseError, parse_file
from tests.data_make.parse_files import memo_docx, news_html, report_pdf

VARIANTS = 40  # damaged copies per file and seed (two seeds)
MAX_SECONDS = 5.0  # per damaged copy: parsing a healthy one takes well under a second


def damaged(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(VARIANTS):
        copy = bytearray(data[: rng.randint(1, len(data))] if i % 2 else data)
        for _ in range(rng.randint(1, 20)):
            copy[rng.randrange(len(copy))] = rng.randrange(256)
        out.append(bytes(copy))
    return out


def mail() -> bytes:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "a@example.com", "b@example.com", "Memo"
    msg.set_content("The memo is attached.")
    msg.add_attachment(memo_docx().data, maintype="application", subtype="octet-stream",
                       filename="memo.docx")  # fmt: skip
    return msg.as_bytes()


def check(name: str, data: bytes, seed: int) -> None:
    for variant in damaged(data, seed) + damaged(data, seed + 1000):
        started = time.perf_counter()
        try:
            docs = parse_file(name, variant)
        except ParseError:
            pass
        else:
            assert docs and all(isinstance(d.text, str) for d in docs)
        assert time.perf_counter() - started < MAX_SECONDS


@pytest.mark.parametrize(
    ("name", "make"),
    [("memo.docx", lambda: memo_docx().data), ("news.html", lambda: news_html().data),
     ("thread.eml", mail)],
)  # fmt: skip
def test_damaged_files_are_parse_errors_or_text(name: str, make: object) -> None:
    check(name, make(), seed=len(name))  # type: ignore[operator]


def test_damaged_pdfs_are_parse_errors_or_text(tmp_path: Path) -> None:
    check("report.pdf", report_pdf(tmp_path, n_pages=2).data, seed=11)
