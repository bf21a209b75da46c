"""Iceberg output (``--format iceberg``): OUTPUT is a warehouse of three Apache Iceberg
tables, ``<namespace>.documents``, ``.sentences`` and ``.errors``, that every run appends
to, exactly once per batch (the protocol: pipeline/formats/warehouse.py).

Where things live (a local OUTPUT, no catalog configured)::

    OUTPUT/_catalog.db                      the embedded pyiceberg SQL catalog (SQLite)
    OUTPUT/<namespace>/<table>/{data,metadata}/   the tables (the warehouse is OUTPUT)
    OUTPUT/_runs/<run id>/...               the run's state, staged batches, manifest

With ``[output] catalog_uri`` (a REST catalog, or any pyiceberg catalog type) the tables
live where that catalog puts them; the run's own files stay under OUTPUT/_runs/. An
s3:// OUTPUT needs a configured catalog (SQLite cannot live on S3).

A commit is a snapshot; its summary holds the run id and the batch ids it adds. A run's
rows are read back from the data files its snapshots added (the manifests those snapshots
wrote, never the whole table's).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs

from docintel.pipeline.config import Config, code_properties
from docintel.pipeline.errors import OutputError, UsageError
from docintel.pipeline.formats.base import RUNS, TableFormat
from docintel.pipeline.formats.warehouse import (
    Commit,
    Opener,
    WarehouseRun,
    WarehouseSink,
    latest_run,
    redact,
)
from docintel.pipeline.output.sink import TABLES
from docintel.pipeline.output.tables import RunTables
from docintel.pipeline.storage import is_local

EMPTY: dict[str, str] = {}

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

CATALOG_NAME = "docintel"  # also the PYICEBERG_CATALOG__DOCINTEL__* variables' name
CATALOG_DB = "_catalog.db"  # the embedded catalog's SQLite file
# Parquet dictionaries of at most 64 KiB a column: labels, backends and model names fit; an
# embedding column overflows at once and falls back to plain encoding instead of wasting
# pyiceberg's default 2 MiB first (-25% on a sentences file with embeddings, 4.98 -> 3.76 MB
# for the demo corpus; docintel's Parquet parts skip dictionaries for floats altogether).
TABLE_PROPERTIES = {"write.parquet.dict-size-bytes": str(64 * 1024)}
# The embedded catalog's FileIO, named explicitly (pyarrow's, the one docintel reads with).
FILE_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"


def _refuse_code(props: dict[str, str], whose: str) -> None:
    found = code_properties(props)
    if found:
        raise UsageError(
            f"{whose} sets {found[0]!r}, a property naming Python code that pyiceberg would "
            "import: docintel refuses it (a warehouse's data must not choose code that runs "
            "here). Nothing was done: remove the property from the table or catalog, or "
            "read the warehouse with a tool you trust with it"
        )


def _guard(cat: Catalog, where: str, own: dict[str, str]) -> Catalog:
    """``cat`` refusing (UsageError) properties that name code, its own (a catalog server
    may add some) and every table's, before pyiceberg loads a FileIO from them."""
    _refuse_code({k: v for k, v in cat.properties.items() if own.get(k) != v}, where)
    load_file_io = cat._load_file_io

    def guarded(properties: dict[str, str] = EMPTY, location: str | None = None) -> Any:
        _refuse_code(dict(properties), f"a table of {where}{f' ({location})' if location else ''}")
        return load_file_io(properties, location)

    cat._load_file_io = guarded  # type: ignore[method-assign]
    return cat


def _schema_difference(table: Any, want: pa.Schema) -> str | None:
    """The first column where an existing Iceberg table cannot take rows of ``want``."""
    from pyiceberg.catalog import Catalog

    have = table.schema()
    wanted = Catalog._convert_schema_if_needed(want)
    names = set()
    for f in wanted.fields:
        names.add(f.name)
        try:
            got = have.find_field(f.name)
        except ValueError:
            if not f.required:  # added to the table before the first append (_evolved)
                continue
            return f"column {f.name!r} is missing (docintel writes {f.field_type})"
        if str(got.field_type) != str(f.field_type):
            return f"column {f.name!r} is {got.field_type}, docintel writes {f.field_type}"
        if got.required and not f.required:
            return f"column {f.name!r} is required, docintel writes it with nulls"
    for f in have.fields:
        if f.name not in names and f.required:
            return f"column {f.name!r} is required, docintel does not write it"
    return None


class IcebergSink(WarehouseSink):
    """Batches staged by write tasks, committed to Iceberg tables by the driver in groups."""

    format_name = "iceberg"

    def ident(self, table: str) -> tuple[str, str]:
        return (self.output.namespace, table)

    def table_name(self, table: str) -> str:
        return f"Iceberg table {'.'.join(self.ident(table))}"

    @property
    def where(self) -> str:
        if self.output.catalog_uri:
            return f"{self.output.catalog_type or 'rest'} catalog {self.output.catalog_uri}"
        return f"SQL catalog {self.uri}/{CATALOG_DB}"

    catalog_name = where  # the name messages and tests have used

    # --- the catalog -----------------------------------------------------------------

    def _properties(self) -> dict[str, str]:
        out = self.output
        if not out.catalog_uri:
            from sqlalchemy.engine import URL

            # from parts, and the warehouse a plain path: an OUTPUT path holding "?", "#"
            # or "%" keeps the catalog and the tables inside it (not a URL's query part)
            db = URL.create("sqlite", database=f"{self.root}/{CATALOG_DB}")  # root: absolute
            uri = db.render_as_string(hide_password=False)
            return {"uri": uri, "warehouse": self.root, "py-io-impl": FILE_IO}
        props = {"type": out.catalog_type or "rest", "uri": out.catalog_uri}
        if props["type"] == "sql":
            props["warehouse"] = self.uri
        if self.storage.s3_endpoint:
            props["s3.endpoint"] = self.storage.s3_endpoint
        if self.storage.s3_region:
            props["s3.region"] = self.storage.s3_region
        return {**props, **out.catalog_properties}

    def catalog(self, create: bool) -> Catalog | None:
        """The run's catalog (one per driver process); None for an embedded catalog that
        does not exist yet when ``create`` is false (nothing to check, nothing written)."""
        if self.d.client is not None:
            return self.d.client
        embedded = not self.output.catalog_uri
        db = f"{self.root}/{CATALOG_DB}"
        if embedded and not create and self.fs.get_file_info(db).type != pafs.FileType.File:
            return None
        if embedded:
            self.fs.create_dir(self.root, recursive=True)  # an OS error: output.py's message
        try:
            if embedded:
                from pyiceberg.catalog.sql import SqlCatalog

                cat: Catalog = SqlCatalog(CATALOG_NAME, **self._properties())
            else:
                from pyiceberg.catalog import load_catalog

                cat = load_catalog(CATALOG_NAME, **self._properties())
            _guard(cat, f"Iceberg {self.where}", self._properties())
            cat.list_namespaces()  # reached, and answering
        except UsageError:
            raise
        except Exception as e:  # a refused connection is an OSError too: name the catalog
            raise OutputError(
                f"Iceberg {self.where} cannot be used: {type(e).__name__}: "
                f"{redact(str(e))}. Nothing was done: check [output] catalog_uri / "
                "catalog_type and that the catalog is running"
            ) from e
        self.d.client = cat
        return cat

    def _load(self, table: str) -> Table | None:
        from pyiceberg.exceptions import NoSuchTableError

        cat = self.catalog(create=True)
        assert cat is not None
        try:
            return cat.load_table(self.ident(table))
        except NoSuchTableError:
            return None
        except UsageError:  # a property naming code (_guard)
            raise
        except Exception as e:  # a damaged catalog or table: a message, not a traceback
            raise OutputError(
                f"{self.table_name(table)} in {self.where} cannot be read: "
                f"{type(e).__name__}: {redact(str(e))}"
            ) from e

    # --- the warehouse hooks -----------------------------------------------------------

    def _check_location(self) -> None:
        if not is_local(self.fs) and not self.output.catalog_uri:
            raise UsageError(
                f"output {self.uri} with --format iceberg needs a catalog: the embedded SQLite "
                "catalog works on local outputs only. Set [output] catalog_uri (and "
                "catalog_type) to a REST or SQL catalog, or write to a local folder"
            )

    def _check_tables(self) -> None:
        """Refuse (exit 2) existing tables this run's rows do not fit, naming the column."""
        if self.catalog(create=False) is None:
            return
        for name, schema in self.expected_schemas().items():
            table = self._load(name)
            if table is None:
                continue
            diff = _schema_difference(table, schema)
            if diff is not None:
                raise UsageError(
                    f"{self.table_name(name)} in {self.where} does not fit this run: {diff}. "
                    "Nothing was done: write to another namespace ([output] namespace) or "
                    "output, or run with the settings that made it"
                )

    def _prepare(self) -> None:
        cat = self.catalog(create=True)
        assert cat is not None
        cat.create_namespace_if_not_exists(self.output.namespace)
        expected = self.expected_schemas()
        for name in ("documents", "errors"):  # sentences: with its first rows' schema
            self._ensure_table(name, expected[name])

    def _ensure_table(self, table: str, schema: pa.Schema) -> None:
        self._table(table, schema)

    def _table(self, name: str, schema: pa.Schema) -> Table:
        """The table as the catalog has it now (created on its first commit, with the
        schema of the rows: a sentences table gets its embedding and user columns)."""
        table = self._load(name)
        if table is not None:
            return self._evolved(name, table, schema)
        cat = self.catalog(create=True)
        assert cat is not None
        return cat.create_table_if_not_exists(
            self.ident(name), schema=schema, properties=TABLE_PROPERTIES
        )

    def _evolved(self, name: str, table: Table, schema: pa.Schema) -> Table:
        """``table`` with the columns of ``schema`` it lacks added (Iceberg schema
        evolution: its older rows read them as null), e.g. the columns of a head added to
        the run since the table was made; ``_check_tables`` has refused anything else. A
        concurrent run's schema commit wins the race: reload and add what is still
        missing, once."""
        from pyiceberg.exceptions import CommitFailedException

        for attempt in (1, 2):
            have = {f.name for f in table.schema().fields}
            new = [f for f in schema if f.name not in have and f.nullable]
            if not new:
                return table
            try:
                with table.update_schema() as update:
                    update.union_by_name(pa.schema(new))
            except CommitFailedException:
                if attempt == 2:
                    raise
            table = self._load(name) or table
        return table

    def _snapshots(self, table: Table | None) -> list[Any]:
        if table is None:
            return []
        return [
            s
            for s in table.metadata.snapshots
            if s.summary is not None and self.is_run_commit(s.summary.additional_properties)
        ]

    def _run_commits(self, table: str) -> list[Commit]:
        return [_commit(s) for s in self._snapshots(self._load(table))]

    def _append(self, table: str, data: pa.Table, props: dict[str, str]) -> None:
        self._table(table, data.schema).append(data, snapshot_properties=props)

    def _data_files(self, table: str, commits: list[Commit]) -> list[tuple[str, Opener]]:
        """The data files the run's snapshots added, from the manifests those snapshots
        wrote (never the whole table's)."""
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

        if self.catalog(create=False) is None or not commits:
            return []
        tbl = self._load(table)
        ids = {c.id for c in commits}
        out = []
        for snap in (s for s in self._snapshots(tbl) if s.snapshot_id in ids):
            for m in snap.manifests(tbl.io):
                if m.added_snapshot_id != snap.snapshot_id or m.content != ManifestContent.DATA:
                    continue
                for e in m.fetch_manifest_entry(tbl.io, discard_deleted=True):
                    if e.status == ManifestEntryStatus.ADDED and e.snapshot_id == snap.snapshot_id:
                        path = e.data_file.file_path
                        out.append((path, functools.partial(_open_data_file, tbl.io, path)))
        return out

    def run_data_files(self, table: str) -> list[tuple[str, Opener]]:
        if self.catalog(create=False) is None:  # no catalog yet: nothing committed
            return []
        return super().run_data_files(table)

    def _manifest_section(self) -> dict[str, Any]:
        return {
            "iceberg": {
                "catalog": self.where,
                "namespace": self.output.namespace,
                "tables": {
                    t: {
                        "identifier": ".".join(self.ident(t)),
                        "snapshot_ids": [c.id for c in self.d.commits[t]],
                    }
                    for t in TABLES
                },
            },
        }


def _open_data_file(io: Any, path: str) -> Any:
    """A data file of a table, opened through the table's FileIO (any warehouse)."""
    return io.new_input(path).open(seekable=True)


def _commit(snap: Any) -> Commit:
    props = snap.summary.additional_properties
    return Commit(
        id=snap.snapshot_id,
        props=dict(props),
        added_files=int(props.get("added-data-files", 0)),
        added_bytes=int(props.get("added-files-size", 0)),
    )


class IcebergRun(WarehouseRun):
    """The rows run ``run_id`` appended to the Iceberg tables of the warehouse ``root``
    (the catalog as ``cfg``'s ``[output]`` configures it)."""

    def __init__(self, fs: pafs.FileSystem, root: str, cfg: Config, run_id: str) -> None:
        super().__init__(IcebergSink(fs, root, cfg.with_overrides({"run.run_id": run_id}), ()))
        ns = cfg.output.namespace
        self.uri = f"{run_id} in the Iceberg tables {ns}.* of {self.sink.where}"


class IcebergFormat(TableFormat):
    """Apache Iceberg tables (pyiceberg), a warehouse every run appends to."""

    name = "iceberg"
    what = f"an Iceberg warehouse of docintel ({CATALOG_DB}, {RUNS}/)"
    warehouse = True
    sink_class = IcebergSink

    def holds(self, fs: pafs.FileSystem, root: str, names: set[str]) -> bool:  # noqa: ARG002
        return bool(names & {CATALOG_DB, RUNS})

    def run_tables(
        self, fs: pafs.FileSystem, root: str, cfg: Config, run_id: str | None
    ) -> RunTables:
        if not run_id:
            run_id = latest_run(IcebergSink(fs, root, cfg, ()), "an Iceberg warehouse")
        return IcebergRun(fs, root, cfg, run_id)


ICEBERG = IcebergFormat()
