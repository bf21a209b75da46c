"""docintel.pipeline.parse: e-mails made with the standard library: a plain part with a
PDF (printed by Chromium) and a DOCX attached, an HTML-only one, an attached e-mail, and
attachments that are skipped (an image) or fail (a truncated PDF) on their own."""

from __future__ import annotations

from email.message import EmailMessage

import pytest

from docintel.pipeline.parse import parse_file, word_recall
from docintel.pipeline.parse.eml import MAX_DEPTH
from docintel.pipeline.parse.errors import EmptyFile, TruncatedFile
from tests.data_make.parse_files import ARTICLE, Made, memo_docx, news_html, report_pdf

BODY = (
    "Hi Anna,\n\nPlease find attached the annual report and the third-quarter memo. The "
    "board meets on Tuesday to approve both.\n\nBest regards,\nTom\n"
)
PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)


def message(subject: str, plain: str | None = None, html: str | None = None) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = "Tom Baker <tom@example.com>"
    msg["To"] = "anna@example.com"
    msg["Subject"] = subject
    msg["Date"] = "Tue, 02 Apr 2024 09:30:00 +0000"
    if plain is not None:
        msg.set_content(plain)
    if html is not None:
        if plain is None:
            msg.set_content(html, subtype="html")
        else:
            msg.add_alternative(html, subtype="html")
    return msg


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Made:
    return report_pdf(tmp_path_factory.mktemp("report"), n_pages=2)


@pytest.fixture(scope="module")
def with_attachments(report: Made) -> bytes:
    msg = message("Annual report and Q3 memo", plain=BODY, html="<p>HTML twin, not used</p>")
    msg.add_attachment(report.data, maintype="application", subtype="pdf", filename="report.pdf")
    msg.add_attachment(
        memo_docx().data,
        maintype="application",
        subtype="vnd.openxmlformats-officedocument.wordprocessingml.document",
        filename="q3 memo.docx",
    )
    msg.add_attachment(PNG, maintype="image", subtype="png", filename="logo.png")
    return msg.as_bytes()


def test_plain_part_and_attachments_become_documents(with_attachments: bytes, report: Made) -> None:
    docs = parse_file("inbox/2024-04-02.eml", with_attachments)
    ids = [d.doc_id("inbox/2024-04-02.eml") for d in docs]
    assert ids == [
        "inbox/2024-04-02.eml",
        "inbox/2024-04-02.eml/report.pdf",
        "inbox/2024-04-02.eml/q3 memo.docx",
    ]
    mail, pdf, docx = docs
    assert (mail.source_format, mail.title) == ("eml", "Annual report and Q3 memo")
    assert mail.text == BODY.strip()  # the plain part, not the HTML alternative
    assert mail.notes == (
        "inbox/2024-04-02.eml: attachment logo.png skipped (not a supported document type)",
    )
    assert (pdf.source_format, pdf.n_pages, len(pdf.pages or [])) == ("pdf", 2, 2)
    assert docx.source_format == "docx"
    recalls = {
        "eml": word_recall(BODY, mail.text),
        "eml/pdf": word_recall(report.source, pdf.text),
        "eml/docx": word_recall(memo_docx().source, docx.text),
    }
    print("eml recall", {k: round(v, 3) for k, v in recalls.items()})
    assert min(recalls.values()) >= 0.97


def test_html_only_mail_goes_through_the_html_path() -> None:
    made = news_html()
    msg = message("Newsletter: rates on hold", html=made.data.decode())
    [doc] = parse_file("news.eml", msg.as_bytes())
    recall = word_recall(made.source, doc.text)
    print(f"eml (html part) recall {recall:.3f}")
    assert recall >= 0.97
    assert doc.text.split("\n\n") == ARTICLE
    assert "Accept all cookies" not in doc.text
    assert doc.title == "Newsletter: rates on hold"


def test_bad_attachment_is_its_own_error(report: Made) -> None:
    msg = message("Broken attachment", plain="See the attached file, which may be damaged.")
    cut = report.data[: len(report.data) // 3]
    msg.add_attachment(cut, maintype="application", subtype="pdf", filename="cut.pdf")
    mail, bad = parse_file("m.eml", msg.as_bytes())
    assert mail.error is None and "attached file" in mail.text
    assert bad.doc_id("m.eml") == "m.eml/cut.pdf"
    assert isinstance(bad.error, TruncatedFile)
    assert (bad.text, bad.source_format) == ("", "pdf")
    assert str(bad.error).startswith("cut.pdf: the PDF ends without its %%EOF marker")


def test_attached_mail_and_its_attachment(report: Made) -> None:
    inner = message("Fwd: figures", plain="Forwarding the figures as promised.")
    inner.add_attachment(report.data, maintype="application", subtype="pdf", filename="report.pdf")
    outer = message("Re: figures", plain="See the forwarded message below.")
    outer.add_attachment(inner)  # message/rfc822
    docs = parse_file("thread.eml", outer.as_bytes())
    assert [d.doc_id("thread.eml") for d in docs] == [
        "thread.eml",
        "thread.eml/attachment-1.eml",
        "thread.eml/attachment-1.eml/report.pdf",
    ]
    assert docs[1].title == "Fwd: figures" and docs[2].n_pages == 2


def test_nesting_is_bounded() -> None:
    msg = message("level 0", plain="level 0 text")
    for level in range(1, MAX_DEPTH + 3):
        outer = message(f"level {level}", plain=f"level {level} text")
        outer.add_attachment(msg)
        msg = outer
    docs = parse_file("deep.eml", msg.as_bytes())
    assert len(docs) == MAX_DEPTH + 1
    assert "nested too deep" in docs[-1].notes[0]


def test_duplicate_and_unsafe_attachment_names() -> None:
    msg = message("Two files", plain="Two notes attached.")
    for text in ("first note text", "second note text"):
        msg.add_attachment(text.encode(), maintype="text", subtype="plain", filename="../notes.txt")
    docs = parse_file("m.eml", msg.as_bytes())
    assert [d.doc_id_suffix for d in docs[1:]] == ["_notes.txt", "_notes (2).txt"]
    assert [d.text for d in docs[1:]] == ["first note text", "second note text"]


def test_mail_without_body_or_attachments_is_empty() -> None:
    msg = message("Nothing here", plain="")
    with pytest.raises(EmptyFile, match="no body text and no attachments"):
        parse_file("empty.eml", msg.as_bytes())
