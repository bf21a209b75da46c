"""PDF files with pypdfium2 (PDFium, the engine of Chromium's viewer): the text layer
of each page, as positioned lines, turned into text by :mod:`.layout`; pages without a
text layer are read by OCR (:mod:`.ocr`) when asked, else refused (NoTextLayer)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import pypdfium2 as pdfium

from docintel.pipeline.parse import layout
from docintel.pipeline.parse.errors import (
    CorruptFile,
    NoTextLayer,
    PasswordProtected,
    TooManyPages,
    TruncatedFile,
)
from docintel.pipeline.parse.layout import Line, Page
from docintel.pipeline.parse.model import PDF, ParsedDocument, ParseLimits

# A complete PDF ends with %%EOF; some producers append a few bytes after it (a newline,
# padding), so it is looked for in the last 2 KiB.
EOF_WINDOW = 2048
# A heading's line is set this much larger than the body's (Chromium's h1 is 2x, h2 1.5x;
# Word's Title 2.3x, Heading 1 1.3x); a title longer than MAX_TITLE_CHARS is a paragraph.
HEADING_SCALE = 1.25
MAX_TITLE_CHARS = 200
_FILE_NAME = re.compile(
    r"^(microsoft \w+ - )?.*\.(html?|pdf|docx?|odt|rtf|txt|md|xlsx?|pptx?)$", re.IGNORECASE
)
_FPDF_ERR_PASSWORD = 4  # PDFium's FPDF_ERR_PASSWORD
_LINE_BREAKS = "\r\n"
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\ufffe\uffff]")
_SPACES = re.compile(r"\s+")
OCR_HINT = (
    "set `ocr = true` in the [parse] section of the config and install Tesseract "
    "(Debian/Ubuntu: apt-get install tesseract-ocr)"
)


@contextmanager
def open_pdf(name: str, data: bytes) -> Iterator[pdfium.PdfDocument]:
    """The document, closed on exit; typed errors for encrypted, truncated or bad bytes."""
    if b"%%EOF" not in data[-EOF_WINDOW:]:
        raise TruncatedFile(
            name,
            "the PDF ends without its %%EOF marker: the file is truncated",
            "fetch or copy it again (an interrupted download or copy cuts PDFs short)",
        )
    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as e:
        if e.err_code == _FPDF_ERR_PASSWORD:
            raise PasswordProtected(
                name,
                "the PDF is password-protected (encrypted)",
                "decrypt it first (e.g. `qpdf --decrypt --password=... in.pdf out.pdf`)",
            ) from None
        raise CorruptFile(
            name, f"not a readable PDF ({e})", "check the file or re-export it"
        ) from None
    try:
        yield pdf
    finally:
        pdf.close()


def page_lines(page: pdfium.PdfPage) -> list[Line]:
    """The page's text layer as lines in content order, each with its box."""
    textpage = page.get_textpage()
    try:
        text = textpage.get_text_range()
        exact = textpage.count_chars() == len(text)  # not so with surrogate pairs
        lines: list[Line] = []
        start = 0
        for i, char in enumerate(text + "\n"):
            if char in _LINE_BREAKS or char in layout.SOFT_HYPHEN_MARKERS:
                box = _line_box(textpage, text, start, i) if exact else None
                _add_line(lines, text[start:i], box, hyphen=char not in _LINE_BREAKS)
                start = i + 1
    finally:
        textpage.close()
    return lines


def _line_box(
    textpage: pdfium.PdfTextPage, text: str, start: int, end: int
) -> tuple[float, float, float, float] | None:
    """The box (left, bottom, right, top) of characters ``start:end``, from the loose
    boxes (the font's full ascent to descent, the same for every character of a font) of
    its first, middle and last visible characters: three calls instead of one per
    character, which would cost more than all the rest of the parse."""
    visible = [i for i in (start, (start + end) // 2, end - 1) if start <= i < end]
    visible = [i for i in visible if not text[i].isspace()] or [
        i for i in range(start, end) if not text[i].isspace()
    ][:1]
    if not visible:
        return None
    boxes = [textpage.get_charbox(i, loose=True) for i in visible]
    return (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )


def _add_line(
    lines: list[Line], text: str, box: tuple[float, float, float, float] | None, hyphen: bool
) -> None:
    clean = _SPACES.sub(" ", _CONTROL.sub("", text)).strip()
    if not clean:
        return
    if box is None:  # no geometry: stack it under the previous line
        prev = lines[-1] if lines else Line("", 0, 1000, 0, 1000)
        box = (prev.left, prev.bottom - 12, prev.right, prev.bottom - 2)
    lines.append(Line(clean, *box, hyphen=hyphen))


def read_pages(name: str, pdf: pdfium.PdfDocument) -> list[Page]:
    """Every page's lines and height."""
    pages = []
    for number in range(len(pdf)):
        try:
            page = pdf[number]
        except pdfium.PdfiumError as e:
            raise CorruptFile(
                name, f"page {number + 1} cannot be read ({e})", "re-export the PDF"
            ) from None
        try:
            pages.append(Page(page_lines(page), page.get_height()))
        finally:
            page.close()
    return pages


def parse_pdf(name: str, data: bytes, limits: ParseLimits) -> ParsedDocument:
    """A PDF as one document with its page map and metadata title."""
    notes: list[str] = []
    with open_pdf(name, data) as pdf:
        n_pages = len(pdf)
        if n_pages > limits.max_pages:
            raise TooManyPages(
                name,
                f"{n_pages:,} pages, over the {limits.max_pages:,}-page limit",
                "split it, or raise `max_pages` in the [parse] section of the config",
            )
        pages = read_pages(name, pdf)
        blank = [i for i, p in enumerate(pages) if not p.lines]
        if blank and limits.ocr:
            from docintel.pipeline.parse import ocr

            for i in blank:
                pages[i] = ocr.ocr_page(name, pdf, i)
            notes.append(f"{name}: OCR read {len(blank)} page(s) without a text layer")
        elif blank:
            _no_text_layer(name, blank, n_pages, notes)
        title = _title(pdf)
    keep = layout.hyphenated_words(pages)
    pages = layout.drop_running(pages)
    text, spans = layout.assemble([layout.page_text(p, keep) for p in pages])
    title = title or first_heading(pages)
    return ParsedDocument(
        "", text, PDF, pages=spans, title=title, n_pages=n_pages, notes=tuple(notes)
    )


def _no_text_layer(name: str, blank: list[int], n_pages: int, notes: list[str]) -> None:
    if len(blank) == n_pages:
        raise NoTextLayer(
            name, "the PDF has no text layer (a scan, or pages of images only)", OCR_HINT
        )
    listed = ", ".join(str(i + 1) for i in blank[:20]) + (" ..." if len(blank) > 20 else "")
    notes.append(f"{name}: page(s) {listed} have no text layer and were left empty; {OCR_HINT}")


def _title(pdf: pdfium.PdfDocument) -> str | None:
    """The metadata title, unless it is only a file name (what Chromium writes for a page
    without <title>, Word's "Microsoft Word - memo.docx")."""
    try:
        title = _SPACES.sub(" ", pdf.get_metadata_value("Title")).strip()
    except pdfium.PdfiumError:
        return None
    return None if not title or _FILE_NAME.match(title) else title


def first_heading(pages: list[Page]) -> str | None:
    """The first line of the first page with text set HEADING_SCALE times larger than
    the page's usual line, or None: the title of a PDF without a metadata title."""
    for page in pages:
        if not page.lines:
            continue
        usual = statistics.median(ln.height for ln in page.lines)
        big = [ln for ln in page.lines if ln.height >= HEADING_SCALE * usual]
        return big[0].text if big and len(big[0].text) <= MAX_TITLE_CHARS else None
    return None
