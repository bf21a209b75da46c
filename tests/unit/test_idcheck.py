"""Duplicate ids in bounded memory: vectorised hashes, spill buckets, exact verification."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from docintel.pipeline.input import idcheck
from docintel.pipeline.input.idcheck import find_duplicates, hash_ids

M = 2**64


def _reference(s: str) -> int:
    """The documented polynomial, one string at a time, in plain Python."""
    data = s.encode()
    h = int(idcheck._SEED) * pow(int(idcheck._BASE), len(data), M)
    for k, b in enumerate(data):
        h += b * pow(int(idcheck._BASE), len(data) - 1 - k, M)
    return h % M


def test_vectorised_hash_matches_the_reference() -> None:
    ids = ["", "a", "doc-1", "d\u043ec-1", "日本語のID", "x" * 1000, "a", ""]  # Cyrillic o
    arr = pa.array(ids).slice(1)  # a sliced array: offsets do not start at 0
    got = hash_ids(arr)
    assert [int(v) for v in got] == [_reference(s) for s in ids[1:]]
    assert len(set(got.tolist())) == 6  # "a" and "" repeat; the rest differ


def _reader(files: dict[str, list[str]]):
    def read_ids():
        for name, ids in files.items():
            for a in range(0, len(ids), 1000):  # several batches per file
                yield name, pa.array(ids[a : a + 1000], pa.string())

    return read_ids


def test_duplicates_across_and_within_files_are_found_exactly(monkeypatch) -> None:
    monkeypatch.setattr(idcheck, "BUCKET_IDS", 1000)  # 30 buckets for these 30,000 ids
    files = {
        "a.parquet": [f"id-{i}" for i in range(20_000)],
        "b.parquet": [f"other-{i}" for i in range(9_998)] + ["id-17", "other-5"],
    }
    n, dups = find_duplicates(_reader(files), 30_000, limit=5)
    assert n == 2
    assert sorted(dups) == [("id-17", 2, "a.parquet"), ("other-5", 2, "b.parquet")]


def test_unique_ids_pass_and_collisions_alone_are_never_reported(monkeypatch) -> None:
    files = {"a.parquet": [f"u{i}" for i in range(50_000)]}
    assert find_duplicates(_reader(files), 50_000, 5) == (0, [])
    # every id colliding on one hash: all candidates, none a real duplicate
    monkeypatch.setattr(idcheck, "hash_ids", lambda ids: np.zeros(len(ids), np.uint64))
    assert find_duplicates(_reader({"a": ["p", "q", "r"]}), 3, 5) == (0, [])


@pytest.mark.parametrize("buckets_of", [10, 10_000_000])
def test_the_bucket_count_does_not_change_the_answer(monkeypatch, buckets_of: int) -> None:
    monkeypatch.setattr(idcheck, "BUCKET_IDS", buckets_of)
    files = {"f": [f"k{i % 4999}" for i in range(5000)]}  # k0 appears twice
    assert find_duplicates(_reader(files), 5000, 5) == (1, [("k0", 2, "f")])
