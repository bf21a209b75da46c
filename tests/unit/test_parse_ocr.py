"""docintel.pipeline.parse: scanned (image-only) PDFs. Without OCR they are refused with
the way to enable it; with ``ocr=True`` Tesseract reads them (these tests need the
``tesseract`` binary, Debian package tesseract-ocr: they fail under CI=1 without it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from docintel.pipeline.parse import ParseLimits, parse_file, word_recall
from docintel.pipeline.parse.errors import NoTextLayer, OcrUnavailable
from tests.data_make.parse_files import HEADER, Made, need, report_pdf, scanned_pdf


@pytest.fixture(scope="module")
def scan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Made, bytes]:
    made = report_pdf(tmp_path_factory.mktemp("scan"), n_pages=2, seed=3)
    return made, scanned_pdf(made.data)


def test_scan_without_ocr_says_how_to_enable_it(scan: tuple[Made, bytes]) -> None:
    with pytest.raises(NoTextLayer) as info:
        parse_file("scans/letter.pdf", scan[1])
    message = str(info.value)
    assert message.startswith("scans/letter.pdf: the PDF has no text layer")
    assert "`ocr = true` in the [parse] section" in message
    assert "apt-get install tesseract-ocr" in message


def test_scan_with_ocr_on_but_no_tesseract(
    scan: tuple[Made, bytes], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no tesseract on PATH
    with pytest.raises(OcrUnavailable, match=r"`tesseract` binary is not on PATH.*tesseract-ocr"):
        parse_file("letter.pdf", scan[1], ParseLimits(ocr=True))


def test_scan_is_read_by_ocr(scan: tuple[Made, bytes]) -> None:
    need("tesseract")
    made, data = scan
    [doc] = parse_file("letter.pdf", data, ParseLimits(ocr=True))
    recall = word_recall(made.source, doc.text)
    print(f"pdf (OCR) recall {recall:.3f}")
    assert recall >= 0.97
    assert (doc.source_format, doc.n_pages) == ("pdf", 2)
    assert doc.notes == ("letter.pdf: OCR read 2 page(s) without a text layer",)
    assert HEADER not in doc.text and "Page 1 of 2" not in doc.text  # same layout rules
    assert doc.page_of(doc.text.index("Section 2: Financial review")) == 2
    assert doc.text.startswith("Section 1: Strategic report\n\n")


def test_text_pdf_is_not_ocrd_when_ocr_is_on(scan: tuple[Made, bytes]) -> None:
    [doc] = parse_file("r.pdf", scan[0].data, ParseLimits(ocr=True))
    assert doc.notes == ()
    assert doc.text.split("\n\n") == scan[0].paragraphs


def test_partly_scanned_pdf_keeps_its_text_pages_and_names_the_others(
    scan: tuple[Made, bytes],
) -> None:
    import io

    import pypdfium2 as pdfium

    mixed = pdfium.PdfDocument(scan[0].data)  # page 1 text, page 2 the scanned page 2
    mixed.del_page(1)
    mixed.import_pages(pdfium.PdfDocument(scan[1]), [1])
    buf = io.BytesIO()
    mixed.save(buf)
    [doc] = parse_file("mixed.pdf", buf.getvalue())
    assert doc.text.startswith("Section 1: Strategic report") and "Section 2" not in doc.text
    assert doc.pages is not None and doc.pages[1][0] == doc.pages[1][1]  # page 2: empty
    assert doc.notes[0].startswith("mixed.pdf: page(s) 2 have no text layer")
