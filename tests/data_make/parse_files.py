"""Real document files for the parse tests, made at test time: PDFs printed by headless
Chromium from HTML written here, a scanned (image-only) PDF made from one of them, an
encrypted one (qpdf), DOCX files (python-docx), e-mails (the standard library).

Each maker returns the file's bytes together with its source text (what a perfect parser
would extract), so tests measure word recall against what was written.
"""

from __future__ import annotations

import html
import io
import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM_TIMEOUT_S = 120  # a cold start on a loaded 2-core machine takes a few seconds
APT = {"chromium": "chromium", "tesseract": "tesseract-ocr", "qpdf": "qpdf"}

_SENTENCES = [
    "Revenue rose by twelve per cent to 4.2 billion euros, driven by higher volumes in the "
    "industrial division and disciplined pricing across every region.",
    "Operating margins widened as input costs eased and the restructuring programme "
    "delivered its first savings ahead of schedule.",
    "The board recommends a final dividend of 38 cents per share, bringing the total for "
    "the year to 56 cents, an increase of eight per cent.",
    "Net debt fell to 1.1 billion euros, equivalent to 0.9 times earnings before interest, "
    "taxes, depreciation and amortisation.",
    "Currency movements reduced reported revenue by two per cent, mainly because of the "
    "weaker Turkish lira and Argentine peso.",
    "Management considers the international expansion strategy sustainable, notwithstanding "
    "considerable macroeconomic uncertainty in several important markets.",
    "Capital expenditure of 310 million euros was concentrated on automation, digital "
    "infrastructure and the modernisation of distribution facilities.",
    "The group's environmental commitments include a forty per cent reduction in operational "
    "emissions by 2030 against the 2019 baseline.",
    "Working capital increased temporarily because of strategic inventory purchases made to "
    "protect customers from supply interruptions.",
    "Independent auditors confirmed that the consolidated financial statements present "
    "fairly the financial position of the group.",
]
HEADER = "Northwind Holdings plc \u2014 Annual Report 2024"
FOOTER = "Confidential \u2014 for shareholders only"


def need(tool: str) -> str:
    """The tool's path; a missing tool fails under CI (CI=1) and skips elsewhere."""
    path = shutil.which(tool)
    if path is None:
        hint = (
            f"`{tool}` is needed by this parse test but is not on PATH; install it with "
            f"`apt-get install -y --no-install-recommends {APT.get(tool, tool)}`"
        )
        if os.environ.get("CI"):
            pytest.fail(hint)
        pytest.skip(hint)
    return path


@dataclass(frozen=True)
class Made:
    """A document file made for a test: its bytes and the text written into it."""

    data: bytes
    source: str
    paragraphs: list[str]


def paragraphs(n: int, seed: int) -> list[str]:
    """``n`` paragraphs of three to five report sentences each (deterministic)."""
    rng = random.Random(seed)
    return [" ".join(rng.sample(_SENTENCES, rng.randint(3, 5))) for _ in range(n)]


def soft_hyphens(text: str) -> str:
    """HTML for ``text`` with a soft hyphen in the middle of every word of 9+ letters,
    so that Chromium hyphenates at line ends (and draws the hyphen)."""
    out = []
    for word in text.split(" "):
        core = word.rstrip(",.")
        mid = len(core) // 2
        long = len(core) >= 9 and core.isalpha()
        out.append(f"{html.escape(core[:mid])}&shy;{word[mid:]}" if long else html.escape(word))
    return " ".join(out)


_PAGE_CSS = """
@page { size: A4; margin: 15mm 0; }
body { margin: 0; font-family: 'DejaVu Serif', serif; font-size: 12pt; line-height: 1.25; }
.page { height: 266mm; position: relative; padding: 0 25mm; overflow: hidden; }
.page + .page { break-before: page; }
.hdr, .ftr { position: absolute; left: 25mm; right: 25mm; font-size: 9pt; }
.hdr { top: 0; } .ftr { bottom: 0; }
.body { padding-top: 14mm; }
.cols { column-count: 2; column-gap: 10mm; }
p { text-align: justify; hyphens: manual; margin: 0 0 10pt 0; }
"""


def report_html(pages: list[tuple[str, list[str]]], title: str, columns: int = 1) -> str:
    """A paginated report: each page its heading and paragraphs, a running header and a
    footer with its page number ("Page 2 of 3")."""
    out = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"]
    out.append(f"<style>{_PAGE_CSS}</style></head><body>")
    for number, (heading, paras) in enumerate(pages, start=1):
        body = "".join(f"<p>{soft_hyphens(p)}</p>" for p in paras)
        cols = " cols" if columns == 2 else ""
        footer = f"{FOOTER} \u00b7 Page {number} of {len(pages)}"
        out.append(
            f"<div class='page'><div class='hdr'>{html.escape(HEADER)}</div>"
            f"<div class='body'><h2>{html.escape(heading)}</h2>"
            f"<div class='{cols}'>{body}</div></div>"
            f"<div class='ftr'>{html.escape(footer)}</div></div>"
        )
    out.append("</body></html>")
    return "".join(out)


def print_pdf(page_html: str, workdir: Path, name: str) -> bytes:
    """The HTML printed to PDF by headless Chromium, with its own header and footer (the
    date and title on top, the file's URL and "n/N" below) as well as the page's."""
    chromium = need("chromium")
    workdir.mkdir(parents=True, exist_ok=True)
    src, out = workdir / f"{name}.html", workdir / f"{name}.pdf"
    src.write_text(page_html, encoding="utf-8")
    cmd = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--no-first-run",
        f"--user-data-dir={workdir / 'chromium-profile'}", f"--print-to-pdf={out}",
        src.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=False
    )
    assert done.returncode == 0 and out.exists(), f"chromium failed: {done.stderr[-2000:]}"
    return out.read_bytes()


def report_pdf(workdir: Path, n_pages: int = 3, columns: int = 1, seed: int = 1) -> Made:
    """A report of ``n_pages`` pages (three paragraphs each) printed by Chromium."""
    pages = [
        (f"Section {i}: {heading}", paragraphs(3, seed * 100 + i))
        for i, heading in enumerate(["Strategic report", "Financial review", "Risk management",
                                     "Governance", "Outlook", "Sustainability"], start=1)
    ][:n_pages]  # fmt: skip
    data = print_pdf(report_html(pages, "Annual Report 2024", columns), workdir, f"report{seed}")
    written = [text for heading, paras in pages for text in (heading, *paras)]
    return Made(data, "\n\n".join(written), written)


def scanned_pdf(text_pdf: bytes, dpi: int = 200) -> bytes:
    """An image-only PDF: every page of ``text_pdf`` rendered to a grey-scale image (as a
    scanner would) and placed on a page of its own, with no text layer."""
    import pypdfium2 as pdfium

    src = pdfium.PdfDocument(text_pdf)
    out = pdfium.PdfDocument.new()
    for number in range(len(src)):
        page = src[number]
        width, height = page.get_size()
        bitmap = page.render(scale=dpi / 72, grayscale=True)
        image = pdfium.PdfImage.new(out)
        image.set_bitmap(bitmap)
        image.set_matrix(pdfium.PdfMatrix().scale(width, height))
        new = out.new_page(width, height)
        new.insert_obj(image)
        new.gen_content()
    buf = io.BytesIO()
    out.save(buf)
    return buf.getvalue()


def encrypted_pdf(data: bytes, workdir: Path, password: str = "s3cret") -> bytes:
    """``data`` encrypted (AES-256) with a user password, by qpdf."""
    qpdf = need("qpdf")
    workdir.mkdir(parents=True, exist_ok=True)
    plain, locked = workdir / "plain.pdf", workdir / "locked.pdf"
    plain.write_bytes(data)
    cmd = [qpdf, "--encrypt", password, password + "-owner", "256", "--", str(plain), str(locked)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    return locked.read_bytes()


ARTICLE = [
    "Central bank holds rates as inflation cools",
    "The central bank left its benchmark interest rate unchanged on Thursday, saying that "
    "inflation had eased for a third consecutive month and that the labour market remained "
    "resilient despite slower growth.",
    "Policymakers voted seven to two to keep the rate at 4.25 per cent. Two members favoured "
    "a quarter-point cut, arguing that weaker consumer spending warranted earlier support.",
    "Markets react",
    "Government bond yields fell after the announcement, and the currency weakened slightly "
    "against the dollar. Equity markets rose, led by housebuilders and retailers.",
    "\u201cWe are not yet confident that inflation will return sustainably to target,\u201d "
    "the governor told reporters. \u201cBut the direction of travel is encouraging.\u201d",
    "Analysts now expect the first cut in the spring, although several cautioned that energy "
    "prices and wage settlements could delay it.",
]
BOILERPLATE = [
    "We use cookies to improve your experience",
    "Accept all cookies",
    "Subscribe now",
    "Most read",
    "Ten stocks to watch this week",
    "Open a savings account today",
    "All rights reserved",
    "Terms of use",
    "tracking pixel",
    "Share this article",
]
NEWS_TITLE = "Central bank holds rates | Daily Ledger"


def news_html() -> Made:
    """A news page: the article (headings, paragraphs) among a cookie banner, navigation,
    share buttons, an aside with most-read links and an advert, a footer and a script."""
    body = "".join(
        f"<h{1 if i == 0 else 2}>{html.escape(t)}</h{1 if i == 0 else 2}>"
        if i in (0, 3)
        else f"<p>{html.escape(t)}</p>"
        for i, t in enumerate(ARTICLE)
    )
    page = f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<title>{html.escape(NEWS_TITLE)}</title>
<script>function track(){{console.log("tracking pixel")}}</script><style>p{{margin:1em}}</style>
</head><body>
<div id="cookie-banner" class="cookie-consent">We use cookies to improve your experience.
<button>Accept all cookies</button> <a href="/privacy">Manage preferences</a></div>
<header><nav><ul><li><a href="/">Home</a></li><li><a href="/markets">Markets</a></li>
<li><a href="/economy">Economy</a></li><li><a href="/subscribe">Subscribe now</a></li></ul></nav>
</header><main><article>{body}
<div class="share"><a href="#">Share this article</a> <a href="#">Tweet</a></div></article></main>
<aside class="sidebar"><h3>Most read</h3><ul><li><a href="/a">Ten stocks to watch this week</a>
</li><li><a href="/b">How to cut your energy bill</a></li></ul>
<div class="ad">Advertisement: Open a savings account today</div></aside>
<footer><p>Copyright 2024 Daily Ledger Media Ltd. All rights reserved.</p>
<p><a href="/terms">Terms of use</a> | <a href="/contact">Contact us</a></p></footer>
</body></html>"""
    return Made(page.encode("utf-8"), "\n\n".join(ARTICLE), list(ARTICLE))


MEMO_TABLE = [("Division", "Revenue", "Margin"), ("Industrial", "2.1 bn", "14%"),
              ("Consumer", "1.4 bn", "9%")]  # fmt: skip


def memo_docx(title: str | None = None) -> Made:
    """A DOCX memo made with python-docx: a title heading, sub-headings, paragraphs (one
    with a bold run), a bulleted list and a table."""
    from docx import Document

    document = Document()
    if title:
        document.core_properties.title = title
    written: list[str] = []

    def add(text: str, style: str | None = None, level: int | None = None) -> None:
        if level is not None:
            document.add_heading(text, level=level)
        else:
            document.add_paragraph(text, style=style)
        written.append(text)

    add("Memo: third-quarter results", level=0)
    add("Summary", level=1)
    for text in paragraphs(2, seed=7):
        add(text)
    bold = document.add_paragraph("Please note: ")
    bold.add_run("the figures below are unaudited.").bold = True
    written.append("Please note: the figures below are unaudited.")
    add("Revenue grew in every division.", style="List Bullet")
    add("Costs fell for the second quarter running.", style="List Bullet")
    add("By division", level=1)
    table = document.add_table(rows=0, cols=3)
    for row in MEMO_TABLE:
        cells = table.add_row().cells
        for cell, value in zip(cells, row, strict=True):
            cell.text = value
        written.append(" | ".join(row))
    add(paragraphs(1, seed=8)[0])
    buf = io.BytesIO()
    document.save(buf)
    return Made(buf.getvalue(), "\n\n".join(written), written)


def zip_bytes(members: dict[str, bytes]) -> bytes:
    """A deflated zip of the given members."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()
