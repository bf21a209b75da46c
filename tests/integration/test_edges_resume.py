"""Issue 20, items 1 and 2 end to end: a crashed run resumed with another batch size is
refused before any work and the original settings still finish it exactly once (local Ray);
input identity on S3 (moto): another input, or the same key put again, into a completed
output is refused, the untouched input is the no-op."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from docintel.actors.runner import execute
from docintel.pipeline.errors import UsageError
from docintel.pipeline.output.protocol import RunOutput
from tests.conftest import assert_exactly_once, run_config, write_docs
from tests.integration.test_s3 import (  # moto's S3 server on loopback and its helpers
    IN_BUCKET,
    OUT_BUCKET,
    _put_docs,
    s3,  # noqa: F401 (fixtures, requested by name)
    s3_endpoint,  # noqa: F401
)
from tests.unit.test_edges_output import _complete, _plan


@pytest.mark.usefixtures("ray_cluster")
def test_a_resume_with_another_batch_size_is_refused_and_the_original_finishes(
    tmp_path: Path, headlines: list[str]
) -> None:
    ids = [f"d{i:02d}" for i in range(24)]
    inp = write_docs(tmp_path / "in.parquet", ids, headlines[:24], row_group_size=8)
    out = tmp_path / "out"
    # one part per batch (no compaction), so a crash can be staged by deleting parts
    base = {"run.run_id": "r1", "run.embeddings": False, "run.part_target_mb": 0}
    first = execute(run_config(**base), str(inp), str(out))
    assert first.batches == 6
    (out / "_manifest.json").unlink()  # a crash after 4 of 6 batches
    for p in sorted((out / "documents").iterdir())[:2]:
        p.unlink()
    parts = sorted(p.name for p in out.rglob("*.parquet"))

    for other, named in (
        ({"run.batch_size": 8}, ("batch_size 4", "batch_size 8")),
        ({"run.embeddings": True}, ("embeddings false", "embeddings true")),
    ):
        with pytest.raises(UsageError) as caught:
            execute(run_config(**{**base, **other}), str(inp), str(out))
        assert all(n in str(caught.value) for n in named), caught.value
        assert sorted(p.name for p in out.rglob("*.parquet")) == parts  # nothing done

    resumed = execute(run_config(**base), str(inp), str(out))
    assert resumed.batches == 2 and resumed.skipped_batches == 4
    assert_exactly_once(out, ids)
    other = write_docs(tmp_path / "other.parquet", ["x1", "x2"], headlines[30:32])
    with pytest.raises(UsageError, match="a different input"):
        execute(run_config(**base), str(other), str(out))
    assert execute(run_config(**base), str(inp), str(out)).already_complete


def test_input_identity_on_s3(request: pytest.FixtureRequest, headlines: list[str]) -> None:
    """A prefix of two objects (one listing) and a single object (one HEAD): another input
    or the same key put again (new LastModified) is refused; the untouched input is the
    no-op. No Ray: the output is opened and committed as a run would."""
    client: Any = request.getfixturevalue("s3")
    storage = {"storage.s3_endpoint": request.getfixturevalue("s3_endpoint")}
    ids = [f"e{i}" for i in range(6)]
    _put_docs(client, IN_BUCKET, "ident/many/a.parquet", ids[:3], headlines[:3])
    _put_docs(client, IN_BUCKET, "ident/many/b.parquet", ids[3:], headlines[3:6])
    _put_docs(client, IN_BUCKET, "ident/one.parquet", ids[:3], headlines[:3])
    many, one = f"s3://{IN_BUCKET}/ident/many/", f"s3://{IN_BUCKET}/ident/one.parquet"
    for given in (many, one):
        out = f"s3://{OUT_BUCKET}/ident/{'many' if given == many else 'one'}"
        p = _plan(given, **storage)
        assert all(isinstance(f, int) for f in _mtimes(p))  # LastModified, from S3
        _complete(p, out)
        with RunOutput.open(_plan(given, **storage), out, "r1") as again:
            assert again.complete
        other = one if given == many else many
        with pytest.raises(UsageError, match="a different input") as caught:
            RunOutput.open(_plan(other, **storage), out, "r1")
        assert given in str(caught.value) and other in str(caught.value)

    time.sleep(1.1)  # LastModified has whole seconds: the same bytes, put again later
    _put_docs(client, IN_BUCKET, "ident/one.parquet", ids[:3], headlines[:3])
    with pytest.raises(UsageError, match="changed: mtime_ns"):
        RunOutput.open(_plan(one, **storage), f"s3://{OUT_BUCKET}/ident/one", "r1")


def _mtimes(p: Any) -> list[Any]:
    from docintel.pipeline.output.protocol import input_identity

    return [f["mtime_ns"] for f in input_identity(p.source_fs, p.files)]
