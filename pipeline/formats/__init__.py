"""Table formats, one module each, and the registry that names them.

A format is one module of this package: its sink, its reader, its marker files and its
detection (:class:`~docintel.pipeline.formats.base.TableFormat`). Adding one (Delta Lake
was the proof) is its module plus one line in :data:`FORMATS`. The run, the audit and
search ask :func:`get` (the configured ``[output] format``) and :func:`detect` (what an
existing output holds); nothing else spells a format's name.
"""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs

from docintel.pipeline.errors import ConfigError
from docintel.pipeline.formats.base import TableFormat
from docintel.pipeline.formats.delta import DELTA
from docintel.pipeline.formats.iceberg import ICEBERG
from docintel.pipeline.formats.parquet import PARQUET

# In detection order: the most specific markers first (a Delta output has documents/
# folders as Parquet output has, with a _delta_log/ inside).
FORMATS: tuple[TableFormat, ...] = (DELTA, ICEBERG, PARQUET)
DEFAULT = PARQUET

__all__ = ["DEFAULT", "FORMATS", "TableFormat", "detect", "get", "names", "of_manifest"]


def names() -> list[str]:
    """The formats' names, as ``[output] format`` and ``--format`` accept them."""
    return [f.name for f in FORMATS]


def get(name: str) -> TableFormat:
    """The format called ``name``; ConfigError (exit 2) naming the known ones."""
    for f in FORMATS:
        if f.name == name:
            return f
    raise ConfigError(
        f"[output] format {name!r} is not a table format docintel writes; choose one of "
        f"{', '.join(names())}"
    )


def of_manifest(manifest: dict[str, Any]) -> TableFormat:
    """The format that wrote a run, from its manifest (a warehouse format's manifest names
    it; Parquet output's, from before formats had names, does not)."""
    return get(str(manifest.get("format") or DEFAULT.name))


def detect(fs: pafs.FileSystem, root: str) -> TableFormat | None:
    """The format whose output ``root`` holds (one listing of it), or None (empty, new)."""
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        return None
    found = {i.base_name for i in fs.get_file_info(pafs.FileSelector(root))}
    return next((f for f in FORMATS if found and f.holds(fs, root, found)), None)
