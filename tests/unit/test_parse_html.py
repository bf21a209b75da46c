"""docintel.pipeline.parse: HTML pages (trafilatura), with real boilerplate around the
content: the main text is kept, navigation, cookie banners, asides, footers and scripts
are not, the <title> is the title and not text."""

from __future__ import annotations

import pytest

from docintel.pipeline.parse import parse_file, word_recall
from docintel.pipeline.parse.errors import EmptyFile
from tests.data_make.parse_files import ARTICLE, BOILERPLATE, NEWS_TITLE, news_html


def test_news_page_main_text_only() -> None:
    made = news_html()
    [doc] = parse_file("news/2024/rates.html", made.data)
    recall = word_recall(made.source, doc.text)
    print(f"html recall {recall:.3f}")
    assert recall >= 0.97
    for junk in BOILERPLATE:
        assert junk not in doc.text, junk
    assert doc.title == NEWS_TITLE
    assert NEWS_TITLE not in doc.text and "Daily Ledger" not in doc.text
    assert (doc.source_format, doc.pages, doc.n_pages) == ("html", None, None)


def test_paragraphs_and_headings_are_separated_by_blank_lines() -> None:
    [doc] = parse_file("rates.htm", news_html().data)
    paragraphs = doc.text.split("\n\n")
    assert paragraphs == ARTICLE  # headline apart from the first sentence, quotes intact


def test_tables_rows_and_line_breaks() -> None:
    page = (
        "<html><head><title>Results</title></head><body><article>"
        "<p>The board reported the following results for the year, which were audited by "
        "the group's independent auditors and approved at the meeting in March.</p>"
        "<table><tr><th>Division</th><th>Revenue</th></tr>"
        "<tr><td>Industrial</td><td>2.1 bn</td></tr><tr><td>Consumer</td><td>1.4 bn</td></tr>"
        "</table><p>Registered office:<br>1 High Street<br>London</p></article></body></html>"
    )
    [doc] = parse_file("results.html", page.encode())
    assert "Division | Revenue\n\nIndustrial | 2.1 bn\n\nConsumer | 1.4 bn" in doc.text
    assert "Registered office:\n1 High Street\nLondon" in doc.text


def test_declared_charset_is_honoured() -> None:
    page = (
        '<html><head><meta charset="windows-1252"><title>Caf\xe9</title></head><body>'
        "<p>Le caf\xe9 de la gare a rouvert ses portes apr\xe8s des travaux de r\xe9novation "
        "qui ont dur\xe9 tout l'hiver, au grand plaisir des voyageurs.</p></body></html>"
    ).encode("cp1252")
    [doc] = parse_file("cafe.html", page)
    assert doc.title == "Caf\u00e9"
    assert "apr\u00e8s des travaux de r\u00e9novation" in doc.text


@pytest.mark.parametrize(
    "page",
    [
        b"<html><head><title>Only script</title><script>var a = 1;</script></head></html>",
        b"<html><body><nav><a href='/'>Home</a></nav></body></html>",
    ],
)
def test_page_without_text_is_empty(page: bytes) -> None:
    with pytest.raises(EmptyFile, match=r"^page\.html: "):
        parse_file("page.html", page)


def test_page_without_title_takes_its_first_heading() -> None:
    page = news_html().data.replace(b"<title>", b"<!--").replace(b"</title>", b"-->")
    [doc] = parse_file("rates.html", page)
    assert doc.title == ARTICLE[0]
