"""The ``parse`` stage: document files (PDF, HTML, DOCX, e-mail, text) to text.

First in the chain when INPUT is a folder, glob or prefix of document files (an optional
built-in stage: the plan asks for it from the input). Its rows come from the read task
(doc_id = the file's path relative to the input, ``content`` = its bytes); it returns one
row per document (the file's own, then e-mail attachments as ``<path>/<name>``) with the
text and the document columns (schema.DOCUMENT_COLUMNS) that run_stage moves to the
batch's documents.

A parser runs in a child process of the replica, one file at a time: a file that takes
longer than ``[parse] time_limit_s`` (a hostile PDF that loops, OCR of a huge scan) has
its child killed and restarted, becomes an error row (ParseTimeout), and the batch goes
on. A child that dies (a crash in a native library) is the same. Memory: the child holds
one file's bytes and text at a time (files over ``max_bytes`` are never read).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from typing import Any, ClassVar

import pyarrow as pa
from pydantic import Field

from docintel.pipeline.errors import DocumentsRejected
from docintel.pipeline.schema import (
    BACKEND_CPU_FP32,
    CONTENT,
    DOC_ID,
    DOCUMENT_COLUMNS,
    DOCUMENT_META_SCHEMA,
    PARSERS,
    TEXT,
)
from docintel.pipeline.settings import Settings
from docintel.pipeline.stages.base import Stage

# One document may hold a parser this long: a 300-page PDF parses in 2-3 s, OCR takes a
# few seconds per page, so 120 s covers a long scanned filing; past it the parser's
# process is killed and restarted and the file is an error row.
DEFAULT_TIME_LIMIT_S = 120.0
CHILD_START_S = 60.0  # a child's start (spawn + imports) gets this long before it counts


class ParseConfig(Settings):
    """The ``[parse]`` config section (document input only)."""

    max_bytes: int = Field(128 * 1024 * 1024, ge=1)  # larger files: error row, never read
    max_pages: int = Field(2_000, ge=1)  # PDFs with more pages: error row
    ocr: bool = False  # scanned PDFs through Tesseract (Debian package tesseract-ocr)
    time_limit_s: float = Field(DEFAULT_TIME_LIMIT_S, gt=0)  # per file, then restart
    max_uncompressed_bytes: int = Field(1024 * 1024 * 1024, ge=1)  # DOCX zip bomb bound

    def limits(self) -> Any:
        from docintel.pipeline.parse import ParseLimits

        return ParseLimits(self.max_bytes, self.max_pages, self.ocr, self.max_uncompressed_bytes)


def serve(fd: int) -> None:
    """The child (``python -c``, so nothing of the parent's ``__main__`` is imported
    again): parse each (name, bytes) received on the socket ``fd``, answer plain values
    (no exceptions cross: their classes need not pickle). The first message is the
    limits."""
    from docintel.pipeline.parse import ParseError, parse_file

    conn = Connection(fd)
    limits = conn.recv()
    conn.send(("ready", None))
    while True:
        try:
            name, data = conn.recv()
        except EOFError:
            return
        try:
            docs = parse_file(name, data, limits)
            conn.send(("ok", [_plain(d) for d in docs]))
        except ParseError as e:
            conn.send(("error", (type(e).__name__, str(e))))
        except Exception as e:  # a parser bug: still this file's error row, not a crash
            conn.send(("error", (type(e).__name__, f"{name}: {e}")))


_CHILD = "import sys; from docintel.pipeline.stages.parse import serve; serve(int(sys.argv[1]))"


def _plain(doc: Any) -> dict[str, Any]:
    err = doc.error
    return {
        "suffix": doc.doc_id_suffix,
        "text": doc.text,
        "format": doc.source_format,
        "page_starts": None if doc.pages is None else [a for a, _ in doc.pages],
        "title": doc.title,
        "n_pages": doc.n_pages,
        "error": None if err is None else (type(err).__name__, str(err)),
    }


class ParseTimeout(Exception):
    """A file that held the parser past ``[parse] time_limit_s``."""


class _Child:
    """One parser process, started on first use and again after a kill."""

    def __init__(self, limits: Any) -> None:
        self.limits = limits
        self.proc: Any = None
        self.conn: Any = None

    def start(self) -> None:
        mine, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(theirs.fileno())], pass_fds=[theirs.fileno()]
        )
        theirs.close()
        self.conn = Connection(mine.detach())
        self.conn.send(self.limits)
        if not self.conn.poll(CHILD_START_S):
            self.stop()
            raise RuntimeError(f"the parser process did not start within {CHILD_START_S} s")
        self.conn.recv()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)
            self.conn.close()
        self.proc = self.conn = None

    def parse(self, name: str, data: bytes, limit_s: float) -> tuple[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self.start()
        self.conn.send((name, data))
        if not self.conn.poll(limit_s):
            self.stop()
            return "error", ("ParseTimeout", f"{name}: parsing took over {limit_s:g} s "
                             "([parse] time_limit_s); the parser was restarted")  # fmt: skip
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            code = self.proc.poll() if self.proc is not None else None
            self.stop()
            return "error", ("ParserCrashed", f"{name}: the parser process died (exit "
                             f"code {code}) on this file; it was restarted")  # fmt: skip


class Parser(Stage):
    name: ClassVar[str] = "parse"
    input_columns: ClassVar[tuple[str, ...]] = (DOC_ID, CONTENT)
    output_columns: ClassVar[tuple[str, ...]] = (DOC_ID, TEXT, *DOCUMENT_COLUMNS)
    keeps_input: ClassVar[bool] = False
    document_columns: ClassVar[tuple[str, ...]] = DOCUMENT_COLUMNS

    def __init__(self, cfg: ParseConfig, privacy: Any = None) -> None:
        self.cfg = cfg
        # a run that redacts ([privacy]): titles (an e-mail's subject, a PDF's metadata)
        # are redacted here, as the privacy stage redacts the sentences
        self.privacy = privacy if privacy is not None and privacy.on else None
        self.redactor: Any = None
        self.child: _Child | None = None

    def setup(self) -> None:
        if self.privacy is not None:
            self.redactor = self.privacy.redactor()
        self.child = _Child(self.cfg.limits())
        self.child.start()
        self.backend = BACKEND_CPU_FP32
        self.version = _version()

    def _titled(self, d: dict[str, Any]) -> dict[str, Any]:
        if self.redactor is not None and d["title"]:
            d = {**d, "title": self.redactor.redact(d["title"])[0]}
        return d

    def teardown(self) -> None:
        if self.child is not None:
            self.child.stop()

    def __call__(self, table: pa.Table) -> pa.Table:
        assert self.child is not None, "setup() first"
        rows: list[dict[str, Any]] = []
        rejected: dict[str, tuple[str, str]] = {}
        for doc_id, data in zip(table[DOC_ID].to_pylist(), table[CONTENT].to_pylist(), strict=True):
            status, value = self.child.parse(doc_id, data or b"", self.cfg.time_limit_s)
            if status == "error":
                rejected[doc_id] = value
                continue
            for d in value:
                one = f"{doc_id}/{d['suffix']}" if d["suffix"] else doc_id
                if d["error"] is not None:
                    rejected[one] = d["error"]
                else:
                    rows.append(_row(one, self._titled(d)))
        out = _table(rows)
        if rejected:
            raise DocumentsRejected(rejected, out)
        return out


def _row(doc_id: str, d: dict[str, Any]) -> dict[str, Any]:
    return {
        DOC_ID: doc_id,
        TEXT: d["text"],
        "source_format": d["format"],
        "n_pages": d["n_pages"],
        "title": d["title"],
        "page_starts": d["page_starts"],
    }


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    schema = pa.schema([DOCUMENT_META_SCHEMA.field(DOC_ID), pa.field(TEXT, pa.string())])
    for name in DOCUMENT_COLUMNS:
        schema = schema.append(DOCUMENT_META_SCHEMA.field(name))
    return pa.Table.from_pylist(rows, schema=schema)


def _version() -> str:
    """The parsers' versions (what a row's parse_model records)."""
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for dist in ("pypdfium2", "trafilatura", "python-docx"):
        try:
            parts.append(f"{dist}-{version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist}-absent")
    return "+".join(parts)


def _spec() -> Any:
    from docintel.pipeline.stages.spec import Backend, PoolDefaults, StageSpec

    return StageSpec(
        name=Parser.name,
        cls=Parser,
        backends={PARSERS: Backend(lambda cfg, _pool: Parser(cfg.parse, cfg.privacy))},
        choose=lambda _cfg, _pool: PARSERS,
        # CPU only; the heaviest CPU stage after the encoder on PDFs (bench/parse_pdf.py)
        pool=PoolDefaults(PARSE_CPUS),
        section=ParseConfig,
        has_weights=False,
        wanted=lambda cfg: cfg.input.kind == "documents",
        wanted_by="document files as INPUT (a folder, glob or prefix of .pdf .html .docx "
        ".eml .txt .md files; [input] kind = 'documents')",
    )


PARSE_CPUS = 0.25
PARSE = _spec()
