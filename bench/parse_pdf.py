"""Pages per second of docintel's PDF path (docintel.pipeline.parse: pypdfium2 plus the
layout rules: lines joined, hyphens rejoined, running headers and footers dropped), as a
function call and as the parse stage runs it (the stage's parser process, batches of 16
files), against a plain pypdf loop, against ``pdftotext`` (poppler-utils) and against a
bare pypdfium2 text loop (the floor under docintel's path), on the same PDFs in one run.

    python bench/parse_pdf.py [--docs 60] [--pages 5] [--rounds 3]

The PDFs: generated reports (tests/data_make/parse_files.py: each page a heading and
three paragraphs, a running header, a "Page n of N" footer, Chromium's date/title header
and URL footer, words hyphenated at line ends) printed by headless Chromium (apt package
chromium) as one document and split into ``--docs`` PDFs of ``--pages`` pages with
pypdfium2 (one Chromium start instead of one per PDF). Each method reads every PDF from
memory (pdftotext: from a file, one process per PDF, as a pipeline would call it); after
one untimed warm-up file each (imports, the parser process's first file), the methods
alternate, in a rotated order each round, in one process; the median round is reported,
in wall seconds and in CPU seconds (this process and its children: the parser process,
pdftotext), the figure a loaded machine moves least.
Also printed: each method's word recall against the written text and its extra words (the
share of its words that are not in the text: headers, footers, page numbers and the halves
of words hyphenated at line ends), after dropping the invisible soft hyphens (U+00AD) that
pypdf and pdftotext keep inside words (Chromium's PDFs carry one in every word the HTML
gave one). Needs pypdf (the dev extra) and poppler-utils.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import tree_cpu_s  # noqa: E402
from docintel.pipeline.parse import parse_file  # noqa: E402
from docintel.pipeline.parse.recall import word_recall, words  # noqa: E402
from tests.data_make.parse_files import paragraphs, print_pdf, report_html  # noqa: E402

STAGE_BATCH = 16  # files per batch in a run ([run] batch_size "auto", document input)


@dataclass(frozen=True)
class Pdf:
    path: Path
    data: bytes
    written: str  # the text a perfect parser would extract


Method = Callable[[list[Pdf]], list[str]]


def make_pdfs(folder: Path, docs: int, pages: int) -> list[Pdf]:
    """``docs`` reports of ``pages`` pages written to ``folder`` (only the PDFs there):
    printed by Chromium as one document, split with pypdfium2."""
    import pypdfium2 as pdfium

    content = [(f"Section {p % pages + 1}: report {p // pages}", paragraphs(3, p))
               for p in range(docs * pages)]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        whole = pdfium.PdfDocument(print_pdf(report_html(content, "Reports"), Path(tmp), "all"))
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for d in range(docs):
        first = d * pages
        part = pdfium.PdfDocument.new()
        part.import_pages(whole, list(range(first, first + pages)))
        buf = io.BytesIO()
        part.save(buf)
        path = folder / f"report{d:04d}.pdf"
        path.write_bytes(buf.getvalue())
        mine = content[first : first + pages]
        written = "\n\n".join(t for head, paras in mine for t in (head, *paras))
        out.append(Pdf(path, buf.getvalue(), written))
    return out


def per_file(read: Callable[[Pdf], str]) -> Method:
    return lambda pdfs: [read(p) for p in pdfs]


def docintel(pdf: Pdf) -> str:
    return parse_file("report.pdf", pdf.data)[0].text


def pypdfium2_raw(pdf: Pdf) -> str:
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument(pdf.data)
    try:
        return "\n".join(doc[i].get_textpage().get_text_range() for i in range(len(doc)))
    finally:
        doc.close()


def pypdf_loop(pdf: Pdf) -> str:
    from pypdf import PdfReader

    return "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(pdf.data)).pages)


def pdftotext(pdf: Pdf) -> str:
    done = subprocess.run(["pdftotext", str(pdf.path), "-"], capture_output=True, check=True)
    return done.stdout.decode("utf-8", errors="replace")


class StageMethod:
    """The parse stage as a run calls it: Parser's __call__ on Arrow batches of
    (doc_id, content), each file parsed in the stage's parser process."""

    def __init__(self) -> None:
        from docintel.pipeline.stages.parse import ParseConfig, Parser

        self.stage = Parser(ParseConfig())
        self.stage.setup()  # starts the parser process: not timed

    def __call__(self, pdfs: list[Pdf]) -> list[str]:
        import pyarrow as pa

        texts: list[str] = []
        for i in range(0, len(pdfs), STAGE_BATCH):
            batch = pdfs[i : i + STAGE_BATCH]
            ids = [p.path.name for p in batch]
            out = self.stage(pa.table({"doc_id": ids, "content": [p.data for p in batch]}))
            texts.extend(out["text"].to_pylist())
        return texts


def extra_words(source: str, extracted: str) -> float:
    """The share of the extracted words (with multiplicity) that the source lacks."""
    got, want = words(extracted), words(source)
    total = sum(got.values())
    return sum(max(0, n - want[w]) for w, n in got.items()) / total if total else 0.0


def quality(pdfs: list[Pdf], texts: list[str]) -> tuple[float, float]:
    """(mean word recall, mean extra words); soft hyphens (invisible) not scored."""
    texts = [t.replace("\u00ad", "") for t in texts]
    pairs = list(zip(pdfs, texts, strict=True))
    recall = sum(word_recall(p.written, t) for p, t in pairs) / len(pdfs)
    return recall, sum(extra_words(p.written, t) for p, t in pairs) / len(pdfs)


def cpu_now() -> float:
    """CPU seconds so far of this process, its living children (the stage's parser
    process) and its reaped children (pdftotext)."""
    reaped = os.times()
    return tree_cpu_s(os.getpid()) + reaped.children_user + reaped.children_system


def alternate(methods: dict[str, Method], pdfs: list[Pdf], rounds: int) -> dict[str, dict]:
    """Every method once a round, the order rotated each round: per method its wall and
    CPU seconds of every round, and the recall and extra words of its texts."""
    names = list(methods)
    seen: dict[str, dict] = {n: {"seconds": [], "cpu": []} for n in names}
    for name in names:  # warm-up, not timed: imports, the parser process's first file
        methods[name](pdfs[:1])
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            started, cpu = time.perf_counter(), cpu_now()
            texts = methods[name](pdfs)
            seen[name]["seconds"].append(time.perf_counter() - started)
            seen[name]["cpu"].append(cpu_now() - cpu)
            if r == 0:
                seen[name]["recall"], seen[name]["extra"] = quality(pdfs, texts)
        print(f"  round {r + 1}: " + ", ".join(
            f"{n} {seen[n]['seconds'][-1]:.2f} s" for n in names), flush=True)  # fmt: skip
    return seen


def table(seen: dict[str, dict], n_pages: int, reference: str) -> str:
    """Markdown: median wall seconds, pages/s, pages per CPU-second, both against
    ``reference``, recall, extra words."""
    ref = {k: statistics.median(seen[reference][k]) for k in ("seconds", "cpu")}
    lines = [
        "| method | wall s | pages/s | vs the stage | CPU s | pages/CPU-s | vs the stage "
        "| word recall | extra words |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in seen.items():
        sec, cpu = statistics.median(s["seconds"]), statistics.median(s["cpu"])
        lines.append(
            f"| {name} | {sec:.2f} | {n_pages / sec:,.0f} | {ref['seconds'] / sec:.2f} | "
            f"{cpu:.2f} | {n_pages / cpu:,.0f} | {ref['cpu'] / cpu:.2f} | "
            f"{s['recall']:.3f} | {s['extra']:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=60)
    parser.add_argument("--pages", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    stage = StageMethod()
    methods: dict[str, Method] = {"parse stage (parser process, batches of 16)": stage}
    methods["docintel parse_file (pypdfium2 + layout)"] = per_file(docintel)
    methods["pypdfium2, raw text"] = per_file(pypdfium2_raw)
    methods["pypdf loop"] = per_file(pypdf_loop)
    if shutil.which("pdftotext"):
        methods["pdftotext (poppler)"] = per_file(pdftotext)
    with tempfile.TemporaryDirectory() as tmp:
        pdfs = make_pdfs(Path(tmp) / "pdfs", args.docs, args.pages)
        n_pages = args.docs * args.pages
        print(f"{args.docs} PDFs x {args.pages} pages = {n_pages} pages, {args.rounds} "
              "rounds, methods alternating", flush=True)  # fmt: skip
        seen = alternate(methods, pdfs, args.rounds)
    stage.stage.teardown()
    print()
    print(table(seen, n_pages, next(iter(methods))))
    if "pdftotext (poppler)" not in methods:
        print("\npdftotext not found: apt-get install poppler-utils")


if __name__ == "__main__":
    main()
