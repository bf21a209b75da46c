"""One committed run's tables as Arrow, whatever its output format: the audit's report
(aggregate.py, review.py), its changes and its ``latest/`` view read a night through this,
and `docintel search` / `docintel index` read a run's sentences through it
(pipeline/search/source.py).

Each table format (pipeline/formats/) implements :class:`RunTables` next to its sink:
Parquet parts read a run folder's parts; a warehouse format (Iceberg, Delta Lake) reads
the data files that the run's own commits added (found by the run id in their commit
metadata), as the Parquet files they are, and the run's manifest under
``OUTPUT/_runs/<run id>/``. Exact, because a docintel run appends each batch exactly once
and deletes nothing; the tables have no run-id column, so this beats a filtered scan.

Every reader reads one file at a time, record batch by record batch, only the columns asked for:
memory does not grow with the run. Strings and lists come as docintel writes them
(``string``, ``list``), without Iceberg's field ids.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from docintel.pipeline.errors import InputError
from docintel.pipeline.schema import DOC_ID, EMBEDDING

READ_BATCH_ROWS = 16_384  # rows per record batch: bounds memory on huge files


@dataclass(frozen=True)
class Part:
    """One data file of a run's table."""

    key: str  # its name within the table, unique per run (latest/ names its copies by it)
    uri: str  # for messages
    opener: Callable[[], Any]  # a seekable pyarrow file, used as a context manager


class RunTables(ABC):
    """A committed run's documents, sentences and errors, and its manifest."""

    uri: str  # the run, for messages
    manifest_uri: str
    fs: pafs.FileSystem
    root: str  # the output: the run folder, or the Iceberg warehouse
    home: str  # the run's own files (manifest, search index): root, or _runs/<run id>

    @abstractmethod
    def manifest(self) -> dict[str, Any] | None:
        """The run's ``_manifest.json``; None while the run is not committed."""

    @abstractmethod
    def parts(self, table: str) -> list[Part]:
        """The files that hold the run's rows of ``table``."""

    def batches(
        self,
        table: str,
        columns: list[str],
        ids: list[str] | None = None,
        rows: int = READ_BATCH_ROWS,
    ) -> Iterator[pa.RecordBatch]:
        """Record batches (of at most ``rows`` rows) of ``columns`` of the run's ``table``;
        only the rows of the documents ``ids`` when given."""
        keep = None if ids is None else pa.array(ids, pa.string())
        for part in self.parts(table):
            try:
                f = part.opener()
            except FileNotFoundError as e:
                raise InputError(
                    f"{part.uri}, a {table} file of the run {self.uri}, is missing; restore "
                    "it (an Iceberg snapshot expired too early?) or redo the run"
                ) from e
            with f:
                pf = pq.ParquetFile(f)
                absent = [c for c in columns if c not in pf.schema_arrow.names]
                if absent:
                    raise InputError(
                        f"{part.uri} has no column(s) {absent}: it is not a docintel {table} "
                        f"file (see pipeline/schema.py); remove it from the run {self.uri}"
                    )
                for b in pf.iter_batches(batch_size=rows, columns=columns):
                    got = b if keep is None else b.filter(pc.is_in(b[DOC_ID], value_set=keep))
                    yield plain(got)

    def read(self, table: str, columns: list[str], ids: list[str]) -> pa.Table | None:
        """The rows of the documents ``ids`` (a filtered read); None when there are none."""
        if not ids:
            return None
        found = [b for b in self.batches(table, columns, ids) if b.num_rows]
        return pa.Table.from_batches(found) if found else None


def plain(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` without field metadata (Iceberg's field ids) and large types, and its
    embeddings as the fixed-size lists of the output contract (Iceberg has no fixed-size
    list type: its files hold them as lists, every one of the same length)."""
    fields = [pa.field(f.name, _plain_type(f.type), f.nullable) for f in batch.schema]
    at = batch.schema.get_field_index(EMBEDDING)
    if at >= 0 and not pa.types.is_fixed_size_list(batch.schema.field(at).type):
        lengths = pc.unique(pc.list_value_length(batch.column(at)).drop_null()).to_pylist()
        if len(lengths) == 1:
            f = batch.schema.field(at)
            fields[at] = pa.field(f.name, pa.list_(pa.float32(), lengths[0]), f.nullable)
    schema = pa.schema(fields)
    return batch if schema.equals(batch.schema, check_metadata=True) else batch.cast(schema)


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(_plain_type(t.value_type))
    return t
