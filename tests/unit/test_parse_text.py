"""docintel.pipeline.parse: plain text and Markdown files, the dispatcher's choice of
parser (extension checked against content), and the bad cases common to every format."""

from __future__ import annotations

import pytest

from docintel.pipeline.parse import ParseLimits, parse_file, word_recall
from docintel.pipeline.parse.detect import sniff
from docintel.pipeline.parse.errors import (
    EmptyFile,
    FileTooLarge,
    NotText,
    ParseError,
    UnsupportedFormat,
)

NEWS = (
    "Markets rally as inflation cools\n\n"
    "Shares rose on Thursday after figures showed consumer prices rising more slowly than "
    "expected. The central bank is now seen cutting rates in the spring.\n\n"
    "\u201cThe direction of travel is encouraging,\u201d said one analyst in Z\u00fcrich.\n"
)


def only(docs: list) -> object:
    assert len(docs) == 1
    return docs[0]


def test_utf8_text_is_kept_as_written() -> None:
    doc = only(parse_file("news/today.txt", NEWS.encode()))
    assert doc.text == NEWS
    assert (doc.source_format, doc.title, doc.pages, doc.n_pages) == ("txt", None, None, None)
    assert doc.doc_id("news/today.txt") == "news/today.txt"
    assert word_recall(NEWS, doc.text) == 1.0


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        (b"\xef\xbb\xbf" + NEWS.encode(), "utf-8 with BOM"),
        (NEWS.encode("utf-16"), "utf-16 with BOM"),
        (NEWS.replace("\n", "\r\n").encode(), "CRLF line ends"),
        (NEWS.replace("\u201c", '"').replace("\u201d", '"').encode("cp1252"), "cp1252"),
    ],
)
def test_encodings_and_line_ends(raw: bytes, label: str) -> None:
    doc = only(parse_file("a.txt", raw))
    assert not doc.text.startswith("\ufeff"), label
    assert "\r" not in doc.text
    assert "Z\u00fcrich" in doc.text, label
    assert word_recall(NEWS, doc.text) == 1.0, label


def test_markdown_headings_lose_their_markers_and_stand_alone() -> None:
    md = (
        "# Quarterly update\n"
        "Revenue grew **8%** in the quarter, see [the figures](figures.md).\n\n"
        "## Outlook ##\n"
        "We expect growth to continue.\n\n"
        "```python\n# a comment in code stays\nx = 1\n```\n"
    )
    doc = only(parse_file("notes/update.md", md.encode()))
    assert doc.source_format == "md"
    assert doc.title == "Quarterly update"
    assert doc.text.startswith("Quarterly update\n\nRevenue grew **8%**")
    assert "\n\nOutlook\n\nWe expect growth to continue." in doc.text
    assert "# a comment in code stays" in doc.text
    recall = word_recall(md, doc.text)
    print(f"md recall {recall:.3f}")
    assert recall >= 0.97


def test_markdown_without_heading_has_no_title() -> None:
    assert only(parse_file("a.md", b"Just a line.\n")).title is None


@pytest.mark.parametrize("raw", [b"", b"   \n\n\t "])
def test_empty_files_are_refused(raw: bytes) -> None:
    with pytest.raises(EmptyFile, match=r"^empty\.txt: the file is empty"):
        parse_file("empty.txt", raw)


def test_whitespace_only_markdown_after_decoding() -> None:
    with pytest.raises(EmptyFile):
        parse_file("blank.md", "\u3000\n \n".encode("utf-8-sig"))  # BOM, ideographic space


def test_over_max_bytes_is_refused_before_parsing() -> None:
    with pytest.raises(
        FileTooLarge, match=r"big\.txt: 2,000 bytes, over the 1,000-byte limit.*max_bytes"
    ):
        parse_file("big.txt", b"x" * 2000, ParseLimits(max_bytes=1000))


def test_binary_bytes_in_a_txt_are_not_text() -> None:
    with pytest.raises(NotText, match="NUL bytes"):
        parse_file("data.txt", b"\x00\x01\x02binary\x00" * 10)


def test_unknown_extension_with_unknown_content_is_unsupported() -> None:
    with pytest.raises(UnsupportedFormat, match=r"sheet\.xlsb: not a supported.*\.pdf"):
        parse_file("sheet.xlsb", b"some bytes")
    assert issubclass(UnsupportedFormat, ParseError)


def test_html_saved_as_txt_is_parsed_as_html_and_reported() -> None:
    page = (
        b"<!DOCTYPE html><html><head><title>Notice</title><script>var x = 1;</script></head>"
        b"<body><p>The annual general meeting will be held on 12 May at the head office in "
        b"London, and shareholders may vote in person or by proxy before the deadline.</p>"
        b"</body></html>"
    )
    doc = only(parse_file("notice.txt", page))
    assert doc.source_format == "html"
    assert "var x" not in doc.text and "<p>" not in doc.text
    assert doc.title == "Notice"
    assert doc.notes == ("notice.txt: named .txt but its content is HTML; parsed as html",)


def test_mail_saved_as_txt_is_parsed_as_mail() -> None:
    mail = b"From: a@example.com\r\nTo: b@example.com\r\nSubject: Hi\r\n\r\nBody text here.\r\n"
    doc = parse_file("saved.txt", mail)[0]
    assert (doc.source_format, doc.title, doc.text) == ("eml", "Hi", "Body text here.")
    assert "content is EML" in doc.notes[0]


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"%PDF-1.7\n", "pdf"),
        (b"\n\n%PDF-1.4", "pdf"),  # a few bytes of junk before the header are allowed
        (b"<!doctype html><p>x", "html"),
        (b"\xef\xbb\xbf  <html lang=en>", "html"),
        (b"<div>no html/head/body tag</div>", None),
        (b"Some text that mentions <body> later", None),
        (b"From: a@b.c\nDate: Mon, 1 Jan 2024 00:00:00 +0000\n\nhi", "eml"),
        (b"From: only one header\n\nhi", None),
        (b"Title: notes\nAuthor: me\n\ntext", None),  # headers, but not a mail's
        (b"PK\x03\x04 not really a zip", "zip"),
        (b"plain words", None),
    ],
)
def test_sniff(head: bytes, expected: str | None) -> None:
    assert sniff(head) == expected
