"""One writer per output: the local lease (exclusive create, flock, expiry, take-over)."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from docintel.pipeline.config import StorageConfig
from docintel.pipeline.lease import LEASE_FILE, Claim, Lease, LeaseHeld, LeaseLost, LocalStore

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


def test_a_claim_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    """A killed driver, then a resume: no waiting for the dead claim to expire."""
    _plant(tmp_path, f"{socket.gethostname()}:999999:12345:dead", expires_in=600)
    with _lease(tmp_path, "run resumed"):
        pass


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
