"""S3 fault injection: a loopback proxy in front of moto fails requests on purpose.

Transient errors (503 SlowDown, 500 InternalError, a connection closed without an answer)
must be retried, with backoff, by the S3 client itself, on the driver and on the Ray
workers alike, so that the run completes with every document written exactly once.
Permanent errors (403 AccessDenied) must fail the run at once, on the driver, with a
message that names the bucket.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import ray
from typing_extensions import override

import docintel.actors.cluster
import docintel.actors.executor
from docintel.actors.runner import execute
from docintel.pipeline.config import Config, StorageConfig
from docintel.pipeline.errors import InputError, UsageError
from docintel.pipeline.storage import s3_filesystem
from tests.conftest import run_config

# Importing test_s3 puts its test-only AWS credentials into os.environ while pytest collects,
# before any test (and so before the session's ray.init) runs: Ray workers inherit them.
from tests.integration.test_s3 import KEY_ID, REGION, SECRET, _moto_server

IN_BUCKET, OUT_BUCKET = "faults-in", "faults-out"

# The fault schedule, by the proxy's request count (1, 2, 3, ...). Together these fail
# about a third of all requests: far more than real S3 does, so every request kind the
# pipeline makes meets a fault in one small run.
SLOWDOWN_EVERY = 5  # 503 SlowDown, S3's throttling answer
INTERNAL_EVERY = 7  # 500 InternalError
DROP_EVERY = 11  # forwarded to S3, then the connection closes without an answer
# Each documents part PUT (made only by Ray write tasks) fails this many times in a row
# before it is let through: more than pyarrow's default of 3 attempts, so the run only
# completes if the workers' filesystems keep [storage] s3_attempts (6 by default).
PUT_BURST = 3
# a batch's own documents part (not the merged part compaction writes at the end)
BURST_PATH = re.compile(r"/documents/part-(?!merged-)[^/]+\.parquet$")
# No request (same method, path, query and byte range) fails more often than this in the
# whole run, so with s3_attempts above it the outcome does not depend on how concurrent
# requests happen to interleave with the schedule.
MAX_FAULTS_PER_REQUEST = PUT_BURST
UPSTREAM_TIMEOUT_S = 30
DENIED_RUN_MAX_S = 30  # a refused run must fail in seconds, not after a retry loop


@dataclass(frozen=True)
class FaultPlan:
    slowdown_every: int = 0
    internal_every: int = 0
    drop_every: int = 0
    put_burst: int = 0
    deny_all: bool = False
    # pyarrow cannot retry an error answer whose XML body is longer than the byte range a
    # GET asked for (see test_throttled_small_ranged_read_is_retried). With this set, such
    # a read gets a dropped connection instead, which it does retry.
    spare_small_reads: bool = False


@dataclass(frozen=True)
class Exchange:
    """One request as the proxy saw it: ``fault`` is None when S3's answer went back."""

    n: int
    method: str
    path: str
    phase: str
    fault: str | None
    status: int | None  # what the client received; None for a dropped connection
    read_bytes: int | None = None  # the length of a ranged GET
    instead_of: str | None = None  # the fault a small ranged GET was spared


_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
    }
)
_FAULTS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
    "denied": (403, "AccessDenied", "Access Denied"),
}


class FaultProxy(ThreadingHTTPServer):
    """An HTTP reverse proxy on a free loopback port that injects S3 faults per ``plan``.

    ``phase`` labels the exchanges logged from now on (the test sets it as the run moves
    from driver-side checks to Ray work).
    """

    daemon_threads = True

    def __init__(self, upstream: str, plan: FaultPlan) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = urlsplit(upstream).netloc
        self.plan = plan
        self.phase = "driver"
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._count = 0
        self._faulted: dict[tuple[str, str, str], int] = {}
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=10)

    def decide(self, method: str, path: str, byte_range: str) -> tuple[int, str | None]:
        """Number this request and choose its fault (None: forward it untouched)."""
        with self._lock:
            self._count += 1
            n = self._count
            if self.plan.deny_all:
                return n, "denied"
            key = (method, path, byte_range)
            faulted = self._faulted.get(key, 0)
            fault = None
            if faulted < MAX_FAULTS_PER_REQUEST:
                p = self.plan
                if p.put_burst and method == "PUT" and BURST_PATH.search(path):
                    fault = "slowdown" if faulted < p.put_burst else None
                elif p.slowdown_every and n % p.slowdown_every == 0:
                    fault = "slowdown"
                elif p.internal_every and n % p.internal_every == 0:
                    fault = "internal"
                elif p.drop_every and n % p.drop_every == 0:
                    fault = "drop"
            self._faulted[key] = faulted + bool(fault)
            return n, fault

    def record(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)

    def faults(self, phase: str | None = None, method: str | None = None) -> list[Exchange]:
        with self._lock:
            return [
                e
                for e in self.exchanges
                if e.fault
                and (phase is None or e.phase == phase)
                and (method is None or e.method == method)
            ]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the AWS SDK expects
    server: FaultProxy

    def do_GET(self) -> None:
        self._relay()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    @override
    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads the proxy's own log of exchanges instead."""

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _relay(self) -> None:
        body = self._read_body()  # always: the connection stays usable for the next request
        n, fault = self.server.decide(self.command, self.path, self.headers.get("Range", ""))
        read_bytes = _range_length(self.headers.get("Range", ""))
        instead_of = None
        if fault in _FAULTS:
            status, code, message = _FAULTS[fault]
            document = _error_document(code, message, self.path, n)
            small = read_bytes is not None and read_bytes < len(document)
            if not (small and self.server.plan.spare_small_reads and fault != "denied"):
                self._log(n, fault, status, read_bytes)
                self._send(status, [("Content-Type", "application/xml")], document)
                return
            fault, instead_of = "drop", fault
        status, headers, data = self._forward(body)
        if fault == "drop":
            self._log(n, fault, None, read_bytes, instead_of)
            self.close_connection = True  # S3 acted on the request; its answer is lost
            return
        self._log(n, None, status, read_bytes)
        self._send(status, headers, data)

    def _log(
        self,
        n: int,
        fault: str | None,
        status: int | None,
        read_bytes: int | None,
        instead_of: str | None = None,
    ) -> None:
        """Called before the answer goes out: the log is complete once the client has it."""
        phase = self.server.phase
        exchange = Exchange(
            n, self.command, self.path, phase, fault, status, read_bytes, instead_of
        )
        self.server.record(exchange)

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.server.upstream, timeout=UPSTREAM_TIMEOUT_S)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.getheaders(), data
        finally:
            conn.close()

    def _send(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response_only(status)
        length = str(len(data))
        for k, v in headers:
            if k.lower() == "content-length" and self.command == "HEAD":
                length = v  # a HEAD answer states the object's size, with no body
            elif k.lower() not in _HOP_BY_HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _error_document(code: str, message: str, path: str, n: int) -> bytes:
    """An S3 error answer's body, as S3 sends it with a 4xx or 5xx status."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{escape(path)}</Resource><RequestId>fault-{n}</RequestId></Error>"
    ).encode()


def _range_length(header: str) -> int | None:
    """Bytes asked for by a ``Range: bytes=A-B`` (or ``bytes=-N``) header; None: no range."""
    found = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
    if not found or not found[2]:
        return None
    first, last = found[1], int(found[2])
    return last - int(first) + 1 if first else last


@contextlib.contextmanager
def fault_proxy(upstream: str, plan: FaultPlan) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream, plan)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server (the test talks to it directly), with the test's buckets."""
    import boto3

    with _moto_server(tmp_path_factory.mktemp("moto-faults") / "server.log") as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION)
        for bucket in (IN_BUCKET, OUT_BUCKET):
            client.create_bucket(Bucket=bucket)
        yield endpoint


@pytest.fixture(scope="module")
def s3(moto: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=moto, region_name=REGION)


@pytest.fixture
def flaky(moto: str) -> Iterator[FaultProxy]:
    plan = FaultPlan(SLOWDOWN_EVERY, INTERNAL_EVERY, DROP_EVERY, PUT_BURST, spare_small_reads=True)
    with fault_proxy(moto, plan) as proxy:
        yield proxy


@pytest.fixture
def denying(moto: str) -> Iterator[FaultProxy]:
    with fault_proxy(moto, FaultPlan(deny_all=True)) as proxy:
        yield proxy


@pytest.fixture
def credentialed_ray(ray_cluster: None) -> None:
    """The session's Ray, checked to pass the test's credentials on to its workers."""

    @ray.remote(num_cpus=0)
    def worker_key_id() -> str | None:
        import os

        return os.environ.get("AWS_ACCESS_KEY_ID")

    assert ray.get(worker_key_id.remote()) == KEY_ID, (
        "Ray workers lack the test's AWS credentials: Ray started before test_s3 was imported"
    )


def _cfg(endpoint: str) -> Config:
    return run_config(**{"run.batch_size": 3, "storage.s3_endpoint": endpoint})


def _put_docs(s3: Any, key: str, ids: list[str], texts: list[str], row_group_size: int) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"doc_id": ids, "text": texts}), buf, row_group_size=row_group_size)
    s3.put_object(Bucket=IN_BUCKET, Key=key, Body=buf.getvalue())


def _mark_phases(proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """Label the proxy's exchanges: driver checks, Ray work (workers only), commit."""
    original = docintel.actors.cluster.ray_session

    @contextlib.contextmanager
    def marked(cfg: Config, shape: object = None) -> Iterator[None]:
        proxy.phase = "ray"
        with original(cfg, shape):
            yield
        proxy.phase = "commit"

    monkeypatch.setattr(docintel.actors.cluster, "ray_session", marked)


def _no_ray(*args: object, **kwargs: object) -> None:
    raise AssertionError("Ray was started although the run should have been refused first")


def test_transient_s3_faults_are_retried_and_nothing_is_lost(
    moto: str,
    s3: Any,
    flaky: FaultProxy,
    credentialed_ray: None,
    headlines: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids_a = [f"a{i:02d}" for i in range(24)]
    ids_b = [f"b{i:02d}" for i in range(12)]
    _put_docs(s3, "corpus/a.parquet", ids_a, headlines[:24], row_group_size=8)
    _put_docs(s3, "corpus/b.parquet", ids_b, headlines[24:36], row_group_size=5)
    _mark_phases(flaky, monkeypatch)
    # A batch whose read or write fails is otherwise re-run from its read: that would
    # hide an S3 error the client gave up on. Here any such error fails the run.
    monkeypatch.setattr(docintel.actors.executor, "MAX_BATCH_ATTEMPTS", 1)

    t0 = time.perf_counter()
    summary = execute(
        _cfg(flaky.endpoint), f"s3://{IN_BUCKET}/corpus/", f"s3://{OUT_BUCKET}/flaky/"
    )
    elapsed = time.perf_counter() - t0

    # read back from moto directly, not through the proxy
    fs = pafs.S3FileSystem(endpoint_override=urlsplit(moto).netloc, scheme="http", region=REGION)
    docs = pads.dataset(f"{OUT_BUCKET}/flaky/documents", filesystem=fs).to_table().to_pandas()
    assert sorted(docs.doc_id) == sorted(ids_a + ids_b)
    assert docs.doc_id.is_unique
    assert summary.documents == 36 and summary.batches == 14 and summary.errors == 0
    manifest = s3.get_object(Bucket=OUT_BUCKET, Key="flaky/_manifest.json")["Body"].read()
    assert json.loads(manifest)["counts"]["documents"] == 36
    # the 14 small batches were merged at the end, through the same faults
    assert json.loads(manifest)["parts"]["merged_batches"] == 14

    faults = flaky.faults()
    kinds = {f.fault for f in faults}
    driver, workers = flaky.faults("driver"), flaky.faults("ray")
    burst = [f for f in flaky.faults(method="PUT") if BURST_PATH.search(f.path)]
    spared = [f for f in faults if f.instead_of]
    by_kind = {k: sum(f.fault == k for f in faults) for k in sorted(kinds, key=str)}
    report = (
        f"{len(flaky.exchanges)} requests, {len(faults)} faults {by_kind} "
        f"({len(driver)} driver checks, {len(workers)} Ray work, "
        f"{len(flaky.faults('commit'))} commit; {len(burst)} on documents part PUTs; "
        f"{len(spared)} small ranged GETs dropped instead of answered with an error), "
        f"{elapsed:.1f}s"
    )
    print(report)
    assert kinds == {"slowdown", "internal", "drop"}, report
    assert len(driver) >= 3, report  # the driver's listing and footer reads were retried
    assert {f.method for f in workers} >= {"GET", "PUT"}, report  # worker reads and writes
    assert len(burst) == PUT_BURST * summary.batches, report
    ok_parts = {e.path for e in flaky.exchanges if e.method == "PUT" and e.status == 200}
    assert sum(bool(BURST_PATH.search(p)) for p in ok_parts) == summary.batches, report


@pytest.mark.xfail(
    strict=True,
    raises=OSError,
    reason="pyarrow (Arrow C++ with the AWS SDK) reads a byte range into a buffer of exactly "
    "that size and the SDK writes an error answer's body there too: an S3 error document "
    "(about 200-300 bytes) longer than the range turns the stream bad, and the SDK reports "
    "a non-retryable INTERNAL_FAILURE 'Failed to flush response stream' instead of "
    "retrying the 503/500. Small reads: Parquet column chunks of small files or batches, "
    "_run.json. Remove spare_small_reads from the flaky plan when this passes.",
)
def test_throttled_small_ranged_read_is_retried(moto: str, s3: Any) -> None:
    payload = bytes(range(256))
    s3.put_object(Bucket=IN_BUCKET, Key="small/object", Body=payload)
    with fault_proxy(moto, FaultPlan(slowdown_every=2)) as proxy:
        fs = s3_filesystem(StorageConfig(s3_endpoint=proxy.endpoint))
        f = fs.open_input_file(f"{IN_BUCKET}/small/object")  # request 1: HEAD, answered
        assert f.read_at(16, 10) == payload[10:26]  # request 2: 503 SlowDown, to be retried


def test_access_denied_fails_fast_before_ray_work(
    s3: Any, denying: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(docintel.actors.cluster, "ray_session", _no_ray)
    t0 = time.perf_counter()
    with pytest.raises(InputError) as caught:
        execute(_cfg(denying.endpoint), f"s3://{IN_BUCKET}/corpus/", f"s3://{OUT_BUCKET}/never")
    elapsed = time.perf_counter() - t0
    assert isinstance(caught.value, UsageError)  # exit code 2
    msg = str(caught.value)
    assert f"bucket {IN_BUCKET!r}" in msg and "access denied; check the AWS credentials" in msg
    assert SECRET not in msg
    assert elapsed < DENIED_RUN_MAX_S, f"refused run took {elapsed:.1f}s"
    assert 1 <= len(denying.exchanges) <= 2, denying.exchanges  # answered, not retried
    assert not s3.list_objects_v2(Bucket=OUT_BUCKET, Prefix="never").get("KeyCount")
