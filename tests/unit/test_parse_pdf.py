"""docintel.pipeline.parse: PDFs printed by headless Chromium from HTML written here
(three pages, a running header, a footer with page numbers, Chromium's own date/title
header and URL/page footer, words hyphenated at line ends), a two-column one, and the bad
ones: truncated, corrupt, password-protected, over max_pages; plus the layout rules on
lines made by hand."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from docintel.pipeline.parse import ParseLimits, parse_file, word_recall
from docintel.pipeline.parse.errors import (
    CorruptFile,
    PasswordProtected,
    TooManyPages,
    TruncatedFile,
)
from docintel.pipeline.parse.layout import Line, Page, assemble, drop_running, join_lines
from tests.data_make.parse_files import (
    FOOTER,
    HEADER,
    Made,
    encrypted_pdf,
    memo_docx,
    paragraphs,
    print_pdf,
    report_html,
    report_pdf,
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Made:
    return report_pdf(tmp_path_factory.mktemp("report"), n_pages=3)


@pytest.fixture(scope="module")
def two_columns(tmp_path_factory: pytest.TempPathFactory) -> Made:
    return report_pdf(tmp_path_factory.mktemp("columns"), n_pages=2, columns=2, seed=2)


def test_report_text_recall_and_paragraphs(report: Made) -> None:
    [doc] = parse_file("reports/annual-2024.pdf", report.data)
    recall = word_recall(report.source, doc.text)
    print(f"pdf recall {recall:.3f}")
    assert recall >= 0.97
    # every heading and paragraph comes out whole: lines joined, hyphenated words
    # rejoined, paragraphs separated by one blank line, nothing else between them
    assert doc.text.split("\n\n") == report.paragraphs
    assert (doc.source_format, doc.n_pages, doc.title) == ("pdf", 3, "Annual Report 2024")


def test_hyphenated_line_ends_are_rejoined(report: Made) -> None:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(report.data)
    raw = "".join(pdf[i].get_textpage().get_text_range() for i in range(len(pdf)))
    # Chromium did hyphenate lines (150 draws U+2010 at a soft hyphen): the case is real
    broken = sum(raw.count(h + "\r\n") for h in "-\u2010\u00ad") + raw.count("\ufffe")
    assert broken >= 5
    [doc] = parse_file("r.pdf", report.data)
    assert "\u2010" not in doc.text and "- " not in doc.text
    assert "notwithstanding" in doc.text


def test_running_header_footer_and_page_numbers_are_dropped(report: Made) -> None:
    [doc] = parse_file("r.pdf", report.data)
    for running in (HEADER, FOOTER, "Northwind", "Page 1 of 3", "file://", "1/3", "report1.html"):
        assert running not in doc.text, running


def test_page_map(report: Made) -> None:
    [doc] = parse_file("r.pdf", report.data)
    assert doc.pages is not None and len(doc.pages) == 3
    for number, heading in enumerate(["Strategic report", "Financial review", "Risk management"]):
        at = doc.text.index(f"Section {number + 1}: {heading}")
        assert doc.page_of(at) == number + 1
        start, end = doc.pages[number]
        assert doc.text[start:end].startswith(f"Section {number + 1}")
    assert doc.pages[-1][1] == len(doc.text)
    assert all(doc.text[e:s] == "\n\n" for (_, e), (s, _) in itertools.pairwise(doc.pages))


def test_two_columns_read_in_order(two_columns: Made) -> None:
    [doc] = parse_file("cols.pdf", two_columns.data)
    recall = word_recall(two_columns.source, doc.text)
    print(f"pdf two-column recall {recall:.3f}")
    assert recall >= 0.97
    assert doc.text.split("\n\n") == two_columns.paragraphs  # a paragraph across columns too


def test_pdf_without_title_takes_its_first_heading(tmp_path: Path) -> None:
    pages = [("Quarterly statement", paragraphs(2, seed=5))]
    data = print_pdf(report_html(pages, title=""), tmp_path, "untitled")
    import pypdfium2 as pdfium

    assert pdfium.PdfDocument(data).get_metadata_value("Title") == "untitled.html"  # Chromium's
    [doc] = parse_file("untitled.pdf", data)
    assert doc.title == "Quarterly statement"


def test_truncated_pdf(report: Made) -> None:
    with pytest.raises(TruncatedFile, match=r"^cut\.pdf: .*%%EOF.*truncated.*fetch or copy"):
        parse_file("cut.pdf", report.data[: len(report.data) // 2])


def test_corrupt_pdf() -> None:
    data = b"%PDF-1.7\n" + bytes(range(256)) * 40 + b"\n%%EOF\n"
    with pytest.raises(CorruptFile, match=r"^bad\.pdf: not a readable PDF"):
        parse_file("bad.pdf", data)


def test_password_protected_pdf(report: Made, tmp_path: Path) -> None:
    locked = encrypted_pdf(report.data, tmp_path)
    with pytest.raises(PasswordProtected, match=r"^locked\.pdf: .*password-protected.*decrypt"):
        parse_file("locked.pdf", locked)


def test_over_max_pages(report: Made) -> None:
    with pytest.raises(TooManyPages, match=r"3 pages, over the 2-page limit.*max_pages"):
        parse_file("r.pdf", report.data, ParseLimits(max_pages=2))
    assert parse_file("r.pdf", report.data, ParseLimits(max_pages=3))[0].n_pages == 3


def test_pdf_named_txt_is_parsed_as_pdf(report: Made) -> None:
    [doc] = parse_file("export.txt", report.data)
    assert doc.source_format == "pdf" and doc.n_pages == 3
    assert doc.notes == ("export.txt: named .txt but its content is PDF; parsed as pdf",)


def test_docx_named_pdf_is_parsed_as_docx() -> None:
    [doc] = parse_file("memo.pdf", memo_docx().data)
    assert doc.source_format == "docx"
    assert "content is DOCX" in doc.notes[0]


def lines(*texts: str, top: float = 700, step: float = 14, hyphen_last: bool = False) -> list[Line]:
    out = []
    for i, text in enumerate(texts):
        y = top - i * step
        out.append(Line(text, 72, y - 10, 500, y, hyphen=hyphen_last and i == len(texts) - 1))
    return out


def test_hyphen_rules() -> None:
    keep = {"well-known"}
    assert join_lines(lines("the finan-", "cial year"), keep) == "the financial year"
    assert join_lines(lines("a well-", "known brand"), keep) == "a well-known brand"
    assert join_lines(lines("Anglo-", "Saxon law"), keep) == "Anglo-Saxon law"
    assert join_lines(lines("costs -", "and more"), keep) == "costs - and more"
    assert join_lines(lines("2023-", "2024 results"), keep) == "2023-2024 results"
    marked = [Line("finan", 72, 690, 500, 700, hyphen=True), Line("cial", 72, 676, 500, 686)]
    assert join_lines(marked, keep) == "financial"


def test_running_lines_need_several_pages() -> None:
    def page(n: int, body: str) -> Page:
        header = Line("ACME plc annual report", 72, 800, 300, 810)
        footer = Line(f"Page {n}", 72, 20, 120, 30)
        return Page([header, Line(body, 72, 600, 500, 612), footer], 842)

    pages = [page(n, f"Body text {n}.") for n in (1, 2, 3)]
    kept = drop_running(pages)
    assert [[ln.text for ln in p.lines] for p in kept] == [
        ["Body text 1."],
        ["Body text 2."],
        ["Body text 3."],
    ]
    assert [ln.text for ln in drop_running(pages[:1])[0].lines] == [
        "ACME plc annual report",
        "Body text 1.",
        "Page 1",
    ]  # fmt: skip  (one page: nothing repeats, nothing is dropped)


def test_sentence_running_on_to_the_next_page() -> None:
    text, spans = assemble(["It was a good", "year for the group.", "New section"])
    assert text == "It was a good year for the group.\n\nNew section"
    assert spans == [(0, 13), (14, 33), (35, 46)]
    text, _ = assemble(["a hyphen-", "ated word."])
    assert text == "a hyphenated word."
