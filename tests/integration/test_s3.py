"""S3 in and out, against moto's S3 server on loopback: runs, resume, and usage errors."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import ray

import docintel.actors.cluster
from docintel.actors.runner import execute
from docintel.pipeline import registry
from docintel.pipeline.config import Config, StorageConfig
from docintel.pipeline.errors import InputError, OutputError, UsageError
from docintel.pipeline.input.source import resolve_input
from docintel.pipeline.output.sink import resolve_output
from tests.conftest import run_config

# Test-only credentials, set when pytest imports this module: collection ends before any
# test runs, so they are in place before the session's Ray starts (tests/integration/
# conftest.py), whichever test starts it. Ray workers inherit the driver's environment at
# ray.init, and pyarrow never pickles chain credentials: workers need them in their own.
KEY_ID = "docintel-test-key-id"
SECRET = "docintel-test-secret-3b8e1f0a"  # moto accepts any keys; tests look for this one
REGION = "us-east-1"
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata look-ups off EC2
    }
)

IN_BUCKET, OUT_BUCKET = "in-bucket", "out-bucket"
SERVER_START_SECONDS = 30  # moto imports boto and flask first: a few seconds on 2 cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _moto_server(log: Path, **env: str) -> Iterator[str]:
    """moto's S3 server as a subprocess on a free loopback port; yields its endpoint URL."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            if proc.poll() is not None:
                pytest.fail(f"moto server exited with {proc.returncode}: {log.read_text()}")
            try:
                with urllib.request.urlopen(endpoint, timeout=1):
                    break
            except urllib.error.HTTPError:
                break  # an HTTP answer, even a refusal (a server that checks credentials)
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"moto server did not answer on {endpoint}: {log.read_text()}")
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _moto_server(tmp_path_factory.mktemp("moto") / "server.log") as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def s3(s3_endpoint: str) -> Any:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name=REGION)
    for bucket in (IN_BUCKET, OUT_BUCKET):
        client.create_bucket(Bucket=bucket)
    return client


@pytest.fixture(scope="session")
def s3_ray(s3: Any, ray_cluster: None) -> None:
    """The session's Ray, checked to pass the credentials on to its workers."""

    @ray.remote(num_cpus=0)
    def worker_key_id() -> str | None:
        return os.environ.get("AWS_ACCESS_KEY_ID")

    assert ray.get(worker_key_id.remote()) == KEY_ID, (
        "Ray workers lack this module's AWS credentials: Ray started before it was imported"
    )


def _put_docs(
    s3: Any, bucket: str, key: str, ids: list[str], texts: list, row_group_size: int = 4
) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"doc_id": ids, "text": texts}), buf, row_group_size=row_group_size)
    s3.put_object(Bucket=bucket, Key=key, Body=buf.getvalue())


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _cfg(endpoint: str, **overrides: object) -> Config:
    base: dict[str, object] = {
        "run.batch_size": 4,
        "run.show_progress": False,
        "storage.s3_endpoint": endpoint,
    }
    base.update(overrides)
    return run_config(**base)


def _read_tables(endpoint: str, root: str) -> dict[str, pd.DataFrame]:
    """Each output table read back the way an auditor would: pyarrow.dataset on the prefix."""
    host = endpoint.removeprefix("http://")
    fs = pafs.S3FileSystem(endpoint_override=host, scheme="http", region=REGION)
    return {
        t: pads.dataset(f"{root}/{t}", filesystem=fs, format="parquet").to_table().to_pandas()
        for t in ("documents", "sentences", "errors")
    }


def _assert_exactly_once_s3(
    s3: Any, endpoint: str, bucket: str, prefix: str, expected_ids: list[str]
) -> tuple[dict[str, pd.DataFrame], str]:
    """Every input document once in documents/, errors name real documents, run committed.

    Returns the tables and the manifest's text.
    """
    tables = _read_tables(endpoint, f"{bucket}/{prefix}")
    docs = tables["documents"]
    assert sorted(docs["doc_id"]) == sorted(expected_ids)
    assert docs["doc_id"].is_unique
    errored = set(tables["errors"]["doc_id"])
    assert errored <= set(docs["doc_id"])
    assert set(docs.loc[docs.status == "error", "doc_id"]) == errored
    assert not tables["sentences"].duplicated(["doc_id", "sent_index"]).any()
    manifest = s3.get_object(Bucket=bucket, Key=f"{prefix}/_manifest.json")["Body"].read()
    return tables, manifest.decode()


def _no_ray(*args: object, **kwargs: object) -> None:
    raise AssertionError("Ray was started although the run should have been refused first")


def test_s3_input_to_s3_output_every_document_once(
    s3_endpoint: str, s3: Any, s3_ray: None, headlines: list[str]
) -> None:
    ids_a = [f"a{i:02d}" for i in range(10)]
    ids_b = [f"b{i}" for i in range(6)]
    _put_docs(s3, IN_BUCKET, "corpus/a.parquet", ids_a, headlines[:10])
    texts_b = [*headlines[10:14], None, ""]
    _put_docs(s3, IN_BUCKET, "corpus/sub/b.parquet", ids_b, texts_b, row_group_size=3)
    # what a listing skips, as pyarrow.dataset does: not Parquet, _metadata-style, hidden
    s3.put_object(Bucket=IN_BUCKET, Key="corpus/_SUCCESS", Body=b"")
    s3.put_object(Bucket=IN_BUCKET, Key="corpus/.partial.parquet", Body=b"not parquet")
    s3.put_object(Bucket=IN_BUCKET, Key="corpus/notes.csv", Body=b"not parquet")  # no document

    summary = execute(_cfg(s3_endpoint), f"s3://{IN_BUCKET}/corpus/", f"s3://{OUT_BUCKET}/run1/")

    tables, manifest_text = _assert_exactly_once_s3(
        s3, s3_endpoint, OUT_BUCKET, "run1", ids_a + ids_b
    )
    docs = tables["documents"].set_index("doc_id")
    assert summary.documents == 16 and summary.errors == 0 and summary.batches == 5
    assert (docs.status == "ok").all()
    assert docs.loc[["b4", "b5"], "n_sentences"].tolist() == [0, 0]
    assert (docs.loc[ids_a, "n_sentences"] >= 1).all()
    assert len(tables["sentences"]) == docs.n_sentences.sum() == summary.sentences
    assert len(tables["sentences"].embedding.iloc[0]) == 384
    # the manifest: input shown as s3:// URIs, counts from the tables, no credentials
    manifest = json.loads(manifest_text)
    assert [f["uri"] for f in manifest["input"]["files"]] == [
        f"s3://{IN_BUCKET}/corpus/a.parquet",
        f"s3://{IN_BUCKET}/corpus/sub/b.parquet",
    ]
    assert manifest["counts"]["documents"] == 16
    assert manifest["config"]["storage"]["s3_endpoint"] == s3_endpoint
    assert SECRET not in manifest_text and KEY_ID not in manifest_text
    # parts written straight to their names: no temporary objects, no folder markers
    keys = _keys(s3, OUT_BUCKET, "run1/")
    assert {k.rsplit("/", 1)[-1] for k in keys if k.count("/") == 1} == {
        "_manifest.json",
        "_run.json",
    }
    assert all(k.startswith("run1/") for k in keys)
    parts = [k for k in keys if k.count("/") == 2]
    # the small batches' parts were merged at the end: one file per table, members deleted
    assert manifest["parts"]["merged_batches"] == summary.batches
    assert len(parts) == 3
    assert all(k.rsplit("/", 1)[-1].startswith("part-merged-") for k in parts), parts
    assert all(k.endswith(".parquet") for k in parts)


def test_resume_on_s3_redoes_only_the_lost_batch(
    s3_endpoint: str, s3: Any, s3_ray: None, headlines: list[str]
) -> None:
    ids = [f"r{i:02d}" for i in range(12)]
    _put_docs(s3, IN_BUCKET, "resume/in.parquet", ids, headlines[20:32])
    inp, out = f"s3://{IN_BUCKET}/resume/in.parquet", f"s3://{OUT_BUCKET}/resume"
    # one part per batch (no merging), so a crash can be staged by deleting one
    overrides = {"run.run_id": "s3-r1", "run.embeddings": False, "run.part_target_mb": 0}
    cfg = _cfg(s3_endpoint, **overrides)
    first = execute(cfg, inp, out)
    assert first.batches == 3 and first.skipped_batches == 0
    before, _ = _assert_exactly_once_s3(s3, s3_endpoint, OUT_BUCKET, "resume", ids)

    # a crash after two of three batches: no manifest, one documents part missing
    lost = _keys(s3, OUT_BUCKET, "resume/documents/")[1]
    s3.delete_object(Bucket=OUT_BUCKET, Key="resume/_manifest.json")
    s3.delete_object(Bucket=OUT_BUCKET, Key=lost)
    resumed = execute(cfg, inp, out)
    assert resumed.batches == 1 and resumed.skipped_batches == 2
    assert not resumed.already_complete and resumed.documents == 12

    after, manifest_text = _assert_exactly_once_s3(s3, s3_endpoint, OUT_BUCKET, "resume", ids)
    assert lost in _keys(s3, OUT_BUCKET, "resume/documents/")
    key = ["doc_id", "sent_index"]
    assert (
        after["sentences"].sort_values(key).label.tolist()
        == before["sentences"].sort_values(key).label.tolist()
    )
    manifest = json.loads(manifest_text)
    assert manifest["resumed_batches"] == 2 and manifest["counts"]["batches"] == 3
    # the two resumed batches' backends are read back from their parts on S3
    stages = registry.chain(cfg).names  # the run's chain (the always-on language included)
    assert {s: sum(c.values()) for s, c in manifest["backends"].items()} == dict.fromkeys(stages, 3)
    assert execute(cfg, inp, out).already_complete


def test_missing_input_bucket_is_a_usage_error_before_any_ray_work(
    s3_endpoint: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(docintel.actors.cluster, "ray_session", _no_ray)
    with pytest.raises(InputError) as caught:
        execute(_cfg(s3_endpoint), "s3://no-such-bucket/corpus/", f"s3://{OUT_BUCKET}/never")
    assert isinstance(caught.value, UsageError)  # exit code 2
    msg = str(caught.value)
    assert "bucket 'no-such-bucket' does not exist" in msg and "s3_endpoint" in msg
    assert SECRET not in msg
    assert _keys(s3, OUT_BUCKET, "never") == []


def test_missing_output_bucket_is_a_usage_error_before_any_ray_work(
    s3_endpoint: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put_docs(s3, IN_BUCKET, "small/in.parquet", ["x", "y"], ["One.", "Two."])
    monkeypatch.setattr(docintel.actors.cluster, "ray_session", _no_ray)
    with pytest.raises(OutputError, match="bucket 'no-out-bucket' does not exist") as caught:
        execute(_cfg(s3_endpoint), f"s3://{IN_BUCKET}/small/", "s3://no-out-bucket/run")
    assert isinstance(caught.value, UsageError)
    assert SECRET not in str(caught.value)


def test_access_denied_names_the_bucket_and_hides_the_secret(tmp_path: Path) -> None:
    """A server that checks credentials (moto with auth on) refuses the test's keys."""
    with _moto_server(tmp_path / "auth.log", INITIAL_NO_AUTH_ACTION_COUNT="0") as endpoint:
        storage = StorageConfig(s3_endpoint=endpoint, s3_attempts=1)
        with pytest.raises(InputError) as read:
            resolve_input(f"s3://{IN_BUCKET}/corpus/", storage)
        with pytest.raises(OutputError) as write:
            resolve_output(f"s3://{OUT_BUCKET}/run", storage)
    for caught, bucket in ((read, IN_BUCKET), (write, OUT_BUCKET)):
        msg = str(caught.value)
        assert "access denied; check the AWS credentials" in msg
        assert f"bucket {bucket!r}" in msg
        assert SECRET not in msg


def test_aws_endpoint_url_alone_reaches_an_s3_compatible_store(
    s3_endpoint: str, s3: Any, s3_ray: None, headlines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No [storage] s3_endpoint: AWS_ENDPOINT_URL, as every AWS SDK reads it, is enough;
    the manifest records no endpoint credentials (there are none to record)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    ids = [f"e{i}" for i in range(6)]
    _put_docs(s3, IN_BUCKET, "envcorpus/a.parquet", ids, headlines[:6])
    cfg = run_config()
    assert cfg.storage.s3_endpoint == ""
    summary = execute(cfg, f"s3://{IN_BUCKET}/envcorpus/", f"s3://{OUT_BUCKET}/envrun/")
    assert summary.documents == 6
    _, manifest = _assert_exactly_once_s3(s3, s3_endpoint, OUT_BUCKET, "envrun", ids)
    assert json.loads(manifest)["config"]["storage"]["s3_endpoint"] == ""
    assert "@" not in json.loads(manifest)["input"]["uri"]


def test_one_writer_per_s3_output_by_conditional_puts(
    s3_endpoint: str, s3: Any, s3_ray: None, headlines: list[str]
) -> None:
    """A live writer's claim (If-None-Match PUT) refuses a second run before any work; a
    stale claim of a crashed writer elsewhere is taken over (If-Match PUT)."""
    from docintel.pipeline.run.lease import LEASE_FILE, Claim, Lease, LeaseHeld

    ids = [f"l{i}" for i in range(5)]
    _put_docs(s3, IN_BUCKET, "leasecorpus/a.parquet", ids, headlines[:5])
    cfg = _cfg(s3_endpoint)
    fs, root = resolve_output(f"s3://{OUT_BUCKET}/leased", cfg.storage)
    holder = Lease(fs, root, cfg.storage, "docintel run elsewhere", ttl_s=60)
    holder.acquire()
    try:
        with pytest.raises(LeaseHeld, match="docintel run elsewhere"):
            execute(cfg, f"s3://{IN_BUCKET}/leasecorpus/", f"s3://{OUT_BUCKET}/leased/")
        assert _keys(s3, OUT_BUCKET, "leased/") == [f"leased/{LEASE_FILE}"]  # nothing else
    finally:
        holder.release()
    assert _keys(s3, OUT_BUCKET, "leased/") == []
    stale = Claim("crashed.example:77:1:x", "docintel run crashed", "2026-11-30", time.time() - 5)
    s3.put_object(Bucket=OUT_BUCKET, Key=f"leased/{LEASE_FILE}", Body=stale.encode())
    summary = execute(cfg, f"s3://{IN_BUCKET}/leasecorpus/", f"s3://{OUT_BUCKET}/leased/")
    assert summary.documents == 5
    _assert_exactly_once_s3(s3, s3_endpoint, OUT_BUCKET, "leased", ids)
    assert f"leased/{LEASE_FILE}" not in _keys(s3, OUT_BUCKET, "leased/")  # released
