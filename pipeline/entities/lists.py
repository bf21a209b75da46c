"""Watch lists in: a CSV or Parquet file of ``entity_id``, ``name``, optional ``aliases``
('|'-separated) and optional ``type``. The list's name is the file's stem.

A list is refused (``ConfigError``, exit code 2) naming the file and the line (CSV: 1-based,
the header is line 1) or the row index (Parquet: 0-based) of the first problem: a missing
column, an empty name (or one with no letter or digit), one id under two different names, a
name over ``MAX_NAME_WORDS`` words, an unreadable file.

**Bounds.** A list may hold at most ``MAX_LIST_NAMES`` (5,000,000) names and aliases
together; past that it is refused at the row that crosses the bound. A compiled list costs
each replica about 200 MB per 10^6 names (bench/entities.py), so 5 x 10^6 names ~1 GB.
The same id on several rows is one entity: its aliases are merged, its name must be the
same on every row.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from docintel.pipeline.entities.normalise import WORD
from docintel.pipeline.errors import ConfigError

MAX_LIST_NAMES = 5_000_000  # names + aliases in one list; past it the list is refused
MAX_NAME_WORDS = 16  # words in one name or alias; a longer one is refused (not a name)
REQUIRED = ("entity_id", "name")
ALIAS_SEP = "|"

Record = tuple[str, dict[str, str]]  # (where: "line 7" / "row index 5", column -> value)


@dataclass
class WatchList:
    """One list, one entry per entity id (rows of the same id merged), in file order."""

    name: str
    path: str
    ids: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    aliases: list[tuple[str, ...]] = field(default_factory=list)
    types: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


def load_list(path: str | Path) -> WatchList:
    """Read and check one list file (CSV, or Parquet by its ``.parquet``/``.pq`` suffix)."""
    path = Path(path)
    parquet = path.suffix.lower() in {".parquet", ".pq"}
    try:
        records = _parquet_records(path) if parquet else _csv_records(path)
        return _build(WatchList(path.stem, str(path)), records)
    except ConfigError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error, pa.ArrowException) as e:
        raise ConfigError(f"watch list {path}: unreadable file: {e}") from e


def _csv_records(path: Path) -> Iterator[Record]:
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        _check_columns(path, header, "line 1 (the header)")
        line = reader.line_num + 1
        for row in reader:
            if any(cell.strip() for cell in row):
                yield f"line {line}", dict(zip(header, row, strict=False))
            line = reader.line_num + 1


def _parquet_records(path: Path) -> Iterator[Record]:
    table = pq.read_table(path)
    _check_columns(path, table.column_names, "the schema")
    wanted = [c for c in (*REQUIRED, "aliases", "type") if c in table.column_names]
    columns = {c: _strings(table.column(c)) for c in wanted}
    for i in range(table.num_rows):
        yield f"row index {i}", {c: columns[c][i] or "" for c in wanted}


def _strings(column: pa.ChunkedArray) -> list[str | None]:
    """A column as strings; a list column (aliases as list<string>) joined by '|'."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return [None if v is None else ALIAS_SEP.join(map(str, v)) for v in column.to_pylist()]
    return column.cast(pa.string()).to_pylist()


def _check_columns(path: Path, columns: list[str], where: str) -> None:
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise ConfigError(
            f"watch list {path}, {where}: missing column(s) {', '.join(missing)} "
            f"(a list has entity_id and name, optional aliases and type; found: "
            f"{', '.join(columns) or 'nothing'})"
        )


def _build(out: WatchList, records: Iterator[Record]) -> WatchList:
    """Check every record and merge rows of one id; raise on the first bad one."""
    first: dict[str, tuple[int, str]] = {}  # id -> (index in out, where first seen)
    count = 0
    for where, row in records:
        entity_id = (row.get("entity_id") or "").strip()
        name = " ".join((row.get("name") or "").split())
        aliases = _aliases(row.get("aliases") or "")
        for text in (name, *aliases):
            _check_name(out.path, where, entity_id, text)
        if entity_id in first:
            index, seen = first[entity_id]
            if out.names[index] != name:
                raise ConfigError(
                    f"watch list {out.path}, {where}: id {entity_id!r} is named {name!r}, "
                    f"but {out.names[index]!r} at {seen}: one id, one name (put other "
                    "spellings in aliases)"
                )
            new = tuple(a for a in aliases if a not in out.aliases[index])
            out.aliases[index] += new
            count += len(new)
        else:
            count += 1 + len(aliases)
            first[entity_id] = (len(out.ids), where)
            out.ids.append(entity_id)
            out.names.append(name)
            out.aliases.append(aliases)
            out.types.append((row.get("type") or "").strip())
        if count > MAX_LIST_NAMES:
            raise ConfigError(
                f"watch list {out.path}, {where}: more than {MAX_LIST_NAMES:,} names and "
                "aliases in one list; split it into several lists"
            )
    return out


def _aliases(cell: str) -> tuple[str, ...]:
    parts = (" ".join(a.split()) for a in cell.split(ALIAS_SEP))
    return tuple(dict.fromkeys(a for a in parts if a))


def _check_name(path: str, where: str, entity_id: str, text: str) -> None:
    if not entity_id:
        raise ConfigError(f"watch list {path}, {where}: empty entity_id")
    if not text:
        raise ConfigError(f"watch list {path}, {where}: empty name for id {entity_id!r}")
    words = sum(1 for _ in WORD.finditer(text))
    if words == 0:
        raise ConfigError(
            f"watch list {path}, {where}: name {text!r} of id {entity_id!r} has no letter or digit"
        )
    if words > MAX_NAME_WORDS:
        raise ConfigError(
            f"watch list {path}, {where}: name {text[:60]!r}... of id {entity_id!r} has "
            f"{words} words, more than {MAX_NAME_WORDS}"
        )
