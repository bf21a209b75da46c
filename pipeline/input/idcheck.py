"""Duplicate document ids across a whole input, in memory that does not grow with it.

A Python set of every id costs ~200 bytes per id (20 GiB for 100 M documents). Instead:

1. Each file's id column is read in record batches; every id gets a 64-bit polynomial
   hash, computed vectorised with numpy over the Arrow string buffer (a few ns per byte).
2. The hashes are partitioned by their low bits into ``buckets`` spill files on local
   disk (8 bytes per id; for 100 M ids, 800 MB of temporary disk).
3. Each bucket is loaded alone (8 bytes x ids / buckets) and ``np.unique`` finds hashes
   seen more than once: candidate duplicates.
4. Only if there are candidates, the id columns are read again and the ids whose hash is
   a candidate are compared exactly (a hash collision is never reported as a duplicate).

Peak memory: one record batch of ids, the hashing scratch of at most HASH_BYTES of them,
and one bucket of hashes, ``8 x N / buckets`` bytes. All three are sized in bytes, not
rows, so long ids cannot blow them up: a read holds at most READ_BYTES of ids
(``rows_per_read``: the rows that fit when every id is at the length limit), hashing
takes ~40 bytes of numpy scratch per id byte and so goes HASH_BYTES at a time, and the
bucket count grows with the input (one bucket per BUCKET_IDS ids), so a bucket stays
around 16 MB whatever N is. (Reads of a fixed 65,536 rows peaked at 2.5 GiB with 1 KiB
ids.) Time is linear in the id bytes, plus a second read of the id columns when
candidates exist.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

READ_BYTES = 16 * 1024 * 1024  # id bytes per record batch read from a file, at most
READ_ROWS = 65_536  # ids per record batch at most, however short the ids
HASH_BYTES = 1024 * 1024  # id bytes hashed at once: ~40 MiB of numpy scratch
BUCKET_IDS = 2_000_000  # ids per spill bucket on average: 16 MB of hashes in memory
MAX_BUCKETS = 4096  # open spill files at most (file descriptors)
_BASE = np.uint64(0x100000001B3)  # FNV prime: odd, spreads bytes over all 64 bits
_SEED = np.uint64(0xCBF29CE484222325)


def rows_per_read(max_id_bytes: int) -> int:
    """Ids per record batch when reading id columns: as many as fit in READ_BYTES when
    every id is ``max_id_bytes`` long (the configured limit, checked batch by batch), at
    most READ_ROWS."""
    return max(1, min(READ_ROWS, READ_BYTES // max(1, max_id_bytes)))


def hash_ids(ids: pa.Array) -> np.ndarray:
    """A 64-bit polynomial hash per string: sum(byte_k * BASE**(len-1-k)) + SEED*BASE**len,
    vectorised over the Arrow buffer (wrap-around uint64 arithmetic), HASH_BYTES of ids
    at a time (at least one id)."""
    arr = pc.cast(ids, pa.large_string()) if ids.type != pa.large_string() else ids
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint64)
    offsets = np.frombuffer(arr.buffers()[1], np.int64, n + 1, arr.offset * 8)
    if offsets[-1] - offsets[0] <= HASH_BYTES:
        return _hash_slice(arr, offsets)
    out = np.empty(n, np.uint64)
    a = 0
    while a < n:  # the longest run of ids from ``a`` within HASH_BYTES, at least one
        b = max(a + 1, int(np.searchsorted(offsets, offsets[a] + HASH_BYTES, "right")) - 1)
        out[a:b] = _hash_slice(arr.slice(a, b - a), offsets[a : b + 1])
        a = b
    return out


def _hash_slice(arr: pa.Array, offsets: np.ndarray) -> np.ndarray:
    """``hash_ids`` of a large_string array whose offsets (n + 1 of them) are given."""
    n = len(arr)
    start, end = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(arr.buffers()[2], np.uint8, end - start, start).astype(np.uint64)
    lengths = np.diff(offsets)
    # exponent of each byte: its distance to the end of its string
    ends = np.repeat(offsets[1:] - start, lengths)
    exponents = ends - 1 - np.arange(end - start, dtype=np.int64)
    powers = _powers(int(lengths.max(initial=0)) + 1)
    with np.errstate(over="ignore"):
        weighted = data * powers[exponents]
        sums = np.zeros(n, np.uint64)
        nonempty = lengths > 0
        sums[nonempty] = np.add.reduceat(weighted, (offsets[:-1] - start)[nonempty])
        return sums + _SEED * powers[lengths]


_POWERS = np.ones(1, np.uint64)


def _powers(k: int) -> np.ndarray:
    """BASE**0 .. BASE**(k-1) (mod 2**64), grown once to the longest id seen."""
    global _POWERS  # noqa: PLW0603 - a cache of a pure function's table
    if len(_POWERS) < k:
        out = np.ones(k, np.uint64)
        with np.errstate(over="ignore"):
            for i in range(1, k):
                out[i] = out[i - 1] * _BASE
        _POWERS = out
    return _POWERS


ReadIds = Callable[[], Iterator[tuple[str, pa.Array]]]  # (source name, string ids) batches


def find_duplicates(read_ids: ReadIds, total: int, limit: int) -> tuple[int, list]:
    """How many ids occur more than once, and up to ``limit`` of them as (id, count,
    first source), checked exactly. ``read_ids`` is called once, or twice when there are
    candidates. The count is of distinct 64-bit hashes seen twice: exact unless two
    different ids collide (odds ~N**2 / 2**65; a collision alone is never reported)."""
    buckets = min(MAX_BUCKETS, max(1, -(-total // BUCKET_IDS)))
    candidates = _candidates(read_ids, buckets)
    if not candidates.size:
        return 0, []
    shown: list[tuple[str, int, str]] = []
    for a in range(0, len(candidates), 4 * limit):  # a few at a time: memory stays small
        shown += _verify(read_ids, candidates[a : a + 4 * limit])
        if len(shown) >= limit:
            break
    return (len(candidates) if shown else 0), shown[:limit]


def _verify(read_ids: ReadIds, candidates: np.ndarray) -> list[tuple[str, int, str]]:
    counts: Counter[str] = Counter()
    first: dict[str, str] = {}
    for source, ids in read_ids():
        hit = np.isin(hash_ids(ids), candidates)
        for doc in ids.filter(pa.array(hit)).to_pylist():
            counts[doc] += 1
            first.setdefault(doc, source)
    return [(doc, n, first[doc]) for doc, n in counts.items() if n > 1]


def _candidates(read_ids: ReadIds, buckets: int) -> np.ndarray:
    """Hashes that occur more than once, bucket by bucket from spill files."""
    with tempfile.TemporaryDirectory(prefix="docintel-ids-") as tmp:
        paths = [Path(tmp) / f"b{b:04d}.u64" for b in range(buckets)]
        files = [p.open("wb") for p in paths]
        try:
            for _, ids in read_ids():
                h = hash_ids(ids)
                which = (h % np.uint64(buckets)).astype(np.int64)
                order = np.argsort(which, kind="stable")
                cuts = np.searchsorted(which[order], np.arange(buckets + 1))
                for b in np.flatnonzero(np.diff(cuts)):
                    files[b].write(h[order[cuts[b] : cuts[b + 1]]].tobytes())
        finally:
            for f in files:
                f.close()
        found = []
        for p in paths:
            h = np.fromfile(p, np.uint64)
            values, counts = np.unique(h, return_counts=True)
            found.append(values[counts > 1])
            p.unlink()
    return np.concatenate(found) if found else np.zeros(0, np.uint64)
