"""Issue 21: Iceberg output (``--format iceberg``) on the embedded SQL catalog, read back
with pyiceberg: the output contract, appends and no-ops by run id, SIGKILL then resume,
a commit whose answer was lost, and the refusals before any work (a changed plan, an
incompatible table, credentials in the catalog URI, the wrong kind of OUTPUT)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from docintel.actors.runner import execute
from docintel.pipeline.config import load_config
from docintel.pipeline.errors import ConfigError, RunFailed, UsageError
from docintel.pipeline.exitcodes import ExitCode, exit_code
from docintel.pipeline.formats.iceberg import IcebergSink
from docintel.pipeline.formats.warehouse import BATCHES_KEY, RUN_ID_KEY
from tests.conftest import REPO, run_config, sigkill_after_parts, write_docs

ICEBERG = {"output.format": "iceberg", "run.embeddings": True}
DIM = 384  # the MiniLM encoder's embedding size


def _catalog(out: Path) -> Any:
    """The embedded catalog, opened as a reader would (docs/output-formats.md)."""
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("docintel", uri=f"sqlite:///{out}/_catalog.db", warehouse=f"file://{out}")


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    cat = _catalog(out)
    return {
        t: cat.load_table(f"docintel.{t}").scan().to_pandas()
        for t in ("documents", "sentences", "errors")
    }


def _run_snapshots(out: Path, table: str, run_id: str) -> list[dict[str, str]]:
    t = _catalog(out).load_table(f"docintel.{table}")
    props = [s.summary.additional_properties for s in t.metadata.snapshots]
    return [p for p in props if p.get(RUN_ID_KEY) == run_id]


def _exactly_once(out: Path, ids: list[str], copies: int = 1) -> dict[str, pd.DataFrame]:
    """Every input document ``copies`` times (once per run), no sentence twice per run."""
    return exactly_once_in(_tables(out), ids, copies)


def exactly_once_in(
    tables: dict[str, pd.DataFrame], ids: list[str], copies: int = 1
) -> dict[str, pd.DataFrame]:
    """The check on a warehouse's tables as any reader loads them (Iceberg, Delta)."""
    assert sorted(tables["documents"]["doc_id"]) == sorted(ids * copies)
    per_sentence = tables["sentences"].groupby(["doc_id", "sent_index"]).size()
    assert (per_sentence == copies).all()
    assert set(tables["errors"]["doc_id"]) <= set(ids)
    return tables


def _corpus(tmp_path: Path, headlines: list[str], n: int) -> tuple[Path, list[str]]:
    ids = [f"d{i:03d}" for i in range(n)]
    texts = [" ".join(h.rstrip(".") + "." for h in headlines[i * 2 : i * 2 + 2]) for i in range(n)]
    return write_docs(tmp_path / "in.parquet", ids, texts, row_group_size=4), ids


@pytest.mark.usefixtures("ray_cluster")
def test_iceberg_contract_append_and_noop(
    tmp_path: Path, headlines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    inp, ids = _corpus(tmp_path, headlines, 12)
    out = tmp_path / "out" / "wh"  # the docs' reader opens out/wh
    first = execute(run_config(**ICEBERG, **{"run.run_id": "r1"}), str(inp), str(out))
    assert first.documents == 12 and first.batches == 3
    tables = _exactly_once(out, ids)
    docs, sents, errs = tables["documents"], tables["sentences"], tables["errors"]
    assert (docs.status == "ok").all() and docs.n_sentences.sum() == len(sents) == first.sentences
    assert set(sents.doc_id) == set(ids) and errs.empty
    assert sents.embedding.map(len).eq(DIM).all()  # Iceberg's list<float>, every row 384
    emb = pa.array(sents.embedding.tolist(), pa.list_(pa.float32())).cast(
        pa.list_(pa.float32(), DIM)
    )
    assert pa.types.is_fixed_size_list(emb.type)
    cat = _catalog(out)
    err_schema = cat.load_table("docintel.errors").schema().as_arrow()
    assert err_schema.names == ["doc_id", "stage", "error_type", "message", "batch_id"]
    # one commit group (3 small batches) per table, its summary naming run, models, batches
    (snap,) = _run_snapshots(out, "documents", "r1")
    assert sorted(json.loads(snap[BATCHES_KEY])) == sorted(docs.batch_id.unique())
    assert json.loads(snap["docintel.models"])["embed"].startswith("encoder@")
    manifest = json.loads((out / "_runs" / "r1" / "_manifest.json").read_text())
    assert manifest["counts"]["documents"] == 12 and manifest["format"] == "iceberg"
    ice = manifest["iceberg"]["tables"]["documents"]
    assert ice["identifier"] == "docintel.documents"
    assert ice["snapshot_ids"] == [
        cat.load_table("docintel.documents").current_snapshot().snapshot_id
    ]
    assert not (out / "_runs" / "r1" / "staged").exists()  # nothing left behind
    assert not (out / "_manifest.json").exists()

    # the docs' reader (pyiceberg to Arrow, pandas and DuckDB), as written there
    readme = (REPO / "docs" / "output-formats.md").read_text()
    snippet = readme.split("#### Iceberg output", 1)[1].split("```python\n", 1)[1]
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(snippet.split("```", 1)[0], scope)  # the docs' own code
    assert scope["docs"].num_rows == 12 and set(scope["sents"].label) <= {"Bearish"}
    assert scope["con"].execute("select count(*) from documents").fetchone() == (12,)

    # a new run id appends; the completed one is a no-op
    again = execute(run_config(**ICEBERG, **{"run.run_id": "r2"}), str(inp), str(out))
    assert again.documents == 12 and not again.already_complete
    _exactly_once(out, ids, copies=2)
    n_snaps = len(cat.load_table("docintel.documents").metadata.snapshots)
    done = execute(run_config(**ICEBERG, **{"run.run_id": "r1"}), str(inp), str(out))
    assert done.already_complete and done.documents == 12
    assert len(_catalog(out).load_table("docintel.documents").metadata.snapshots) == n_snaps


@pytest.mark.usefixtures("ray_cluster")
def test_a_commit_whose_answer_was_lost_is_not_repeated(
    tmp_path: Path, headlines: list[str]
) -> None:
    inp, ids = _corpus(tmp_path, headlines, 12)
    out = tmp_path / "wh"
    # every batch its own group (3 groups x 2 tables with rows); the 4th append (group 2's
    # documents) lands, then raises: the retry finds it by its batch ids
    cfg = run_config(
        **ICEBERG,
        **{"run.run_id": "lost", "run.part_target_mb": 0, "faults.sink_commit_lost": 4},
    )
    summary = execute(cfg, str(inp), str(out))
    assert summary.documents == 12
    _exactly_once(out, ids)
    manifest = json.loads((out / "_runs" / "lost" / "_manifest.json").read_text())
    assert manifest["parts"]["lost_commit_answers"] == 1
    for table in ("documents", "sentences"):
        snaps = _run_snapshots(out, table, "lost")
        batches = [b for s in snaps for b in json.loads(s[BATCHES_KEY])]
        assert len(snaps) == 3 and sorted(batches) == sorted(set(batches))


@pytest.mark.usefixtures("ray_cluster")
def test_sigkill_then_resume_every_document_once(tmp_path: Path, headlines: list[str]) -> None:
    inp, ids = _corpus(tmp_path, headlines, 40)
    out = tmp_path / "wh"
    conf = tmp_path / "iceberg.toml"
    conf.write_text('[run]\npart_target_mb = 0.0\n[output]\nformat = "iceberg"\n')
    cmd = [sys.executable, "-m", "docintel.jobs.cli", "run", str(inp), str(out), "--config",
           str(conf), "--run-id", "crash", "--batch-size", "2", "--num-cpus", "2",
           "--no-progress"]  # fmt: skip
    # SIGKILL the driver (and its embedded Ray) once three documents data files exist
    sigkill_after_parts(cmd, out / "docintel" / "documents" / "data", 3, pattern="*.parquet")
    assert not (out / "_runs" / "crash" / "_manifest.json").exists()
    committed = len(_run_snapshots(out, "documents", "crash"))
    # a data file is written before its commit: the kill may land between the two
    assert 2 <= committed < 20

    base = {**ICEBERG, "run.run_id": "crash", "run.batch_size": 2, "run.part_target_mb": 0}
    with pytest.raises(UsageError) as caught:  # a changed plan: refused, nothing done
        execute(run_config(**{**base, "run.batch_size": 4}), str(inp), str(out))
    assert exit_code(caught.value) == ExitCode.USAGE
    assert "batch_size 2" in str(caught.value) and "batch_size 4" in str(caught.value)
    assert len(_run_snapshots(out, "documents", "crash")) == committed

    summary = execute(run_config(**base), str(inp), str(out))
    assert summary.skipped_batches >= committed  # staged, complete batches count too
    assert summary.batches + summary.skipped_batches == 20
    _exactly_once(out, ids)
    snaps = _run_snapshots(out, "documents", "crash")
    batches = [b for s in snaps for b in json.loads(s[BATCHES_KEY])]
    assert len(batches) == len(set(batches)) == 20


def test_an_incompatible_table_is_refused_before_any_work(tmp_path: Path) -> None:
    from docintel.pipeline.output.protocol import RunOutput
    from tests.unit.test_edges_output import _docs, _plan

    out = tmp_path / "wh"
    out.mkdir()
    cat = _catalog(out)
    cat.create_namespace("docintel")
    cat.create_table("docintel.documents", schema=pa.schema([pa.field("doc_id", pa.int64())]))
    p = _plan(_docs(tmp_path / "in.parquet"), **{"output.format": "iceberg"})
    with pytest.raises(UsageError) as caught:
        RunOutput.open(p, str(out), "r1")
    msg = str(caught.value)
    assert exit_code(caught.value) == ExitCode.USAGE
    assert "docintel.documents" in msg and "'doc_id'" in msg and "_catalog.db" in msg
    assert not (out / "_runs").exists()  # nothing done


def test_wrong_kind_of_output_is_refused(tmp_path: Path) -> None:
    from docintel.pipeline.output.protocol import RunOutput
    from tests.unit.test_edges_output import _complete, _docs, _plan

    inp = _docs(tmp_path / "in.parquet")
    parquet, ice = tmp_path / "pq", tmp_path / "wh"
    _complete(_plan(inp), parquet)
    with pytest.raises(UsageError, match="Parquet output"):
        RunOutput.open(_plan(inp, **{"output.format": "iceberg"}), str(parquet), "r2")
    p = _plan(inp, **{"output.format": "iceberg"})
    with RunOutput.open(p, str(ice), "r1") as o:
        assert not o.complete  # a run started in the warehouse (its state written)
    with pytest.raises(UsageError, match="Iceberg warehouse"):
        RunOutput.open(_plan(inp), str(ice), "r3")
    # an s3:// warehouse needs a configured catalog (SQLite cannot live on S3)
    s3 = pafs.S3FileSystem(anonymous=True, region="us-east-1")
    sink = IcebergSink(s3, "bucket/wh", p.cfg, ("a",))
    with pytest.raises(UsageError, match="needs a catalog"):
        sink.open()
    # a configured catalog that cannot be reached: exit 2 before any work, naming it
    cfg = load_config(
        None, {"output.format": "iceberg", "output.catalog_uri": "http://127.0.0.1:9"}
    )
    down = IcebergSink(pafs.LocalFileSystem(), str(tmp_path / "w2"), cfg, ("a",))
    with pytest.raises(UsageError, match=r"rest catalog http://127\.0\.0\.1:9 cannot be used"):
        down.open()
    assert not (tmp_path / "w2").exists()


def test_credentials_in_the_catalog_are_refused(tmp_path: Path) -> None:
    secret = "s3cr3t-value"
    for key, value in (
        ("output.catalog_uri", f"https://user:{secret}@catalog.example:8181/api"),
        ("output.catalog_properties", {"token": secret}),
        ("output.catalog_properties", {"s3.secret-access-key": secret}),
    ):
        with pytest.raises(ConfigError) as caught:
            load_config(None, {key: value})
        assert secret not in str(caught.value) and exit_code(caught.value) == ExitCode.USAGE
    conf = tmp_path / "c.toml"
    conf.write_text(f'[output]\nformat = "iceberg"\ncatalog_uri = "http://k:{secret}@h:8181"\n')
    done = subprocess.run(
        [sys.executable, "-m", "docintel.jobs.cli", "run", "in.parquet", str(tmp_path / "o"),
         "--config", str(conf)],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == ExitCode.USAGE
    assert secret not in done.stdout + done.stderr and "catalog" in done.stdout + done.stderr


@pytest.mark.usefixtures("ray_cluster")
def test_a_catalog_lost_mid_run_fails_the_run_resumable_with_nothing_lost(
    tmp_path: Path, headlines: list[str]
) -> None:
    """The catalog goes away after two groups: the appends are retried, then the run fails
    (exit 1, resumable) with the committed groups intact; the resume commits the rest, every
    document exactly once."""
    inp, ids = _corpus(tmp_path, headlines, 12)
    out = tmp_path / "wh"
    base = {**ICEBERG, "run.run_id": "down", "run.part_target_mb": 0}
    # every batch its own group, two tables with rows: attempts 1-4 land, then no catalog
    with pytest.raises(RunFailed) as caught:
        execute(run_config(**base, **{"faults.sink_catalog_down": 5}), str(inp), str(out))
    assert exit_code(caught.value) == ExitCode.FAILED
    assert "--run-id down" in str(caught.value)
    committed = _run_snapshots(out, "documents", "down")
    assert len(committed) == 2 and not (out / "_runs" / "down" / "_manifest.json").exists()
    summary = execute(run_config(**base), str(inp), str(out))
    assert summary.batches + summary.skipped_batches == 3 and summary.skipped_batches >= 2
    _exactly_once(out, ids)
    assert len(_run_snapshots(out, "documents", "down")) == 3


@pytest.mark.usefixtures("ray_cluster")
def test_the_same_command_twice_is_a_noop_and_append_appends(
    tmp_path: Path, headlines: list[str]
) -> None:
    """Issue 31 item 1: the same `docintel run IN WAREHOUSE --format iceberg` twice (no run
    id) used to leave every document twice; now the second names the completed run."""
    inp, ids = _corpus(tmp_path, headlines, 8)
    out = tmp_path / "wh"
    first = execute(run_config(**ICEBERG), str(inp), str(out))
    again = execute(run_config(**ICEBERG), str(inp), str(out))
    assert again.already_complete and again.run_id == first.run_id and again.documents == 8
    _exactly_once(out, ids)
    more = execute(run_config(**ICEBERG, **{"run.append": True}), str(inp), str(out))
    assert not more.already_complete and more.run_id != first.run_id
    _exactly_once(out, ids, copies=2)
