"""OCR of PDF pages without a text layer: PDFium renders the page, the ``tesseract``
binary (Debian package tesseract-ocr) reads it, through a subprocess (no Python binding to
install). Tesseract's TSV output gives each word's box, so OCR'd lines go through the same
layout rules as a text layer's (paragraphs, running headers, hyphenation)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess

import pypdfium2 as pdfium

from docintel.pipeline.parse.errors import OcrFailed, OcrUnavailable
from docintel.pipeline.parse.layout import Line, Page

# 300 dpi is Tesseract's recommended input resolution: lower loses small print, higher
# costs time without gaining accuracy.
OCR_DPI = 300
# One page's OCR at 300 dpi takes 1-10 s; a page still running after this is not going
# to finish usefully (the stage's per-document limit still bounds the whole document).
OCR_PAGE_TIMEOUT_S = 120
OCR_LANGUAGE = "eng"  # the language data Debian's tesseract-ocr package ships by default
# One thread per Tesseract: a CPU pool already runs one replica per core.
_ENV = {"OMP_THREAD_LIMIT": "1"}
_FIELDS = 12  # level page_num block_num par_num line_num word_num left top width height conf text


def tesseract(name: str) -> str:
    """The tesseract binary's path; OcrUnavailable when it is not installed."""
    path = shutil.which("tesseract")
    if path is None:
        raise OcrUnavailable(
            name,
            "the PDF has no text layer and OCR is on, but the `tesseract` binary is not on PATH",
            "install Tesseract (Debian/Ubuntu: apt-get install tesseract-ocr)",
        )
    return path


def render_png(page: pdfium.PdfPage) -> bytes:
    """The page as a grey-scale PNG at OCR_DPI."""
    bitmap = page.render(scale=OCR_DPI / 72, grayscale=True)
    try:
        image = bitmap.to_pil()
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return buf.getvalue()
    finally:
        bitmap.close()


def run_tesseract(name: str, number: int, png: bytes) -> str:
    """Tesseract's TSV for one page image."""
    cmd = [tesseract(name), "stdin", "stdout", "-l", OCR_LANGUAGE, "tsv"]
    try:
        done = subprocess.run(
            cmd,
            input=png,
            capture_output=True,
            timeout=OCR_PAGE_TIMEOUT_S,
            check=False,
            env={**os.environ, **_ENV},
        )
    except subprocess.TimeoutExpired:
        raise OcrFailed(
            name,
            f"OCR of page {number + 1} took over {OCR_PAGE_TIMEOUT_S} s",
            "check the page (a huge image?) or process the file apart",
        ) from None
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()[-300:]
        raise OcrFailed(name, f"tesseract failed on page {number + 1}: {err}", "check the install")
    return done.stdout.decode("utf-8", errors="replace")


def tsv_lines(tsv: str, page_height_pt: float) -> list[Line]:
    """Tesseract's words grouped into lines, boxes in PDF points (y upwards)."""
    scale = 72 / OCR_DPI
    grouped: dict[tuple[str, str, str], list[list[str]]] = {}
    for row in tsv.splitlines()[1:]:
        cols = row.split("\t")
        if len(cols) == _FIELDS and cols[0] == "5" and cols[11].strip():
            grouped.setdefault((cols[2], cols[3], cols[4]), []).append(cols)
    lines = []
    for words in grouped.values():  # dicts keep Tesseract's reading order
        left = min(int(w[6]) for w in words)
        top = min(int(w[7]) for w in words)
        right = max(int(w[6]) + int(w[8]) for w in words)
        bottom = max(int(w[7]) + int(w[9]) for w in words)
        text = " ".join(w[11].strip() for w in words)
        lines.append(
            Line(
                text,
                left * scale,
                page_height_pt - bottom * scale,
                right * scale,
                page_height_pt - top * scale,
            )
        )
    return lines


def ocr_page(name: str, pdf: pdfium.PdfDocument, number: int) -> Page:
    """Page ``number`` (0-based) read by OCR."""
    page = pdf[number]
    try:
        height = page.get_height()
        png = render_png(page)
    finally:
        page.close()
    return Page(tsv_lines(run_tesseract(name, number, png), height), height)
