"""The duplicate-id check's memory is sized in bytes, not rows (issue 20, item 14).

It read 65,536 ids at a time whatever their length and hashed a whole read at once
(~40 bytes of numpy scratch per id byte): with 1 KiB ids that peaked at 2.5 GiB.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from docintel.pipeline.config import DEFAULT_MAX_ID_BYTES, StorageConfig
from docintel.pipeline.input import idcheck
from docintel.pipeline.input.idcheck import READ_BYTES, READ_ROWS, rows_per_read
from docintel.pipeline.input.source import check_ids, resolve_input
from docintel.pipeline.schema import DOC_ID, TEXT

MiB = 1024 * 1024
# numpy memory (tracemalloc sees it) while checking 20,000 ids of 1 KiB: one hashing
# chunk (~40 x HASH_BYTES) and the hashes, with room to spare. Reads of a fixed 65,536
# rows hashed at once needed ~640 MiB here (20 MiB of ids x ~32).
PEAK_BOUND = 96 * MiB


def test_rows_per_read_keep_a_read_under_the_byte_budget() -> None:
    assert rows_per_read(DEFAULT_MAX_ID_BYTES) * DEFAULT_MAX_ID_BYTES <= READ_BYTES == 16 * MiB
    for limit in (1, 36, 100, 1024, 4096, 65_536, 10 * MiB):
        rows = rows_per_read(limit)
        assert 1 <= rows <= READ_ROWS
        assert rows * limit <= READ_BYTES, limit  # the read buffer, every id at the limit
    assert rows_per_read(36) == READ_ROWS  # short ids (UUIDs): as many rows as before
    assert rows_per_read(64 * MiB) == 1  # a limit over the budget: one id at a time


def test_checking_long_ids_stays_within_a_bounded_peak(tmp_path: Path) -> None:
    n, width = 20_000, 1024  # 20 MiB of ids, every one at the default limit
    ids = [f"{i:08d}".ljust(width, "x") for i in range(n)]
    path = tmp_path / "in" / "docs.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({DOC_ID: ids, TEXT: [""] * n}), path, row_group_size=n)
    fs, files = resolve_input(str(path), StorageConfig())
    del ids
    tracemalloc.start()
    try:
        assert check_ids(fs, files, DOC_ID, DEFAULT_MAX_ID_BYTES) == n
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BOUND, f"{peak / MiB:.0f} MiB peak checking {n} ids of {width} bytes"


def test_hashing_in_chunks_gives_the_same_hashes(monkeypatch) -> None:
    ids = pa.array([f"id-{i}-" + "y" * (i % 50) for i in range(3000)]).slice(7, 2500)
    whole = idcheck.hash_ids(ids)
    monkeypatch.setattr(idcheck, "HASH_BYTES", 100)  # many chunks, some of one id
    assert (idcheck.hash_ids(ids) == whole).all()
    monkeypatch.setattr(idcheck, "HASH_BYTES", 1)  # every id longer than a chunk
    assert (idcheck.hash_ids(ids) == whole).all()
