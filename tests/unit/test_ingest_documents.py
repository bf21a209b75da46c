"""Issue 32 item 7: `docintel ingest` reads PDF, HTML, DOCX and e-mail through the parse
stage's parsers (their own process, the same time limit); on a mixed folder it names what
it skipped and why."""

from __future__ import annotations

from email.message import EmailMessage
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from docintel.pipeline.input.ingest import DEFAULT_PATTERNS, NOT_A_DOCUMENT, ingest_folder
from docintel.pipeline.parse import word_recall
from tests.data_make.parse_files import Made, memo_docx, news_html, report_pdf


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Made:
    return report_pdf(tmp_path_factory.mktemp("pdf"), n_pages=2)


def _mail(memo: Made) -> bytes:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "a@example.com", "b@example.com", "Board pack"
    msg.set_content("The board pack is attached.")
    docx = "vnd.openxmlformats-officedocument.wordprocessingml.document"
    msg.add_attachment(memo.data, maintype="application", subtype=docx, filename="memo.docx")
    return msg.as_bytes()


def test_a_mixed_folder_is_ingested_through_the_parsers(tmp_path: Path, report: Made) -> None:
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    memo, news = memo_docx("Memo"), news_html()
    (folder / "report.pdf").write_bytes(report.data)
    (folder / "sub" / "news.html").write_bytes(news.data)
    (folder / "memo.docx").write_bytes(memo.data)
    (folder / "mail.eml").write_bytes(_mail(memo))
    (folder / "note.txt").write_text("Plain text stays text.")
    (folder / "broken.docx").write_bytes(b"not a zip")
    (folder / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    out = tmp_path / "docs.parquet"
    result = ingest_folder(folder, out, list(DEFAULT_PATTERNS))
    rows = {r["doc_id"]: r for r in pq.read_table(out).to_pylist()}
    assert set(rows) == {"report.pdf", "sub/news.html", "memo.docx", "mail.eml",
                         "mail.eml/memo.docx", "note.txt"}  # fmt: skip
    assert result.documents == 6
    skipped = {s.doc_id: s.reason for s in result.skipped}
    assert skipped["photo.png"] == NOT_A_DOCUMENT
    assert skipped["broken.docx"].startswith("NotAZip: broken.docx")
    pdf = rows["report.pdf"]
    assert pdf["source_format"] == "pdf" and pdf["decoding"] == "parsed"
    assert len(pdf["page_starts"]) == 2 and pdf["page_starts"][0] == 0
    assert word_recall(report.source, pdf["text"]) >= 0.97
    assert rows["sub/news.html"]["title"] and "cookie" not in rows["sub/news.html"]["text"]
    assert rows["mail.eml"]["title"] == "Board pack"
    assert word_recall(memo.source, rows["mail.eml/memo.docx"]["text"]) >= 0.97
    assert rows["note.txt"]["source_format"] == "txt" and rows["note.txt"]["encoding"] == "utf-8"


def test_with_a_pattern_only_matching_files_count(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("Kept.")
    (folder / "b.html").write_bytes(news_html().data)
    result = ingest_folder(folder, tmp_path / "o.parquet", ["*.txt"])
    assert result.documents == 1 and result.skipped == []  # b.html is not named skipped
