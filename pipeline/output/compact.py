"""Compaction of a Parquet-parts output, driven by a tool outside a run.

The protocol (which small parts are grouped, the merge order, the commit point, crash
recovery) and every file name live in :class:`docintel.pipeline.formats.parquet.ParquetPartsSink`:
a run compacts through ``RunSink.finish``. These ``(fs, root)`` functions run that same
code in this process, for tools that time or inspect it on a folder of parts
(bench/compaction.py), so the benchmark measures exactly what a run does.
"""

from __future__ import annotations

import pyarrow.fs as pafs

from docintel.pipeline.formats.parquet import Group, ParquetPartsSink


def plan_groups(fs: pafs.FileSystem, root: str, target_bytes: int) -> list[Group]:
    """Consecutive committed batches, small ones only, grouped up to ``target_bytes``."""
    return ParquetPartsSink(fs, root, part_target_bytes=target_bytes).plan_groups()


def merge_group(fs: pafs.FileSystem, root: str, group: Group) -> int:
    """Merge one group's parts (documents last), then delete its members' own parts; the
    number of parts deleted."""
    return ParquetPartsSink(fs, root).merge_group(group)
