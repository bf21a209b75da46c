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
gone from this very host (a killed driver, then a resume) is taken over at once. "This very
host" means the same host name, PID namespace and boot: two containers sharing a host name
(host networking, ``hostNetwork`` pods) cannot see each other's processes, so a claim from
another PID namespace (or another boot, or written without them by an older docintel) is
only taken over once it expires. A second writer finds the claim held and is refused with
exit code 2, naming the holder, or waits up to ``wait_s`` for it. A holder that finds its
claim taken (it stalled past its own expiry), or whose claim expired because its renewals
kept failing, stops before committing anything (:meth:`Lease.check`).

On S3 the claim is exclusive only if the store honours ``If-None-Match`` and ``If-Match``.
Some S3-compatible stores ignore them and overwrite, so the capability is probed once per
endpoint and bucket, before the first claim (:func:`check_conditional_writes`); a store
that ignores them is refused (exit 2) unless ``[storage] s3_conditional_writes = "trust"``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import psutil
import pyarrow.fs as pafs

from docintel.pipeline.config import StorageConfig
from docintel.pipeline.errors import ConfigError, OutputError, RunFailed
from docintel.pipeline.storage import display_uri, effective_endpoint, is_local

LEASE_FILE = "_lease.json"  # leading underscore: pyarrow.dataset and docintel inputs skip it
POLL_S = 1.0  # how often a waiting writer looks at the lease again
PID_NAMESPACE_LINK = "/proc/self/ns/pid"  # Linux: "pid:[<inode>]", one per PID namespace
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"  # Linux: a new random id at every boot
# The conditional-write probe's object, beside the lease (leading underscore: skipped by
# readers); a unique name per probe, deleted at once.
PROBE_PREFIX = "_docintel-probe-"
PRECONDITION_FAILED = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})


class LeaseHeld(OutputError):
    """Another live writer holds the lease (exit 2: nothing was done)."""


class LeaseLost(RunFailed):
    """Our claim was taken by another writer, or expired without a successful renewal:
    stop before committing anything."""


class ConditionalWritesUnsupported(ConfigError):
    """The S3 store ignores conditional writes, so the lease would not be exclusive (exit
    2, before any work)."""


@dataclass(frozen=True)
class Claim:
    holder: str  # host:pid:start time:nonce:pid namespace:boot id (see Holder)
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


def pid_namespace() -> str:
    """This process's PID namespace: the inode of ``/proc/self/ns/pid``; "host" on systems
    without PID namespaces (macOS); "" when unknown (a holder without it is never judged
    dead, only expired)."""
    if not sys.platform.startswith("linux"):
        return "host"
    try:
        link = str(Path(PID_NAMESPACE_LINK).readlink())
    except OSError:
        return ""
    return "".join(c for c in link if c.isdigit())


def boot_id() -> str:
    """This boot of the machine: the kernel's random boot id ("" when unknown); elsewhere
    than Linux, the boot time."""
    if not sys.platform.startswith("linux"):
        return f"boot{int(psutil.boot_time())}"
    try:
        return Path(BOOT_ID_FILE).read_text().strip().replace(":", "")
    except OSError:
        return ""


@dataclass(frozen=True)
class Holder:
    """Who holds a claim, written ``host:pid:start time:nonce:pid namespace:boot id``.

    Older docintel versions wrote the first four fields only; their claims parse with an
    empty namespace and boot id, so they are never judged dead, only expired."""

    host: str
    pid: int
    started: int  # the process's start time (whole seconds): a reused pid differs
    nonce: str
    pid_ns: str = ""
    boot: str = ""

    def __str__(self) -> str:
        fields = [self.host, str(self.pid), str(self.started), self.nonce]
        return ":".join([*fields, self.pid_ns, self.boot])

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        parts = text.split(":")
        if len(parts) not in (4, 6) or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        ns, boot = parts[4:6] if len(parts) == 6 else ("", "")
        return cls(parts[0], int(parts[1]), int(parts[2]), parts[3], ns, boot)

    @classmethod
    def me(cls) -> Holder:
        p = psutil.Process()
        nonce = uuid.uuid4().hex[:8]
        return cls(
            socket.gethostname(), p.pid, int(p.create_time()), nonce, pid_namespace(), boot_id()
        )

    def sees_my_processes(self) -> bool:
        """Same host, PID namespace and boot as this process: its pid means the same here."""
        here = (socket.gethostname(), pid_namespace(), boot_id())
        return all(here) and (self.host, self.pid_ns, self.boot) == here


def this_holder() -> str:
    """This process as a claim's holder: unique, and tells whether it is still alive."""
    return str(Holder.me())


def holder_is_dead(holder: str) -> bool:
    """Only for holders in this very PID namespace of this boot of this host: their process
    is gone (or its pid was reused). Anyone else (another container with the same host
    name, a claim without namespace and boot id): not known dead, so wait for expiry."""
    h = Holder.parse(holder)
    if h is None or not h.sees_my_processes():
        return False
    try:
        return int(psutil.Process(h.pid).create_time()) != h.started
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


def _code(e: Exception) -> str:
    return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))


class S3Store:
    """An S3 lease object, changed only by conditional requests (boto3). Before its first
    write, the store's support for them is probed (once per endpoint and bucket)."""

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
        self.endpoint = endpoint or ""
        self.trust = storage.s3_conditional_writes == "trust"

    def _checked(self) -> None:
        if not self.trust:
            check_conditional_writes(self.client, self.endpoint, self.bucket, self.key)

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
            if _code(e) in PRECONDITION_FAILED:
                return None
            raise
        return r["ETag"]

    def create(self, data: bytes) -> str | None:
        self._checked()
        return self._put(data, IfNoneMatch="*")

    def swap(self, data: bytes, tag: str) -> str | None:
        self._checked()
        return self._put(data, IfMatch=tag)

    def delete(self, tag: str) -> None:
        from botocore.exceptions import ClientError

        with contextlib.suppress(ClientError):  # changed meanwhile: not ours any more
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=tag)


_PROBED: set[tuple[str, str]] = set()  # (endpoint, bucket) found to honour conditions
_PROBE_MUTEX = threading.Lock()


def _conditional_put(client: Any, bucket: str, key: str, **condition: str) -> bool:
    """PUT a tiny body under ``condition``: True if stored, False if refused (412)."""
    from botocore.exceptions import ClientError

    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"docintel probe", **condition)
    except ClientError as e:
        if _code(e) in PRECONDITION_FAILED:
            return False
        raise
    return True


def _ignored_conditions(client: Any, bucket: str, key: str) -> list[str]:
    """Which conditions a store ignored on a fresh key: a second ``If-None-Match: *`` PUT
    and an ``If-Match`` PUT naming a version that never existed must both be refused."""
    if not _conditional_put(client, bucket, key, IfNoneMatch="*"):
        return ["If-None-Match (refused a PUT of a key that did not exist)"]
    ignored = []
    if _conditional_put(client, bucket, key, IfNoneMatch="*"):
        ignored.append("If-None-Match (a second PUT of an existing key succeeded)")
    if _conditional_put(client, bucket, key, IfMatch=f'"{"0" * 32}"'):
        ignored.append("If-Match (a PUT naming another version succeeded)")
    return ignored


def _store_name(endpoint: str, bucket: str) -> str:
    """``bucket`` on the endpoint as scheme://host:port (never any user info or path)."""
    if not endpoint:
        return f"bucket {bucket!r} on AWS S3"
    url = urlsplit(endpoint)
    host = url.hostname or "?"
    return f"bucket {bucket!r} on {url.scheme}://{host}{f':{url.port}' if url.port else ''}"


def check_conditional_writes(client: Any, endpoint: str, bucket: str, key: str) -> None:
    """Probe once per endpoint and bucket (per process) that the store honours conditional
    PUTs, on a unique key beside ``key`` that is deleted again; refuse a store that ignores
    them (ConditionalWritesUnsupported, exit 2) or rejects them (NotImplemented)."""
    from botocore.exceptions import ClientError

    with _PROBE_MUTEX:
        if (endpoint, bucket) in _PROBED:
            return
        folder = key.rpartition("/")[0]
        probe = f"{folder}/{PROBE_PREFIX}{uuid.uuid4().hex[:12]}".lstrip("/")
        try:
            ignored = _ignored_conditions(client, bucket, probe)
        except ClientError as e:
            if _code(e) not in {"NotImplemented", "501"}:
                raise
            ignored = [f"conditional PUTs (refused: {_code(e)})"]
        finally:
            with contextlib.suppress(ClientError):
                client.delete_object(Bucket=bucket, Key=probe)
        if ignored:
            raise ConditionalWritesUnsupported(
                f"the S3 store ({_store_name(endpoint, bucket)}) does not honour conditional "
                f"writes: {'; '.join(ignored)}. docintel's one-writer-per-output lease needs "
                "them (AWS S3 honours them). Use a store that does, or, if "
                "you make sure yourself that one process at a time writes each output, set "
                '[storage] s3_conditional_writes = "trust"'
            )
        _PROBED.add((endpoint, bucket))


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
        # Unix time until which our last successful write makes the claim ours: check()
        # fails past it, renewed or not (another writer may have taken it since)
        self.valid_until = 0.0
        self.lost: str | None = None  # why the claim was lost, once it was
        self.last_error: Exception | None = None  # of the last failed renewal (retried)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def _claim(self) -> tuple[bytes, float]:
        """Our claim as written now, and until when it holds (counted from before the
        write, so never later than what the store holds)."""
        expires = time.time() + self.ttl_s
        return Claim(self.holder, self.purpose, self.since, expires).encode(), expires

    def _held(self, tag: str, expires: float) -> None:
        self.tag, self.valid_until = tag, expires

    def _try(self) -> Claim | None:
        """Take the claim if free, expired or dead; else return the live holder's claim."""
        data, expires = self._claim()
        tag = self.store.create(data)
        if tag is not None:
            self._held(tag, expires)
            return None
        current = self.store.read()
        if current is None:
            return self._try()  # released between our two requests
        theirs = Claim.decode(current[0])
        if theirs.holder == self.holder:
            # our own write landed but its answer was lost and the retried request was
            # refused by its own condition: the claim is ours
            self._held(current[1], theirs.expires)
            return None
        if theirs.expires > time.time() and not holder_is_dead(theirs.holder):
            return theirs
        data, expires = self._claim()
        tag = self.store.swap(data, current[1])
        if tag is None:
            return self._try()  # someone else changed it first: look again
        self._held(tag, expires)
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
            data, expires = self._claim()
            tag = self.store.swap(data, self.tag)
            if tag is not None:
                self._held(tag, expires)
                return
            current = self.store.read()
            theirs = Claim.decode(current[0]) if current else None
            if current is not None and theirs is not None and theirs.holder == self.holder:
                # a retried renewal: the first attempt landed, its answer was lost, and
                # the retry's If-Match named the version it had just replaced
                self._held(current[1], theirs.expires)
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
        """Raise LeaseLost if another writer has taken our claim, or if it expired without
        a successful renewal (renewals failing: another writer may take it any moment)."""
        if self.lost:
            raise LeaseLost(f"{self.lost}; this run stops without committing")
        if self.tag is not None and time.time() >= self.valid_until:
            until = dt.datetime.fromtimestamp(self.valid_until, dt.UTC).isoformat(
                timespec="seconds"
            )
            why = f" (last error: {self.last_error})" if self.last_error else ""
            raise LeaseLost(
                f"the lease on {self.where} expired at {until} without a successful "
                f"renewal{why}; another writer may take it over, so this run stops without "
                "committing"
            )

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
