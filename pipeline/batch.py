"""The envelope a batch travels in between stages (a plain, picklable dataclass)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from docintel.pipeline.schema import empty_errors


@dataclass
class Batch:
    """One batch of documents on its way through the stages.

    ``table`` is the current payload: documents (doc_id, text) before ``sentencize``,
    sentence rows after it. ``doc_ids`` always lists every document of the batch, so the
    sink can write exactly one documents row per input document, whatever failed.
    """

    batch_id: str
    doc_ids: pa.Array
    table: pa.Table
    errors: pa.Table = field(default_factory=empty_errors)
    # Per stage: seconds of work, the backend that served it, the model version used.
    seconds: dict[str, float] = field(default_factory=dict)
    backends: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    # Document input only: per document, what the documents table records beside its
    # counts (schema.DOCUMENT_META_SCHEMA: source format, pages, title, page starts); the
    # read task fills the format from the file name, the parse stage the rest. None for
    # Parquet input.
    documents: pa.Table | None = None

    @property
    def n_docs(self) -> int:
        return len(self.doc_ids)
