"""Pages per second of docintel's PDF path (docintel.pipeline.parse: pypdfium2 plus the
layout rules: lines joined, hyphens rejoined, running headers and footers dropped)
against a plain pypdf loop, against ``pdftotext`` (poppler-utils) and against a bare
pypdfium2 text loop (the floor under docintel's path), on the same PDFs in one run.

    python bench/parse_pdf.py [--docs 12] [--pages 10] [--repeat 3]

The PDFs are printed by headless Chromium (apt package chromium) from reports written by
tests/data_make/parse_files.py: ``--pages`` pages each of a heading and three paragraphs,
a running header, a "Page n of N" footer, Chromium's date/title header and URL footer,
words hyphenated at line ends. Each method reads every PDF from memory (pdftotext: from a
file, one process per PDF, as a pipeline would call it), best of ``--repeat`` rounds, one
process, one core. Also printed: each method's word recall against the written text and
its extra words (the share of its words that are not in the text: headers, footers, page
numbers and the halves of words hyphenated at line ends), after dropping the invisible
soft hyphens (U+00AD) that pypdf and pdftotext keep inside words (Chromium's PDFs carry
one in every word the HTML gave one). Needs pypdf (the dev extra) and poppler-utils.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from docintel.pipeline.parse import parse_file  # noqa: E402
from docintel.pipeline.parse.recall import word_recall, words  # noqa: E402
from tests.data_make.parse_files import paragraphs, print_pdf, report_html  # noqa: E402

Reader = Callable[[Path, bytes], str]


def make_pdfs(folder: Path, docs: int, pages: int) -> list[tuple[Path, bytes, str]]:
    """``docs`` reports of ``pages`` pages: (path, bytes, the text written)."""
    out = []
    for d in range(docs):
        content = [(f"Section {p}: part {d}", paragraphs(3, d * 1000 + p)) for p in range(pages)]
        data = print_pdf(report_html(content, f"Report {d}"), folder, f"report{d}")
        written = "\n\n".join(t for head, paras in content for t in (head, *paras))
        out.append((folder / f"report{d}.pdf", data, written))
    return out


def docintel(_path: Path, data: bytes) -> str:
    return parse_file("report.pdf", data)[0].text


def pypdfium2_raw(_path: Path, data: bytes) -> str:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(data)
    try:
        return "\n".join(pdf[i].get_textpage().get_text_range() for i in range(len(pdf)))
    finally:
        pdf.close()


def pypdf_loop(_path: Path, data: bytes) -> str:
    from pypdf import PdfReader

    return "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(data)).pages)


def pdftotext(path: Path, _data: bytes) -> str:
    done = subprocess.run(["pdftotext", str(path), "-"], capture_output=True, check=True)
    return done.stdout.decode("utf-8", errors="replace")


def extra_words(source: str, extracted: str) -> float:
    """The share of the extracted words (with multiplicity) that the source lacks."""
    got, want = words(extracted), words(source)
    total = sum(got.values())
    return sum(max(0, n - want[w]) for w, n in got.items()) / total if total else 0.0


def measure(reader: Reader, pdfs: list[tuple[Path, bytes, str]], repeat: int) -> tuple:
    """(best seconds over all PDFs, mean recall, mean extra words)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        texts = [reader(path, data) for path, data, _ in pdfs]
        best = min(best, time.perf_counter() - started)
    texts = [t.replace("\u00ad", "") for t in texts]  # invisible soft hyphens: not scored
    recall = sum(word_recall(src, t) for (_, _, src), t in zip(pdfs, texts, strict=True))
    extra = sum(extra_words(src, t) for (_, _, src), t in zip(pdfs, texts, strict=True))
    return best, recall / len(pdfs), extra / len(pdfs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=12)
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    readers: dict[str, Reader] = {"docintel (pypdfium2 + layout)": docintel}
    readers["pypdfium2, raw text"] = pypdfium2_raw
    readers["pypdf loop"] = pypdf_loop
    if shutil.which("pdftotext"):
        readers["pdftotext (poppler)"] = pdftotext
    with tempfile.TemporaryDirectory() as tmp:
        pdfs = make_pdfs(Path(tmp), args.docs, args.pages)
        n_pages = args.docs * args.pages
        print(f"{args.docs} PDFs x {args.pages} pages = {n_pages} pages, best of {args.repeat}\n")
        print("| method | seconds | pages/s | word recall | extra words |")
        print("|---|---:|---:|---:|---:|")
        for label, reader in readers.items():
            seconds, recall, extra = measure(reader, pdfs, args.repeat)
            rate = n_pages / seconds
            print(f"| {label} | {seconds:.2f} | {rate:,.0f} | {recall:.3f} | {extra:.3f} |")
    if "pdftotext (poppler)" not in readers:
        print("\npdftotext not found: apt-get install poppler-utils")


if __name__ == "__main__":
    main()
