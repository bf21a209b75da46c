"""What `docintel search` and `docintel index` read: a committed run's sentences table.

:class:`SentencesSource` opens an output (a local folder or ``s3://`` prefix), refuses one
that is not committed (no ``_manifest.json``) or has no embeddings (a ``--no-embeddings``
run), and yields the sentences table as Arrow record batches of the wanted columns, one
Parquet row group at a time (memory is bounded by the batch and one row group, whatever
the table's size). :meth:`SentencesSource.open` asks the format registry (pipeline/formats/) which
format wrote the output and reads through its :class:`~docintel.pipeline.output.tables.RunTables`:
a Parquet run folder's parts, or, for a warehouse format (Iceberg, Delta Lake), the rows
one run appended (the latest committed run unless a run id is given).

Also here, because both the exact scan and the index use them: the filters
(:class:`Filters`), the hit columns and cosine similarity over an embedding column.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline import formats
from docintel.pipeline.config import Config, StorageConfig
from docintel.pipeline.errors import InputError
from docintel.pipeline.output.sink import MANIFEST
from docintel.pipeline.output.tables import RunTables
from docintel.pipeline.schema import (
    DOC_ID,
    EMBEDDING,
    ENTITIES,
    LABEL,
    SCORE,
    SENT_INDEX,
    TEXT,
)
from docintel.pipeline.storage import check_bucket, display_uri, is_local, resolve_uri, s3_error

SENTENCES = "sentences"
READ_BATCH_ROWS = 8192  # rows per record batch: 8192 x 384 floats = 12 MiB of embeddings
SIMILARITY = "similarity"
HIT_COLUMNS = (DOC_ID, SENT_INDEX, TEXT, LABEL, SCORE)
BM25 = "bm25"  # a hit's keyword score; null when the keyword ranking did not pick it
HIT_KEYS = (*HIT_COLUMNS, SIMILARITY, BM25)  # one hit, as --json writes it


@dataclass
class SentencesSource:
    """A committed run's sentences table (see the module docstring)."""

    fs: pafs.FileSystem
    root: str
    manifest: dict[str, Any]
    storage: StorageConfig
    tables: RunTables
    home: str  # where the run's own files (and its index) live: root, or _runs/<run id>

    @property
    def uri(self) -> str:
        return display_uri(self.fs, self.root)

    @property
    def table_format(self) -> str:
        """The format that wrote the run (a warehouse format's manifest names it)."""
        return formats.of_manifest(self.manifest).name

    @classmethod
    def open(
        cls,
        output_uri: str,
        storage: StorageConfig | None = None,
        cfg: Config | None = None,
        run_id: str | None = None,
    ) -> SentencesSource:
        """The committed run in ``output_uri`` (an Iceberg warehouse: the run ``run_id``,
        else its latest; ``cfg``'s ``[output]`` names its catalog); InputError (exit 2)
        when there is none."""
        cfg = cfg or Config()
        storage = storage or cfg.storage
        fs, root = resolve_uri(output_uri, storage, "input")
        check_bucket(fs, root, "input")
        root = root.rstrip("/") or "/"
        try:
            fmt = formats.detect(fs, root) or formats.DEFAULT
            tables = fmt.run_tables(fs, root, cfg, run_id)
            manifest = tables.manifest()
        except OSError as e:
            if is_local(fs):
                raise InputError(f"output {output_uri} cannot be read: {e}") from e
            raise s3_error(e, display_uri(fs, root)) from e
        if manifest is None:
            raise InputError(
                f"{tables.uri} holds no committed run ({MANIFEST} is missing): "
                "search reads only a committed output; finish (or resume) the run first"
            )
        return cls(fs, root, manifest, storage, tables, tables.home)

    @classmethod
    def of(cls, tables: RunTables, storage: StorageConfig) -> SentencesSource:
        """The committed run ``tables`` (the audit's night, as it reads it)."""
        manifest = tables.manifest()
        if manifest is None:
            raise InputError(f"{tables.manifest_uri} is missing: {tables.uri} is not committed")
        return cls(tables.fs, tables.root, manifest, storage, tables, tables.home)

    def batches(
        self, columns: list[str], batch_rows: int = READ_BATCH_ROWS
    ) -> Iterator[pa.RecordBatch]:
        """The sentences table's ``columns``, as record batches of at most ``batch_rows``."""
        return self.tables.batches(SENTENCES, columns, rows=batch_rows)

    def embedding_dim(self) -> int | None:
        """The embedding column's size (0: the table has no rows, so no file); None for an
        output written without embeddings."""
        if (self.manifest.get("plan") or {}).get("embeddings") is False:
            return None
        for part in self.tables.parts(SENTENCES):
            with part.opener() as f:
                schema = pq.ParquetFile(f).schema_arrow
            if EMBEDDING not in schema.names:
                return None
            if pa.types.is_fixed_size_list(schema.field(EMBEDDING).type):
                return int(schema.field(EMBEDDING).type.list_size)
            break  # Iceberg's files hold lists: the first rows say their size
        for batch in self.batches([EMBEDDING], batch_rows=64):
            if batch.num_rows:
                return int(batch.schema.field(EMBEDDING).type.list_size)
        return 0

    def require_embeddings(self) -> int:
        """The embedding size; InputError naming the cause for an output without them."""
        dim = self.embedding_dim()
        if dim is None:
            raise InputError(
                f"{self.uri}/{SENTENCES} has no {EMBEDDING} column: the run was made with "
                "--no-embeddings ([run] embeddings = false), so there is nothing to search. "
                "Run it again with embeddings into another output folder"
            )
        return dim

    def key(self) -> str:
        """What the sentences table is now: the committed run (id, commit time) and its
        files (name, size, modification time). Any rewrite of the output changes it."""
        if formats.get(self.table_format).warehouse:  # a run's data files are never rewritten
            return self._digest(sorted(p.key for p in self.tables.parts(SENTENCES)))
        sel = pafs.FileSelector(f"{self.root}/{SENTENCES}", allow_not_found=True)
        try:
            infos = self.fs.get_file_info(sel)
        except OSError as e:
            raise s3_error(e, self.uri) from e
        files = sorted(
            (i.base_name, i.size, i.mtime_ns) for i in infos if i.type == pafs.FileType.File
        )
        return self._digest(files)

    def _digest(self, files: list[Any]) -> str:
        record = {
            "run_id": self.manifest.get("run_id"),
            "finished": self.manifest.get("finished"),
            "format": self.table_format,
            "files": files,
        }
        return hashlib.sha256(json.dumps(record, default=str).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Filters:
    """Which sentences may be hits: a label, a minimum score, a doc_id prefix, a doc id set,
    a watch-listed entity the sentence names (its ``entities`` column)."""

    label: str | None = None
    min_score: float | None = None
    doc_prefix: str | None = None
    doc_ids: frozenset[str] | None = None
    entity_id: str | None = None
    label_column: str = LABEL  # an extra head's (--label NAME.label): NAME_label

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns the filters read beyond the hit columns."""
        head = (self.label_column,) if self.label_column != LABEL else ()
        return head + ((ENTITIES,) if self.entity_id is not None else ())

    def mask(self, batch: pa.RecordBatch) -> pa.ChunkedArray | pa.Array | None:
        """The rows of ``batch`` that pass (None: every row)."""
        parts = []
        if self.label is not None:
            parts.append(pc.equal(batch[self.label_column], self.label))
        if self.min_score is not None:
            parts.append(pc.greater_equal(batch[SCORE], float(self.min_score)))
        if self.doc_prefix:
            parts.append(pc.starts_with(batch[DOC_ID], self.doc_prefix))
        if self.doc_ids is not None:
            parts.append(pc.is_in(batch[DOC_ID], pa.array(sorted(self.doc_ids), pa.string())))
        if self.entity_id is not None:
            parts.append(names_entity(batch[ENTITIES], self.entity_id))
        if not parts:
            return None
        out = parts[0]
        for p in parts[1:]:
            out = pc.and_(out, p)
        return out

    def sql(self) -> str | None:
        """The same filter as a SQL predicate (Lance's ``filter``); strings quoted."""
        parts = []
        if self.label is not None:
            parts.append(f"{self.label_column} = {_quote(self.label)}")
        if self.min_score is not None:
            parts.append(f"{SCORE} >= {float(self.min_score)!r}")
        if self.doc_prefix:
            parts.append(f"starts_with({DOC_ID}, {_quote(self.doc_prefix)})")
        if self.doc_ids is not None:
            ids = ", ".join(_quote(d) for d in sorted(self.doc_ids)) or "NULL"
            parts.append(f"{DOC_ID} IN ({ids})")
        return " AND ".join(parts) or None


def names_entity(entities: pa.Array | pa.ChunkedArray, entity_id: str) -> pa.Array:
    """For each row of an ``entities`` column, whether one of its matches is ``entity_id``."""
    if isinstance(entities, pa.ChunkedArray):
        entities = entities.combine_chunks()
    hits = pc.equal(pc.struct_field(pc.list_flatten(entities), "entity_id"), entity_id)
    parents = pc.list_parent_indices(entities).to_numpy(zero_copy_only=False)
    named = np.zeros(len(entities), bool)
    named[parents[hits.to_numpy(zero_copy_only=False)]] = True
    return pa.array(named)


def _quote(s: str) -> str:
    """A SQL string literal: single quotes doubled."""
    return "'" + s.replace("'", "''") + "'"


def embedding_matrix(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A fixed-size list<float32> column as float32 [n, dim] (zero-copy where possible)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    dim = column.type.list_size
    flat = column.flatten()  # honours the array's offset (a sliced or filtered batch)
    return flat.to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(-1, dim)


def unit_rows(m: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm (a zero row stays zero)."""
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.maximum(norms, 1e-12)


def cosine(embeddings: np.ndarray, queries_unit: np.ndarray) -> np.ndarray:
    """Cosine similarity [n, q] of ``embeddings`` [n, dim] with unit query vectors."""
    return unit_rows(embeddings) @ queries_unit.T


def to_hits(
    rows: pa.Table, sims: np.ndarray, bm25: np.ndarray | None = None
) -> list[dict[str, Any]]:
    """Hits (keys HIT_KEYS), best first by ``bm25`` when given (a keyword ranking: ties by
    similarity), else by similarity; then by doc_id and sent_index."""
    docs = rows[DOC_ID].to_pylist()
    sents = rows[SENT_INDEX].to_pylist()
    if bm25 is None:
        order = sorted(range(len(docs)), key=lambda i: (-float(sims[i]), docs[i], sents[i]))
    else:  # equal keyword scores: the nearer sentence first
        order = sorted(
            range(len(docs)),
            key=lambda i: (-float(bm25[i]), -float(sims[i]), docs[i], sents[i]),
        )
    cols = {c: rows[c].to_pylist() for c in HIT_COLUMNS}
    return [
        {
            **{c: cols[c][i] for c in HIT_COLUMNS},
            SIMILARITY: float(sims[i]),
            BM25: None if bm25 is None else float(bm25[i]),
        }
        for i in order
    ]
