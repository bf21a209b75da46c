"""`docintel ingest`: a folder of text files becomes a documents Parquet file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import InputError
from pipeline.schema import DOC_ID, TEXT

ROW_GROUP_DOCS = 10_000  # row groups are the unit a run reads; keep several per big corpus


def ingest_folder(folder: Path, output: Path, patterns: list[str]) -> tuple[int, int]:
    """Write (doc_id = relative path, text) rows; return (documents, files with bad bytes)."""
    files = sorted({p for pat in patterns for p in folder.rglob(pat) if p.is_file()})
    if not files:
        raise InputError(f"{folder} holds no files matching {', '.join(patterns)}")
    ids, texts, replaced = [], [], 0
    for p in files:
        raw = p.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            replaced += 1
        ids.append(p.relative_to(folder).as_posix())
        texts.append(text)
    output.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({DOC_ID: pa.array(ids, pa.string()), TEXT: pa.array(texts, pa.string())})
    pq.write_table(table, output, row_group_size=ROW_GROUP_DOCS, compression="zstd")
    return len(ids), replaced
