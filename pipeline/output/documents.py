"""What the tables record of a document beside its sentences: its source format, pages and
title (documents table), and each sentence's page (sentences table).

Parquet input has no such columns: its documents are ``source_format = "parquet"`` with
null pages and title. Document input carries them in :attr:`Batch.documents` (the read
task fills the format from the file's name, the parse stage the rest).
"""

from __future__ import annotations

from pathlib import PurePosixPath

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from docintel.pipeline.batch import Batch
from docintel.pipeline.schema import (
    DOC_ID,
    FOUND,
    N_PAGES,
    PAGE_STARTS,
    PARQUET_SOURCE,
    SOURCE_FORMAT,
    START_CHAR,
    TITLE,
)


def document_columns(batch: Batch) -> dict[str, pa.Array]:
    """``source_format``, ``n_pages`` and ``title`` for each of ``batch.doc_ids``."""
    n = batch.n_docs
    docs = batch.documents
    if docs is None:
        return {
            SOURCE_FORMAT: pa.array([PARQUET_SOURCE] * n, pa.string()),
            N_PAGES: pa.nulls(n, pa.int32()),
            TITLE: pa.nulls(n, pa.string()),
        }
    at = pc.index_in(batch.doc_ids, value_set=docs[DOC_ID])
    fmt = pc.take(docs[SOURCE_FORMAT], at)
    if fmt.null_count:  # a refused attachment: its format by its name
        by_name = [_by_name(d) for d in batch.doc_ids.to_pylist()]
        fmt = pc.coalesce(fmt, pa.array(by_name, pa.string()))
    return {
        SOURCE_FORMAT: fmt,
        N_PAGES: pc.take(docs[N_PAGES], at),
        TITLE: pc.take(docs[TITLE], at),
    }


def _by_name(doc_id: str) -> str:
    from docintel.pipeline.input.documents import DOCUMENT_SUFFIXES

    return DOCUMENT_SUFFIXES.get(PurePosixPath(doc_id).suffix.lower(), "unknown")


def page_column(batch: Batch, sentences: pa.Table) -> pa.Array:
    """Each sentence row's 1-based page: the page its first character falls on, from its
    document's page starts; null for documents without pages (and Parquet input)."""
    n = sentences.num_rows
    docs = batch.documents
    if docs is None or n == 0 or docs[PAGE_STARTS].null_count == docs.num_rows:
        return pa.nulls(n, pa.int32())
    starts = dict(zip(docs[DOC_ID].to_pylist(), docs[PAGE_STARTS].to_pylist(), strict=True))
    ids = sentences[DOC_ID].to_pylist()
    chars = sentences[START_CHAR].to_numpy(zero_copy_only=False)
    pages: list[int | None] = []
    for doc, char in zip(ids, chars, strict=True):
        s = starts.get(doc)
        pages.append(None if s is None else max(1, int(np.searchsorted(s, char, "right"))))
    return pa.array(pages, pa.int32())


def found_documents(batch: Batch) -> int:
    """How many of the batch's documents were found inside its files (e-mail attachments,
    rows the input's file count does not hold)."""
    docs = batch.documents
    return 0 if docs is None else int(pc.sum(docs[FOUND]).as_py() or 0)
