"""Issue 32 items 1-4 end to end: `docintel run` on a folder of document files (PDF printed
by Chromium, HTML with boilerplate, DOCX, e-mail with attachments, text, Markdown) and
bad files, on a local Ray. Every file ends as a documents row; bad ones are error rows
with their reason; pages, titles and formats are recorded; resume and the changed-input
refusal work as for Parquet; a mix of Parquet and documents is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from docintel.actors.runner import execute
from docintel.pipeline.errors import UsageError
from docintel.pipeline.parse import word_recall
from tests.conftest import REPO, assert_exactly_once, run_config
from tests.data_make.parse_files import (
    Made,
    encrypted_pdf,
    memo_docx,
    news_html,
    report_pdf,
    scanned_pdf,
    zip_bytes,
)
from tests.integration.test_s3 import (  # moto's S3 server on loopback and its helpers
    IN_BUCKET,
    OUT_BUCKET,
    _cfg,
    _read_tables,
    s3,  # noqa: F401 (fixtures, requested by name)
    s3_endpoint,  # noqa: F401
)

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _mail(attached: Made, memo: Made) -> bytes:
    msg = EmailMessage()
    msg["From"] = "Tom Baker <tom@example.com>"
    msg["To"] = "anna@example.com"
    msg["Subject"] = "Quarterly pack"
    msg.set_content("Anna,\n\nThe quarterly pack is attached. The outlook is unchanged.\n")
    msg.add_attachment(attached.data, maintype="application", subtype="pdf", filename="q.pdf")
    docx = "vnd.openxmlformats-officedocument.wordprocessingml.document"
    msg.add_attachment(memo.data, maintype="application", subtype=docx, filename="memo.docx")
    msg.add_attachment(b"not a pdf", maintype="application", subtype="pdf", filename="bad.pdf")
    return msg.as_bytes()


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Made]:
    work = tmp_path_factory.mktemp("make")
    return {
        "report.pdf": report_pdf(work, n_pages=3),
        "long.pdf": report_pdf(work, n_pages=5, seed=2),
        "news.html": news_html(),
        "memos/memo.docx": memo_docx("Board memo"),
    }


def _folder(root: Path, made: dict[str, Made]) -> Path:
    for name, m in made.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(m.data)
    (root / "notes.md").write_text("# Weekly notes\n\nRevenue rose 4%.\n\nCosts fell.\n")
    (root / "plain.txt").write_text("Shares fell on Monday.\nThe outlook was cut.\n")
    (root / "mail.eml").write_bytes(_mail(made["report.pdf"], made["memos/memo.docx"]))
    bad = root / "bad"
    bad.mkdir()
    (bad / "empty.txt").write_bytes(b"")
    (bad / "cut.pdf").write_bytes(made["report.pdf"].data[:2000])
    (bad / "locked.pdf").write_bytes(encrypted_pdf(made["report.pdf"].data, root.parent))
    (bad / "notzip.docx").write_bytes(b"plain bytes, not a zip")
    bomb = {"word/document.xml": b"<w:document/>", "word/media/pad.bin": bytes(8 << 20)}
    (bad / "bomb.docx").write_bytes(zip_bytes(bomb))
    (bad / "big.txt").write_text("word " * 100_000)  # 500 kB, over max_bytes below
    (bad / "scan.pdf").write_bytes(scanned_pdf(made["report.pdf"].data, dpi=100))
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))  # not a document
    return root


LIMITS = {
    "parse.max_bytes": 400_000,
    "parse.max_pages": 4,
    "parse.max_uncompressed_bytes": 4 << 20,
    "run.batch_size": 4,
    "run.embeddings": False,
    "run.max_error_fraction": 0.9,  # half the files are bad on purpose
}


def test_a_folder_of_documents_runs_with_every_file_accounted_for(
    tmp_path: Path, made: dict[str, Made]
) -> None:
    root = _folder(tmp_path / "in", made)
    out = tmp_path / "out"
    summary = execute(run_config(**LIMITS), str(root), str(out))
    assert not summary.partial
    docs = pd.read_parquet(out / "documents").set_index("doc_id")
    expected_ok = {
        "report.pdf", "news.html", "memos/memo.docx", "notes.md", "plain.txt", "mail.eml",
        "mail.eml/q.pdf", "mail.eml/memo.docx",
    }  # fmt: skip
    expected_bad = {
        "long.pdf": "TooManyPages", "bad/empty.txt": "EmptyFile", "bad/cut.pdf": None,
        "bad/locked.pdf": "PasswordProtected", "bad/notzip.docx": "NotAZip",
        "bad/bomb.docx": None, "bad/big.txt": "FileTooLarge", "bad/scan.pdf": None,
        "mail.eml/bad.pdf": None,
    }  # fmt: skip
    assert set(docs.index) == expected_ok | set(expected_bad)  # image.png is no document
    assert set(docs.index[docs.status == "ok"]) == expected_ok
    errors = pd.read_parquet(out / "errors").set_index("doc_id")
    assert set(errors.index) == set(expected_bad)
    for doc, kind in expected_bad.items():
        if kind:
            assert errors.loc[doc, "error_type"] == kind, errors.loc[doc].to_dict()
    assert "ocr" in errors.loc["bad/scan.pdf", "message"].lower()
    assert docs.loc["report.pdf", "source_format"] == "pdf"
    assert docs.loc["report.pdf", "n_pages"] == 3 and pd.isna(docs.loc["news.html", "n_pages"])
    assert docs.loc["news.html", "title"] and docs.loc["mail.eml", "title"] == "Quarterly pack"
    assert docs.loc["memos/memo.docx", "source_format"] == "docx"
    assert docs.loc["bad/notzip.docx", "source_format"] == "docx"  # from its name
    _check_sentences(out, made)


def _check_sentences(out: Path, made: dict[str, Made]) -> None:
    sents = pq.read_table(out / "sentences").to_pandas()
    pdf = sents[sents.doc_id == "report.pdf"].sort_values("sent_index")
    assert list(pdf.page.unique()) == [1, 2, 3]  # in order, every page
    assert pdf.page.is_monotonic_increasing
    assert sents[sents.doc_id == "news.html"].page.isna().all()
    pairs = [("report.pdf", "report.pdf"), ("mail.eml/q.pdf", "report.pdf")]
    pairs += [(d, d) for d in ("news.html", "memos/memo.docx")]
    for doc, key in pairs:
        text = " ".join(sents[sents.doc_id == doc].sort_values("sent_index").text)
        assert word_recall(made[key].source, text) >= 0.97, doc
    assert not sents.text.str.contains("cookie", case=False).any()  # boilerplate dropped
    assert (sents.parse_backend == "cpu-fp32").all()


def test_a_parser_past_its_time_limit_is_restarted_and_the_run_goes_on(
    tmp_path: Path, made: dict[str, Made]
) -> None:
    """OCR of a scanned report takes seconds: under a 1 s limit it is an error row, the
    parser process is killed and restarted, and the files after it are parsed."""
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.txt").write_text("The first file parses.")
    (root / "b_scan.pdf").write_bytes(scanned_pdf(made["report.pdf"].data, dpi=150))
    (root / "c.txt").write_text("The file after the hang parses too.")
    out = tmp_path / "out"
    cfg = run_config(**{"parse.ocr": True, "parse.time_limit_s": 1.0, "run.embeddings": False})
    execute(cfg, str(root), str(out))
    docs = pd.read_parquet(out / "documents").set_index("doc_id")
    assert docs.status.to_dict() == {"a.txt": "ok", "b_scan.pdf": "error", "c.txt": "ok"}
    err = pd.read_parquet(out / "errors").set_index("doc_id").loc["b_scan.pdf"]
    assert err.error_type == "ParseTimeout" and "time_limit_s" in err.message


def test_resume_and_changed_input_work_as_for_parquet(
    tmp_path: Path, made: dict[str, Made]
) -> None:
    root = tmp_path / "in"
    root.mkdir()
    names = [f"n{i}.txt" for i in range(6)]
    for i, n in enumerate(names):
        (root / n).write_text(f"Note {i}. Sales rose {i} per cent.")
    (root / "r.pdf").write_bytes(made["report.pdf"].data)
    out = tmp_path / "out"
    base = {"run.run_id": "r1", "run.batch_size": 2, "run.part_target_mb": 0,
            "run.embeddings": False}  # fmt: skip
    assert execute(run_config(**base), str(root), str(out)).batches == 4
    (out / "_manifest.json").unlink()  # a crash after 3 of 4 batches
    sorted((out / "documents").iterdir())[0].unlink()
    resumed = execute(run_config(**base), str(root), str(out))
    assert resumed.batches == 1 and resumed.skipped_batches == 3
    assert_exactly_once(out, sorted([*names, "r.pdf"]))
    assert execute(run_config(**base), str(root), str(out)).already_complete
    os.utime(root / "n0.txt", ns=(1, 1))  # same path and size, another mtime
    with pytest.raises(UsageError, match="a different input"):
        execute(run_config(**base), str(root), str(out))


def test_a_mix_of_parquet_and_documents_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    pq.write_table(pa.table({"doc_id": ["a"], "text": ["x"]}), root / "docs.parquet")
    (root / "memo.txt").write_text("A memo.")
    done = subprocess.run(
        [sys.executable, "-m", "docintel.jobs.cli", "run", str(root), str(tmp_path / "o"),
         "--no-progress"],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "docs.parquet" in done.stderr and "memo.txt" in done.stderr
    assert not (tmp_path / "o" / "_manifest.json").exists()


def test_an_s3_prefix_of_documents(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Document files under an S3 prefix (moto's server on loopback): ids relative to the
    prefix, bytes read by the read tasks, output on S3 read back."""
    client: Any = request.getfixturevalue("s3")
    endpoint = request.getfixturevalue("s3_endpoint")
    memo, news = memo_docx("Memo"), news_html()
    for key, body in (("inbox/a.txt", b"Profits rose. Costs fell."),
                      ("inbox/web/news.html", news.data), ("inbox/memo.docx", memo.data),
                      ("inbox/skip.png", b"\x89PNG")):  # fmt: skip
        client.put_object(Bucket=IN_BUCKET, Key=key, Body=body)
    out = f"s3://{OUT_BUCKET}/docs-run"
    cfg = _cfg(endpoint, **{"run.embeddings": False})
    summary = execute(cfg, f"s3://{IN_BUCKET}/inbox/", out)
    assert summary.documents == 3 and not summary.partial
    tables = _read_tables(endpoint, out.removeprefix("s3://"))
    docs = tables["documents"].set_index("doc_id")
    assert sorted(docs.index) == ["a.txt", "memo.docx", "web/news.html"]
    assert (docs.status == "ok").all()
    assert docs.loc["web/news.html", "source_format"] == "html"
    assert execute(cfg, f"s3://{IN_BUCKET}/inbox/", out).already_complete
