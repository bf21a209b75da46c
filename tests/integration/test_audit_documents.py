"""Issue 32 item 8: the nightly audit over a folder of document files, two nights on a local
Ray. Files are selected by content (a file touched with the same bytes is unchanged, not
run again), staged under their relative paths (the night's ids are the source's), an
e-mail's attachment follows its file, and the report's drill-down shows PDF page numbers."""

from __future__ import annotations

import json
import os
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from docintel.actors.runner import execute
from docintel.pipeline.audit import run_audit
from tests.data_make.parse_files import news_html, report_pdf
from tests.integration.test_audit import _cfg

pytestmark = pytest.mark.usefixtures("ray_cluster")

D1, D2 = "2026-03-01", "2026-03-02"
CHANGED = "Revenue fell sharply after the warning. The board cut the dividend.\n"


def _mail() -> bytes:
    msg = EmailMessage()
    msg["From"] = "tom@example.com"
    msg["To"] = "anna@example.com"
    msg["Subject"] = "Weekly figures"
    msg.set_content("Anna,\n\nThe weekly figures are attached. Sales were flat.\n")
    note = b"Margins narrowed in the north. Stock levels rose.\n"
    msg.add_attachment(note, maintype="text", subtype="plain", filename="figures.txt")
    return msg.as_bytes()


def _bump(path: Path, seconds: int = 5) -> None:
    """Move the file's mtime on (coarse-timestamp filesystems see it too)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 1_000_000_000))


def _ids(root: Path) -> list[str]:
    return sorted(pd.read_parquet(root / "documents")["doc_id"].tolist())


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("audit_docs")
    src, out = tmp / "src", tmp / "out"
    (src / "reports").mkdir(parents=True)
    (src / "reports" / "annual.pdf").write_bytes(report_pdf(tmp, n_pages=3).data)
    (src / "news.html").write_bytes(news_html().data)
    (src / "note.txt").write_text("Shares rose on Monday. The outlook was raised.\n")
    (src / "old.txt").write_text("This memo is withdrawn tomorrow.\n")
    (src / "mail.eml").write_bytes(_mail())
    (src / "_draft.txt").write_text("A hidden draft, never audited.\n")
    s1 = run_audit(_cfg(), str(src), str(out), D1, execute)
    # night 2: one file's bytes changed, one touched with the same bytes, one new, one gone
    (src / "note.txt").write_text(CHANGED)
    _bump(src / "note.txt")
    _bump(src / "news.html")
    (src / "reports" / "new.txt").write_text("A new supplier was appointed in March.\n")
    (src / "old.txt").unlink()
    s2 = run_audit(_cfg(), str(src), str(out), D2, execute)
    return {"src": src, "out": out, "s1": s1, "s2": s2}


def _report(out: Path, day: str) -> dict[str, Any]:
    return json.loads((out / f"run_date={day}" / "report.json").read_text())


def test_nights_count_files_by_content_and_rerun_only_what_changed(nights: dict) -> None:
    out, s1, s2 = nights["out"], nights["s1"], nights["s2"]
    files = ["mail.eml", "news.html", "note.txt", "old.txt", "reports/annual.pdf"]
    assert (s1.new, s1.changed, s1.unchanged, s1.removed) == (5, 0, 0, 0)
    # the attachment is a document of the night, following its e-mail (not counted apart)
    assert _ids(out / f"run_date={D1}") == sorted([*files, "mail.eml/figures.txt"])
    # touched news.html is unchanged by content; annual.pdf and mail.eml were not read
    assert (s2.new, s2.changed, s2.unchanged, s2.removed) == (1, 1, 3, 1)
    assert _ids(out / f"run_date={D2}") == ["note.txt", "reports/new.txt"]
    ch = _report(out, D2)["changes"]
    assert ch["new"] == ["reports/new.txt"] and ch["removed"] == ["old.txt"]
    assert [c["doc_id"] for c in ch["changed"]] == ["note.txt"]
    # staged under the source's relative paths; the hidden draft never staged
    staged = out / "_audit" / "inputs" / f"run_date={D1}"
    assert (staged / "reports" / "annual.pdf").read_bytes() == (
        nights["src"] / "reports" / "annual.pdf"
    ).read_bytes()
    assert not list(staged.rglob("_draft.txt"))
    # the touched file's new stamp is recorded: the next night does not read it again
    state = json.loads((out / "_audit" / "state.json").read_text())
    stamp = state["files"][str(nights["src"] / "news.html")]
    assert stamp["mtime_ns"] == (nights["src"] / "news.html").stat().st_mtime_ns
    # latest/ holds every current document once, the attachment with its e-mail
    latest = pd.read_parquet(out / "latest" / "documents")
    assert sorted(latest.doc_id) == sorted(
        ["mail.eml", "mail.eml/figures.txt", "news.html", "note.txt", "reports/annual.pdf",
         "reports/new.txt"]
    )  # fmt: skip
    review = {r["doc_id"]: r["status"] for r in _report(out, D1)["review"]}
    assert review["mail.eml/figures.txt"] == "new"


def test_drilldown_shows_pdf_page_numbers(nights: dict) -> None:
    out = nights["out"]
    rep = _report(out, D1)
    (pdf,) = [d for d in rep["drilldown"] if d["doc_id"] == "reports/annual.pdf"]
    pages = [s["page"] for s in pdf["sentences"]]
    assert pages[0] == 1 and max(pages) == 3 and pages == sorted(pages)
    (txt,) = [d for d in rep["drilldown"] if d["doc_id"] == "note.txt"]
    assert all(s["page"] is None for s in txt["sentences"])
    html = (out / f"run_date={D1}" / "report.html").read_text()
    assert '<span class="page">p. 1</span>' in html and '<span class="page">p. 3</span>' in html
    assert html.count('<span class="page">') == len(pdf["sentences"])
