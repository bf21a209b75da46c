"""One writer per output: an expiring, renewed lease file beside what it guards.

A run holds ``OUTPUT/_lease.json`` while it writes OUTPUT; an audit holds
``AUDIT_ROOT/_audit/_lease.json`` while it selects, runs and commits a night. The file
names its holder (host, process, a random nonce), what it is doing, since when, and until
when the claim holds. Every change is a compare-and-swap, so two writers can never both
believe they hold it:

* locally, the file is created whole by an exclusive hard link of a staged copy, and
  renewals, take-overs and the release happen under an ``flock`` of the file itself;
* on S3, through boto3 (pyarrow has no conditional writes): the first claim is a PUT with
  ``If-None-Match: *``, renewals and take-overs a PUT with ``If-Match: <ETag>``, the
  release a DELETE with ``If-Match``.

The holder renews the claim from a heartbeat thread every third of its time to live. A
holder that crashed stops renewing and its claim expires; a claim whose holder process is
gone from this very host (a killed driver, then a resume) is taken over at once. A second
writer finds the claim held and is refused with exit code 2, naming the holder, or waits
up to ``wait_s`` for it. A holder that finds its claim taken (it stalled past its own
expiry) stops before committing anything.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
import pyarrow.fs as pafs

from docintel.pipeline.config import StorageConfig
from docintel.pipeline.errors import OutputError, RunFailed
from docintel.pipeline.storage import display_uri, effective_endpoint, is_local

LEASE_FILE = "_lease.json"  # leading underscore: pyarrow.dataset and docintel inputs skip it
POLL_S = 1.0  # how often a waiting writer looks at the lease again


class LeaseHeld(OutputError):
    """Another live writer holds the lease (exit 2: nothing was done)."""


class LeaseLost(RunFailed):
    """Our claim expired and another writer took it: stop before committing anything."""


@dataclass(frozen=True)
class Claim:
    holder: str  # host:pid:start time:nonce
    purpose: str  # e.g. "run 20261201-1200-abc123" or "audit 2026-12-01"
    since: str  # ISO time the claim was first taken
    expires: float  # Unix time until which the claim holds unless renewed

    def encode(self) -> bytes:
        return json.dumps(asdict(self), indent=2).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Claim:
        try:
            return cls(**json.loads(raw.decode()))
        except (ValueError, TypeError) as e:  # a damaged file: treat it as expired
            return cls("unknown", f"unreadable lease ({e})", "", 0.0)

    def describe(self) -> str:
        until = dt.datetime.fromtimestamp(self.expires, dt.UTC).isoformat(timespec="seconds")
        return f"{self.purpose} by {self.holder} since {self.since} (claim valid until {until})"


def this_holder() -> str:
    """``host:pid:process start time:nonce``: unique, and tells whether it is still alive."""
    me = psutil.Process()
    return f"{socket.gethostname()}:{me.pid}:{int(me.create_time())}:{uuid.uuid4().hex[:8]}"


def holder_is_dead(holder: str) -> bool:
    """Only for holders on this host: their process is gone (or its pid was reused)."""
    host, _, rest = holder.partition(":")
    pid, _, rest = rest.partition(":")
    started = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit() or not started.isdigit():
        return False
    try:
        return int(psutil.Process(int(pid)).create_time()) != int(started)
    except psutil.NoSuchProcess:
        return True


class Store(Protocol):
    """Compare-and-swap on one small object. ``tag`` identifies the version read."""

    def read(self) -> tuple[bytes, str] | None: ...
    def create(self, data: bytes) -> str | None: ...  # None: it exists already
    def swap(self, data: bytes, tag: str) -> str | None: ...  # None: it changed meanwhile
    def delete(self, tag: str) -> None: ...


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class LocalStore:
    """A local lease file: created whole with an exclusive link, changed under its flock.

    No lock file beside it: each change locks the lease file itself, then checks that
    the path still names the inode it locked (a release or a swap replaces the file, and
    a writer that waited on the old inode looks again).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _staged(self, data: bytes) -> Path:
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:12]}.tmp")
        tmp.write_bytes(data)
        return tmp

    @contextlib.contextmanager
    def _locked(self) -> Iterator[tuple[int, bytes] | None]:
        while True:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                yield None
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    same = self.path.stat().st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    with os.fdopen(os.dup(fd), "rb") as f:
                        raw = f.read()
                    yield fd, raw
                    return
            finally:
                os.close(fd)  # closing the descriptor drops the flock

    def read(self) -> tuple[bytes, str] | None:
        with self._locked() as held:
            return None if held is None else (held[1], _digest(held[1]))

    def create(self, data: bytes) -> str | None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._staged(data)
        try:
            os.link(tmp, self.path)  # atomic and exclusive: the file appears whole or not
        except FileExistsError:
            return None
        finally:
            tmp.unlink()
        return _digest(data)

    def swap(self, data: bytes, tag: str) -> str | None:
        with self._locked() as held:
            if held is None or _digest(held[1]) != tag:
                return None
            self._staged(data).replace(self.path)
            return _digest(data)

    def delete(self, tag: str) -> None:
        with self._locked() as held:
            if held is not None and _digest(held[1]) == tag:
                self.path.unlink()


class S3Store:
    """An S3 lease object, changed only by conditional requests (boto3)."""

    def __init__(self, bucket: str, key: str, storage: StorageConfig) -> None:
        import boto3
        from botocore.config import Config as BotoConfig

        endpoint = effective_endpoint(storage)[0] or None
        retries = {"max_attempts": storage.s3_attempts, "mode": "standard"}
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=storage.s3_region or None,
            config=BotoConfig(retries=retries),  # type: ignore[arg-type]
        )
        self.bucket, self.key = bucket, key

    def _code(self, e: Exception) -> str:
        return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))

    def read(self) -> tuple[bytes, str] | None:
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except self.client.exceptions.NoSuchKey:
            return None
        return r["Body"].read(), r["ETag"]

    def _put(self, data: bytes, **condition: str) -> str | None:
        from botocore.exceptions import ClientError

        try:
            r = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=data, **condition)
        except ClientError as e:
            if self._code(e) in {"PreconditionFailed", "412", "ConditionalRequestConflict"}:
                return None
            raise
        return r["ETag"]

    def create(self, data: bytes) -> str | None:
        return self._put(data, IfNoneMatch="*")

    def swap(self, data: bytes, tag: str) -> str | None:
        return self._put(data, IfMatch=tag)

    def delete(self, tag: str) -> None:
        from botocore.exceptions import ClientError

        with contextlib.suppress(ClientError):  # changed meanwhile: not ours any more
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=tag)


def store_for(fs: pafs.FileSystem, folder: str, storage: StorageConfig) -> Store:
    return store_at(fs, f"{folder.rstrip('/')}/{LEASE_FILE}", storage)


def store_at(fs: pafs.FileSystem, path: str, storage: StorageConfig) -> Store:
    """Compare-and-swap on the small object at ``path`` (the lease, the audit state)."""
    if is_local(fs):
        return LocalStore(path)
    bucket, _, key = path.partition("/")
    return S3Store(bucket, key, storage)


class Lease:
    """An exclusive claim on a folder or prefix, renewed while held (a context manager)."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        folder: str,
        storage: StorageConfig,
        purpose: str,
        ttl_s: float,
        wait_s: float = 0.0,
    ) -> None:
        self.where = display_uri(fs, folder)
        self.store = store_for(fs, folder, storage)
        self.purpose, self.ttl_s, self.wait_s = purpose, ttl_s, wait_s
        self.holder = this_holder()
        self.since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.tag: str | None = None
        self.lost: str | None = None  # why the claim was lost, once it was
        self.last_error: Exception | None = None  # of the last failed renewal (retried)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def _claim(self) -> bytes:
        return Claim(self.holder, self.purpose, self.since, time.time() + self.ttl_s).encode()

    def _try(self) -> Claim | None:
        """Take the claim if free, expired or dead; else return the live holder's claim."""
        tag = self.store.create(self._claim())
        if tag is not None:
            self.tag = tag
            return None
        current = self.store.read()
        if current is None:
            return self._try()  # released between our two requests
        theirs = Claim.decode(current[0])
        if theirs.holder == self.holder:
            # our own write landed but its answer was lost and the retried request was
            # refused by its own condition: the claim is ours
            self.tag = current[1]
            return None
        if theirs.expires > time.time() and not holder_is_dead(theirs.holder):
            return theirs
        tag = self.store.swap(self._claim(), current[1])
        if tag is None:
            return self._try()  # someone else changed it first: look again
        self.tag = tag
        return None

    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait_s
        while (theirs := self._try()) is not None:
            if time.monotonic() >= deadline:
                raise LeaseHeld(
                    f"{self.where} is being written by another docintel process: "
                    f"{theirs.describe()}. Wait for it to finish (or for its claim to "
                    "expire if it crashed), or choose another output"
                )
            time.sleep(POLL_S)
        self._thread = threading.Thread(target=self._beat, name="docintel-lease", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        with self._mutex:
            if self.lost or self.tag is None:
                return
            tag = self.store.swap(self._claim(), self.tag)
            if tag is not None:
                self.tag = tag
                return
            current = self.store.read()
            theirs = Claim.decode(current[0]) if current else None
            if current is not None and theirs is not None and theirs.holder == self.holder:
                # a retried renewal: the first attempt landed, its answer was lost, and
                # the retry's If-Match named the version it had just replaced
                self.tag = current[1]
                return
            who = theirs.describe() if theirs else "nobody (deleted)"
            self.lost = f"the lease on {self.where} was taken over: now held {who}"

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.renew()
            except Exception as e:
                # the claim stays ours until it expires, and check() stops us if it is lost
                self.last_error = e

    def check(self) -> None:
        """Raise LeaseLost if another writer has taken our claim."""
        if self.lost:
            raise LeaseLost(f"{self.lost}; this run stops without committing")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._mutex:
            if self.tag is not None and not self.lost:
                self.store.delete(self.tag)
            self.tag = None

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
