"""One writer per output: the local lease (exclusive create, flock, expiry, take-over), who
may be judged dead (same host, PID namespace and boot only), expiry while renewals fail,
and compaction's deletes under the lease."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

import docintel.pipeline.formats.parquet as sink_module
from docintel.pipeline.batch import Batch
from docintel.pipeline.config import StorageConfig
from docintel.pipeline.formats.parquet import ParquetPartsSink, part_files, part_path
from docintel.pipeline.output.sink import TABLES
from docintel.pipeline.run.lease import (
    LEASE_FILE,
    Claim,
    Lease,
    LeaseHeld,
    LeaseLost,
    LocalStore,
    boot_id,
    holder_is_dead,
    pid_namespace,
    this_holder,
)
from docintel.pipeline.schema import (
    DOC_ID,
    EMBEDDING,
    END_CHAR,
    LABEL,
    N_TOKENS,
    PROBS,
    SCORE,
    SENT_INDEX,
    START_CHAR,
    TEXT,
    TRUNCATED,
)

FS = pafs.LocalFileSystem()
STORAGE = StorageConfig()


def _lease(folder: Path, purpose: str = "run A", ttl: float = 30, wait: float = 0) -> Lease:
    return Lease(FS, str(folder), STORAGE, purpose, ttl, wait)


def _plant(folder: Path, holder: str, expires_in: float) -> None:
    """A claim written by some other writer (another host, or a dead process)."""
    folder.mkdir(parents=True, exist_ok=True)
    claim = Claim(holder, "run OTHER", "2026-12-01T00:00:00+00:00", time.time() + expires_in)
    (folder / LEASE_FILE).write_bytes(claim.encode())


def test_a_second_writer_is_refused_naming_the_holder(tmp_path: Path) -> None:
    with _lease(tmp_path, "run A") as a:
        claim = json.loads((tmp_path / LEASE_FILE).read_text())
        assert claim["holder"] == a.holder and claim["purpose"] == "run A"
        with pytest.raises(LeaseHeld, match=r"being written by another docintel process: run A"):
            _lease(tmp_path, "run B").acquire()
    assert not (tmp_path / LEASE_FILE).exists()  # released
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no lock or temp files left
    with _lease(tmp_path, "run B"):
        pass


def test_an_expired_claim_is_taken_over(tmp_path: Path) -> None:
    _plant(tmp_path, "elsewhere.example:4242:1:abcd", expires_in=-1)
    with _lease(tmp_path, "run B") as b:
        assert json.loads((tmp_path / LEASE_FILE).read_text())["holder"] == b.holder


def test_a_live_claim_from_another_host_blocks_until_it_expires(tmp_path: Path) -> None:
    _plant(tmp_path, "elsewhere.example:4242:1:abcd", expires_in=1.5)
    with pytest.raises(LeaseHeld, match=r"elsewhere\.example"):
        _lease(tmp_path).acquire()
    t0 = time.monotonic()
    with _lease(tmp_path, wait=10):  # waits for the expiry, then takes it over
        assert time.monotonic() - t0 >= 0.5


def _here(pid: int = 999999, ns: str | None = None, boot: str | None = None) -> str:
    """A holder on this host (by name) whose pid does not exist here; this PID namespace
    and boot unless told otherwise."""
    ns = pid_namespace() if ns is None else ns
    boot = boot_id() if boot is None else boot
    return f"{socket.gethostname()}:{pid}:12345:dead:{ns}:{boot}"


def test_a_claim_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    """A killed driver, then a resume: no waiting for the dead claim to expire."""
    _plant(tmp_path, _here(), expires_in=600)
    with _lease(tmp_path, "run resumed"):
        pass


@pytest.mark.parametrize(
    "holder",
    [
        pytest.param(_here(ns="4026500000"), id="another-pid-namespace"),
        pytest.param(_here(boot="00000000-0000-0000-0000-000000000000"), id="another-boot"),
        pytest.param(f"{socket.gethostname()}:999999:12345:dead", id="old-record"),
    ],
)
def test_a_claim_from_another_pid_namespace_waits_for_its_expiry(
    tmp_path: Path, holder: str
) -> None:
    """Two containers with the same host name (host networking) cannot see each other's
    processes: a pid that does not exist here may be alive there. So may the holder of a
    claim written before claims named their namespace and boot."""
    assert not holder_is_dead(holder)
    _plant(tmp_path, holder, expires_in=1.5)
    with pytest.raises(LeaseHeld, match="run OTHER"):
        _lease(tmp_path).acquire()
    t0 = time.monotonic()
    with _lease(tmp_path, wait=10) as b:  # taken over once expired, not before
        assert time.monotonic() - t0 >= 0.5
        assert json.loads((tmp_path / LEASE_FILE).read_text())["holder"] == b.holder


def test_a_holder_names_its_pid_namespace_and_boot() -> None:
    fields = this_holder().split(":")
    assert len(fields) == 6 and fields[4:] == [pid_namespace(), boot_id()]
    assert all(fields[4:]), fields  # Linux: both known
    assert not holder_is_dead(this_holder())


def test_waiting_writer_gets_the_claim_when_the_holder_releases(tmp_path: Path) -> None:
    a = _lease(tmp_path, "run A")
    a.acquire()
    threading.Timer(1.0, a.release).start()
    with _lease(tmp_path, "run B", wait=20) as b:
        assert json.loads((tmp_path / LEASE_FILE).read_text())["holder"] == b.holder


def test_a_holder_whose_claim_was_taken_stops(tmp_path: Path) -> None:
    a = _lease(tmp_path, "run A", ttl=30)
    a.acquire()
    try:
        _plant(tmp_path, "elsewhere.example:1:1:x", expires_in=600)  # taken after a stall
        a.renew()
        with pytest.raises(LeaseLost, match="taken over"):
            a.check()
    finally:
        a.release()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["holder"].startswith("elsewhere")


def test_renewal_extends_the_claim(tmp_path: Path) -> None:
    with _lease(tmp_path, ttl=3) as a:
        first = json.loads((tmp_path / LEASE_FILE).read_text())["expires"]
        time.sleep(1.5)  # the heartbeat renews every ttl/3 = 1 s
        later = json.loads((tmp_path / LEASE_FILE).read_text())["expires"]
        assert later > first
        a.check()


def test_exactly_one_of_many_racing_writers_wins(tmp_path: Path) -> None:
    for round_ in range(10):
        folder = tmp_path / f"round{round_}"
        leases = [_lease(folder, f"run {i}") for i in range(8)]
        won: list[Lease] = []
        barrier = threading.Barrier(len(leases))

        def race(lease: Lease, barrier: threading.Barrier = barrier, won: list = won) -> None:
            barrier.wait()
            try:
                lease.acquire()
                won.append(lease)
            except LeaseHeld:
                pass

        threads = [threading.Thread(target=race, args=(lease,)) for lease in leases]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, round_
        won[0].release()


def test_a_damaged_lease_file_counts_as_expired(tmp_path: Path) -> None:
    (tmp_path / LEASE_FILE).write_text("{not json")
    with _lease(tmp_path):
        pass


class AnswerLost:
    """A store whose first answer to each write is lost, so the client sends it again.

    This is what boto3's retries do when a PUT lands but its response does not arrive:
    the retry carries the same condition and is refused by the version it just wrote.
    """

    def __init__(self, inner: LocalStore) -> None:
        self.inner = inner

    def read(self) -> tuple[bytes, str] | None:
        return self.inner.read()

    def create(self, data: bytes) -> str | None:
        self.inner.create(data)
        return self.inner.create(data)  # the retry: refused, the object exists

    def swap(self, data: bytes, tag: str) -> str | None:
        self.inner.swap(data, tag)
        return self.inner.swap(data, tag)  # the retry: refused, the tag is stale

    def delete(self, tag: str) -> None:
        self.inner.delete(tag)


def test_a_write_whose_answer_was_lost_keeps_the_claim(tmp_path: Path) -> None:
    """A lost answer and a refused retry of our own write are not a take-over."""
    a = _lease(tmp_path, "run A", ttl=30)
    a.store = AnswerLost(LocalStore(str(tmp_path / LEASE_FILE)))
    a.acquire()  # the create landed, its retry was refused: the claim is ours all the same
    try:
        for _ in range(3):
            before = json.loads((tmp_path / LEASE_FILE).read_text())["expires"]
            time.sleep(0.01)
            a.renew()
            a.check()
            assert json.loads((tmp_path / LEASE_FILE).read_text())["expires"] > before
        _plant(tmp_path, "elsewhere.example:1:1:x", expires_in=600)  # a real take-over
        a.renew()
        with pytest.raises(LeaseLost, match="taken over"):
            a.check()
    finally:
        a.release()


class Unreachable:
    """A store that took the claim, then stops answering: every renewal fails."""

    def __init__(self, inner: LocalStore) -> None:
        self.inner = inner
        self.down = False

    def read(self) -> tuple[bytes, str] | None:
        return self.inner.read()

    def create(self, data: bytes) -> str | None:
        return self.inner.create(data)

    def swap(self, data: bytes, tag: str) -> str | None:
        if self.down:
            raise OSError("the store does not answer")
        return self.inner.swap(data, tag)

    def delete(self, tag: str) -> None:
        self.inner.delete(tag)


def test_check_fails_once_the_claim_expired_without_a_successful_renewal(
    tmp_path: Path,
) -> None:
    """Renewals failing (the store unreachable) are retried, but once the claim's time to
    live has passed another writer may take it: check() stops the holder."""
    a = _lease(tmp_path, "run A", ttl=1.0)
    store = Unreachable(LocalStore(str(tmp_path / LEASE_FILE)))
    a.store = store
    a.acquire()
    try:
        time.sleep(1.3)  # renewed every 1/3 s: still ours
        a.check()
        store.down = True
        time.sleep(1.3)
        assert a.last_error is not None  # the heartbeat tried
        with pytest.raises(LeaseLost, match=r"expired .* without a successful renewal"):
            a.check()
    finally:
        a.release()


# --- compaction deletes only under the lease ----------------------------------------------

LABELS = ["up", "down"]


def _tiny_batch(batch_id: str, ids: list[str]) -> Batch:
    """A finished batch of one sentence per document, without running the models."""
    n = len(ids)
    table = pa.table(
        {
            DOC_ID: ids,
            SENT_INDEX: pa.array([0] * n, pa.int32()),
            START_CHAR: pa.array([0] * n, pa.int64()),
            END_CHAR: pa.array([4] * n, pa.int64()),
            TEXT: ["text"] * n,
            LABEL: ["up"] * n,
            SCORE: pa.array([0.9] * n, pa.float32()),
            N_TOKENS: pa.array([3] * n, pa.int32()),
            TRUNCATED: [False] * n,
            EMBEDDING: pa.FixedSizeListArray.from_arrays(pa.array([0.5] * 2 * n, pa.float32()), 2),
            PROBS: pa.array([[0.9, 0.1]] * n, pa.list_(pa.float32())),
        }
    )
    return Batch(batch_id, pa.array(ids, pa.string()), table)


def _leased_task_map(lease: Lease) -> Callable[..., Iterator[Any]]:
    """The runner's task map, in this process: the lease checked before each submission."""

    def run(fn: Callable[[Any], Any], items: Sequence[Any], /) -> Iterator[Any]:
        for item in items:
            lease.check()
            yield fn(item)

    return run


def test_a_lease_lost_during_compaction_deletes_nothing_and_resume_settles_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease is lost while a group is merged (a stall, another writer took over): the
    members' own parts are not deleted by the writer that lost it, and the resume's settle
    leaves every batch exactly once."""
    out = tmp_path / "out"
    sink = ParquetPartsSink(FS, str(out), tuple(LABELS), True, part_target_bytes=2**30)
    sink.start({"run_id": "r1"})
    ids = {f"aaaa-00000-0000{i}": [f"d{i}-{j}" for j in range(3)] for i in range(4)}
    for batch_id, docs in ids.items():
        sink.write(_tiny_batch(batch_id, docs))
    lease = _lease(out, "run r1", ttl=60)
    lease.acquire()
    real_write = sink_module.atomic_write

    def write_then_lose(fs: pafs.FileSystem, path: str, data: Any) -> None:
        real_write(fs, path, data)
        if "/documents/part-merged-" in path:  # the group's commit point, then the take-over
            _plant(out, "elsewhere.example:1:1:x", expires_in=600)
            lease.renew()

    monkeypatch.setattr(sink_module, "atomic_write", write_then_lose)
    try:
        with pytest.raises(LeaseLost, match="taken over"):
            sink.finish(_leased_task_map(lease))
    finally:
        lease.release()
    for table in TABLES:  # every member's own part is still there, beside the merged one
        for batch_id in ids:
            assert Path(part_path(str(out), table, batch_id)).is_file(), (table, batch_id)
    sink.settle()  # what the next resume does first
    docs = ds.dataset(part_files(FS, str(out), "documents"), format="parquet").to_table()
    assert sorted(docs[DOC_ID].to_pylist()) == sorted(d for v in ids.values() for d in v)
    sents = ds.dataset(part_files(FS, str(out), "sentences"), format="parquet").to_table()
    assert sorted(sents[DOC_ID].to_pylist()) == sorted(docs[DOC_ID].to_pylist())


def test_a_compaction_task_that_starts_after_the_claim_expired_does_nothing() -> None:
    """The runner's sink tasks carry the claim's expiry as it was at submission."""
    from docintel.actors.runner import _apply

    done: list[int] = []
    with pytest.raises(LeaseLost, match="expired"):
        _apply(done.append, 1, time.time() - 1)
    assert done == []
    _apply(done.append, 2, time.time() + 60)
    assert done == [2]
