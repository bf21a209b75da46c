"""The parse stage itself (its parser process, no Ray): documents and attachments as rows,
refused files as DocumentsRejected, and, in a run that redacts, titles redacted like the
sentences (an e-mail's subject is written to documents.title)."""

from __future__ import annotations

from email.message import EmailMessage

import pyarrow as pa
import pytest

from docintel.pipeline.config import load_config
from docintel.pipeline.errors import DocumentsRejected
from docintel.pipeline.stages.parse import Parser

SUBJECT = "Call me at +44 20 7946 0958 or jane.doe@example.com"


def _files(**files: bytes) -> pa.Table:
    return pa.table({"doc_id": list(files), "content": pa.array(list(files.values()), pa.binary())})


def _mail() -> bytes:
    m = EmailMessage()
    m["Subject"], m["From"] = SUBJECT, "a@example.com"
    m.set_content("The body.")
    m.add_attachment(b"Attached notes.", maintype="text", subtype="plain", filename="n.txt")
    return m.as_bytes()


@pytest.mark.parametrize("redact", [False, True])
def test_titles_are_redacted_when_the_run_redacts(redact: bool) -> None:
    cfg = load_config(None, {"privacy.redact": redact})
    stage = Parser(cfg.parse, cfg.privacy)
    stage.setup()
    try:
        out = stage(_files(**{"m.eml": _mail()}))
    finally:
        stage.teardown()
    assert out["doc_id"].to_pylist() == ["m.eml", "m.eml/n.txt"]
    title = out["title"][0].as_py()
    if redact:
        assert title == "Call me at <PHONE_NUMBER> or <EMAIL_ADDRESS>"
    else:
        assert title == SUBJECT


def test_refused_files_leave_the_others_ready() -> None:
    stage = Parser(load_config().parse)
    stage.setup()
    try:
        with pytest.raises(DocumentsRejected) as caught:
            stage(_files(**{"a.txt": b"Fine text.", "b.docx": b"not a zip", "c.txt": b""}))
    finally:
        stage.teardown()
    assert caught.value.output["doc_id"].to_pylist() == ["a.txt"]
    assert {d: k for d, (k, _) in caught.value.reasons.items()} == {
        "b.docx": "NotAZip", "c.txt": "EmptyFile",
    }  # fmt: skip
