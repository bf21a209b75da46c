"""The S3 lease needs conditional writes: probed once per bucket against moto's S3 server.

moto honours ``If-None-Match`` and ``If-Match`` on PUT, as AWS S3 does. A store that
ignores them (some S3-compatible servers) is stood in by a loopback proxy in front of moto
that drops both headers: the probe must see through it and refuse the store (exit 2),
unless ``[storage] s3_conditional_writes = "trust"``. No Ray here.
"""

from __future__ import annotations

import contextlib
import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import docintel.pipeline.run.lease as lease_module
from docintel.pipeline.config import StorageConfig
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.output.sink import resolve_output
from docintel.pipeline.run.lease import (
    LEASE_FILE,
    PROBE_PREFIX,
    ConditionalWritesUnsupported,
    Lease,
    LeaseHeld,
)
from tests.integration.test_s3 import REGION, SECRET, _moto_server

BUCKET = "lease-bucket"
CONDITIONS = ("if-none-match", "if-match")
HOP_BY_HOP = ("connection", "keep-alive", "transfer-encoding", "content-length", "expect")


class IgnoresConditions(ThreadingHTTPServer):
    """A loopback proxy to moto that drops If-None-Match and If-Match: a store that
    silently ignores conditional writes. Counts the requests for probe keys."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.upstream = urlsplit(upstream).netloc
        self.probe_requests = 0
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


class _Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: IgnoresConditions

    def do_GET(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            body = b"".join(chunks)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if PROBE_PREFIX in self.path:
            self.server.probe_requests += 1
        drop = (*CONDITIONS, *HOP_BY_HOP)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in drop}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(self.server.upstream, timeout=30)
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data, status, answer = resp.read(), resp.status, resp.getheaders()
        finally:
            conn.close()
        self.send_response_only(status)
        length = str(len(data))
        for k, v in answer:
            if k.lower() == "content-length" and self.command == "HEAD":
                length = v
            elif k.lower() not in HOP_BY_HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@contextlib.contextmanager
def ignoring_conditions(upstream: str) -> Iterator[IgnoresConditions]:
    proxy = IgnoresConditions(upstream)
    proxy._thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import boto3

    with _moto_server(tmp_path_factory.mktemp("moto-lease") / "server.log") as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name=REGION).create_bucket(Bucket=BUCKET)
        yield endpoint


@pytest.fixture(autouse=True)
def unprobed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh process would: no bucket probed yet."""
    monkeypatch.setattr(lease_module, "_PROBED", set())


def _keys(endpoint: str) -> list[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION)
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", []))


def _lease(endpoint: str, prefix: str, purpose: str, **storage: Any) -> Lease:
    cfg = StorageConfig(s3_endpoint=endpoint, s3_region=REGION, **storage)
    fs, root = resolve_output(f"s3://{BUCKET}/{prefix}", cfg)
    return Lease(fs, root, cfg, purpose, ttl_s=60)


def test_moto_passes_the_probe_once_per_bucket_and_the_lease_is_exclusive(
    moto: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes: list[str] = []
    real = lease_module._ignored_conditions

    def counted(client: Any, bucket: str, key: str) -> list[str]:
        probes.append(key)
        return real(client, bucket, key)

    monkeypatch.setattr(lease_module, "_ignored_conditions", counted)
    with _lease(moto, "out-a", "run A"):
        assert _keys(moto) == [f"out-a/{LEASE_FILE}"]  # the probe's key is gone again
        with pytest.raises(LeaseHeld, match="run A"):
            _lease(moto, "out-a", "run B").acquire()
        with _lease(moto, "out-b", "run C"):  # the same bucket: not probed again
            pass
    assert len(probes) == 1 and probes[0].startswith(f"out-a/{PROBE_PREFIX}"), probes
    assert _keys(moto) == []


def test_a_store_that_ignores_conditional_writes_is_refused_naming_it(
    moto: str, tmp_path: Path
) -> None:
    with ignoring_conditions(moto) as store:
        lease = _lease(store.endpoint, "out-c", "run D")
        with pytest.raises(ConditionalWritesUnsupported) as refused:
            lease.acquire()
        assert isinstance(refused.value, ConfigError)  # exit code 2, before any work
        said = str(refused.value)
        assert f"bucket {BUCKET!r} on {store.endpoint}" in said, said
        assert "If-None-Match" in said and "If-Match" in said, said
        assert 's3_conditional_writes = "trust"' in said, said
        assert SECRET not in said
        assert store.probe_requests >= 3  # the probe ran, through the store, and cleaned up
    assert _keys(moto) == []  # no lease written, no probe left behind


def test_trust_skips_the_probe(moto: str) -> None:
    with ignoring_conditions(moto) as store:
        with _lease(store.endpoint, "out-d", "run E", s3_conditional_writes="trust"):
            assert _keys(moto) == [f"out-d/{LEASE_FILE}"]
        assert store.probe_requests == 0
    assert _keys(moto) == []
