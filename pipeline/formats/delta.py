"""Delta Lake output (``--format delta``): OUTPUT holds three Delta tables,
``OUTPUT/documents``, ``OUTPUT/sentences`` and ``OUTPUT/errors``, that every run appends
to, exactly once per batch (the protocol: pipeline/formats/warehouse.py), written with the
``deltalake`` package (delta-rs; no JVM, no Spark).

A commit is a table version; its ``commitInfo`` carries the run id and the batch ids it
adds as custom metadata, so a resume, a retried append and a reader all find the run's
commits in the table's history. A run's rows are read back from the data files its
versions added (their ``add`` actions in ``_delta_log/<version>.json``). Any Delta reader
(Spark, DuckDB's delta extension, Polars, ``deltalake`` itself) reads the tables.

The run's own files (state, staged batches, manifest) live under OUTPUT/_runs/<run id>/.
Local outputs only for now: delta-rs on S3 needs a commit lock or conditional writes that
this module does not configure yet (an s3:// OUTPUT is refused, exit 2).
"""

from __future__ import annotations

import functools
import json
import urllib.parse
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from docintel.pipeline.config import Config
from docintel.pipeline.errors import UsageError
from docintel.pipeline.formats.base import TableFormat
from docintel.pipeline.formats.warehouse import (
    Commit,
    Opener,
    WarehouseRun,
    WarehouseSink,
    latest_run,
)
from docintel.pipeline.output.sink import TABLES
from docintel.pipeline.output.tables import RunTables
from docintel.pipeline.storage import is_local

LOG = "_delta_log"


class DeltaSink(WarehouseSink):
    """Batches staged by write tasks, appended to Delta tables by the driver in groups."""

    format_name = "delta"

    @property
    def where(self) -> str:
        return f"Delta Lake tables of {self.uri}"

    def table_name(self, table: str) -> str:
        return f"Delta table {self.uri}/{table}"

    def path(self, table: str) -> str:
        return f"{self.root}/{table}"

    def _exists(self, table: str) -> bool:
        return self.fs.get_file_info(f"{self.path(table)}/{LOG}").type == pafs.FileType.Directory

    def _check_location(self) -> None:
        if not is_local(self.fs):
            raise UsageError(
                f"output {self.uri} with --format delta must be a local folder for now (Delta "
                "on S3 needs a commit lock docintel does not configure yet); write Delta to a "
                "local or mounted folder, or use --format iceberg with a catalog"
            )

    def _check_tables(self) -> None:
        """Refuse (exit 2) existing tables that lack a column this run writes without
        nulls; the nullable ones (a head added since, for example) are added by the first
        append (schema merge: older rows read them as null)."""
        from deltalake import DeltaTable

        for name, schema in self.expected_schemas().items():
            if not self._exists(name):
                continue
            have = set(DeltaTable(self.path(name)).schema().to_arrow().names)
            missing = [f.name for f in schema if f.name not in have and not f.nullable]
            if missing:
                raise UsageError(
                    f"{self.table_name(name)} does not fit this run: column {missing[0]!r} is "
                    "missing. Nothing was done: write to another output, or run with the "
                    "settings that made it"
                )

    def _prepare(self) -> None:
        expected = self.expected_schemas()
        for name in ("documents", "errors"):  # sentences: with its first rows' schema
            self._ensure_table(name, expected[name])

    def _ensure_table(self, table: str, schema: pa.Schema) -> None:
        from deltalake import DeltaTable

        if not self._exists(table):
            DeltaTable.create(self.path(table), schema=schema, mode="ignore")

    def _run_commits(self, table: str) -> list[Commit]:
        """This run's versions of ``table`` (its history, oldest first); each version's
        log file is read once per driver (versions never change)."""
        from deltalake import DeltaTable

        if not self._exists(table):
            return []
        seen: dict[tuple[str, int], Commit] = self.d.client if self.d.client is not None else {}
        self.d.client = seen
        out = []
        for entry in reversed(DeltaTable(self.path(table)).history()):
            props = {k: v for k, v in entry.items() if isinstance(v, str)}
            if not self.is_run_commit(props):
                continue
            key = (table, int(entry["version"]))
            if key not in seen:
                seen[key] = self._version(table, key[1], props)
            out.append(seen[key])
        return out

    def _version(self, table: str, version: int, props: dict[str, str]) -> Commit:
        files = self._added(table, version)
        return Commit(version, props, len(files), sum(size for _, size in files))

    def _added(self, table: str, version: int) -> list[tuple[str, int]]:
        """(path, size) of the data files version ``version`` of ``table`` added."""
        log = f"{self.path(table)}/{LOG}/{version:020d}.json"
        try:
            with self.fs.open_input_stream(log) as f:
                lines = f.read().decode().splitlines()
        except FileNotFoundError as e:
            raise FileNotFoundError(
                f"{log} (the Delta log of a docintel commit) is gone: its log expired "
                "(delta.logRetentionDuration) before this run was read"
            ) from e
        out = []
        for line in lines:
            add = json.loads(line).get("add") if line.strip() else None
            if add:
                out.append((f"{self.path(table)}/{urllib.parse.unquote(add['path'])}", add["size"]))
        return out

    def _append(self, table: str, data: pa.Table, props: dict[str, str]) -> None:
        from deltalake import CommitProperties, WriterProperties, write_deltalake
        from deltalake.exceptions import SchemaMismatchError

        try:
            write_deltalake(
                self.path(table),
                data,
                mode="append",
                schema_mode="merge",  # adds this run's new nullable columns (_check_tables)
                commit_properties=CommitProperties(custom_metadata=props),
                writer_properties=WriterProperties(compression="ZSTD"),
            )
        except SchemaMismatchError as e:
            raise ValueError(str(e)) from e

    def _data_files(self, table: str, commits: list[Commit]) -> list[tuple[str, Opener]]:
        return [
            (path, functools.partial(self.fs.open_input_file, path))
            for c in commits
            for path, _ in self._added(table, c.id)
        ]

    def _manifest_section(self) -> dict[str, Any]:
        return {
            "delta": {
                "tables": {
                    t: {"path": f"{self.uri}/{t}", "versions": [c.id for c in self.d.commits[t]]}
                    for t in TABLES
                },
            },
        }


class DeltaFormat(TableFormat):
    """Delta Lake tables (deltalake), at OUTPUT/<table>, every run appending."""

    name = "delta"
    what = "Delta Lake output of docintel (documents/_delta_log/)"
    warehouse = True
    sink_class = DeltaSink

    def holds(self, fs: pafs.FileSystem, root: str, names: set[str]) -> bool:
        return "documents" in names and (
            fs.get_file_info(f"{root}/documents/{LOG}").type == pafs.FileType.Directory
        )

    def run_tables(
        self, fs: pafs.FileSystem, root: str, cfg: Config, run_id: str | None
    ) -> RunTables:
        run_id = run_id or latest_run(DeltaSink(fs, root, cfg, ()), "a Delta Lake output")
        return WarehouseRun(DeltaSink(fs, root, cfg.with_overrides({"run.run_id": run_id}), ()))


DELTA = DeltaFormat()
