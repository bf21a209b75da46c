"""Issue 30: Delta Lake output (``--format delta``), the proof that a table format is one
module plus its registry line. Real runs on a local Ray, read back with ``deltalake``:
the tables at OUTPUT/documents, sentences and errors; the batch ids in each commit's
metadata; the same command twice is a no-op (``--append`` appends); SIGKILL then resume,
every document once; the audit and search read it back; the docs' reader runs as written;
an output of another format is refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from docintel.actors.runner import execute
from docintel.pipeline.audit import run_audit
from docintel.pipeline.errors import UsageError
from docintel.pipeline.formats.warehouse import BATCHES_KEY, RUN_ID_KEY
from docintel.pipeline.search.query import search
from docintel.pipeline.search.source import SentencesSource
from tests.conftest import REPO, run_config, sigkill_after_parts
from tests.integration.test_audit import _cfg, _texts, _write
from tests.integration.test_iceberg import _corpus, exactly_once_in

DELTA = {"output.format": "delta", "run.embeddings": True}
TABLES = ("documents", "sentences", "errors")


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    from deltalake import DeltaTable

    return {t: DeltaTable(str(out / t)).to_pandas() for t in TABLES}


def _commits(out: Path, table: str, run_id: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return [h for h in DeltaTable(str(out / table)).history() if h.get(RUN_ID_KEY) == run_id]


def _exactly_once(out: Path, ids: list[str], copies: int = 1) -> dict[str, pd.DataFrame]:
    return exactly_once_in(_tables(out), ids, copies)


def _docs_snippet(heading: str) -> str:
    """The Python block under ``heading`` in README.md or a docs/ page, as written there."""
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        if heading in text:
            return text.split(heading, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    raise AssertionError(f"no page of the docs has the section {heading!r}")


@pytest.mark.usefixtures("ray_cluster")
def test_delta_contract_noop_append_and_the_docs_reader(
    tmp_path: Path, headlines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    inp, ids = _corpus(tmp_path, headlines, 12)
    out = tmp_path / "out" / "delta"  # the docs' reader opens out/delta
    first = execute(run_config(**DELTA), str(inp), str(out))
    assert first.documents == 12 and first.batches == 3 and not first.already_complete
    tables = _exactly_once(out, ids)
    docs, sents = tables["documents"], tables["sentences"]
    assert (docs.status == "ok").all() and docs.n_sentences.sum() == len(sents)
    assert sents.embedding.map(len).eq(384).all()
    # one commit group per table, its metadata naming the run and every batch it adds
    (commit,) = _commits(out, "documents", first.run_id)
    assert sorted(json.loads(commit[BATCHES_KEY])) == sorted(docs.batch_id.unique())
    manifest = json.loads((out / "_runs" / first.run_id / "_manifest.json").read_text())
    assert manifest["format"] == "delta" and manifest["counts"]["documents"] == 12
    assert manifest["delta"]["tables"]["documents"]["versions"] == [commit["version"]]
    assert not (out / "_runs" / first.run_id / "staged").exists()

    # the same command again: a no-op naming the completed run, no new version
    again = execute(run_config(**DELTA), str(inp), str(out))
    assert again.already_complete and again.run_id == first.run_id
    _exactly_once(out, ids)
    # its run id again: a no-op too; --append: a new run, every document a second time
    assert execute(run_config(**DELTA, **{"run.run_id": first.run_id}), str(inp), str(out))
    more = execute(run_config(**DELTA, **{"run.append": True}), str(inp), str(out))
    assert not more.already_complete and more.run_id != first.run_id
    _exactly_once(out, ids, copies=2)

    # the docs' reader (deltalake to pandas and DuckDB), as written there
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(_docs_snippet("#### Delta Lake output"), scope)
    assert len(scope["docs"]) == 24
    assert scope["con"].execute("select count(*) from documents").fetchone() == (24,)


@pytest.mark.usefixtures("ray_cluster")
def test_delta_sigkill_then_resume_every_document_once(
    tmp_path: Path, headlines: list[str]
) -> None:
    inp, ids = _corpus(tmp_path, headlines, 40)
    out = tmp_path / "delta"
    conf = tmp_path / "delta.toml"
    conf.write_text('[run]\npart_target_mb = 0.0\n[output]\nformat = "delta"\n')
    cmd = [sys.executable, "-m", "docintel.jobs.cli", "run", str(inp), str(out), "--config",
           str(conf), "--run-id", "crash", "--batch-size", "2", "--num-cpus", "2",
           "--no-progress"]  # fmt: skip
    # SIGKILL the driver once three documents data files exist (each commit adds one)
    sigkill_after_parts(cmd, out / "documents", 3, pattern="part-*.parquet")
    assert not (out / "_runs" / "crash" / "_manifest.json").exists()
    committed = len(_commits(out, "documents", "crash"))
    assert 2 <= committed < 20  # a data file is written before its commit

    base = {**DELTA, "run.run_id": "crash", "run.batch_size": 2, "run.part_target_mb": 0}
    summary = execute(run_config(**base), str(inp), str(out))
    assert summary.skipped_batches >= committed
    assert summary.batches + summary.skipped_batches == 20
    _exactly_once(out, ids)
    batches = [b for c in _commits(out, "documents", "crash") for b in json.loads(c[BATCHES_KEY])]
    assert len(batches) == len(set(batches)) == 20


@pytest.mark.usefixtures("ray_cluster")
def test_delta_read_back_by_the_audit_and_search(tmp_path: Path, headlines: list[str]) -> None:
    src, out = tmp_path / "source", tmp_path / "audit"
    a = [f"a{i}" for i in range(6)]
    _write(src / "a.parquet", a, _texts(headlines, 0, 6))
    night = run_audit(_cfg(**{"output.format": "delta", "run.embeddings": True}), str(src),
                      str(out), "2026-02-01", execute)  # fmt: skip
    assert night.run_id == "audit-2026-02-01" and night.new == 6 and night.documents == 6
    report = json.loads((out / "run_date=2026-02-01" / "report.json").read_text())
    assert report["counts"]["documents"] == 6
    again = run_audit(_cfg(**{"output.format": "delta", "run.embeddings": True}), str(src),
                      str(out), "2026-02-01", execute)  # fmt: skip
    assert again.already_complete
    assert not (out / "run_date=2026-02-01" / "documents").exists()  # rows are in the tables
    assert sorted(_tables(out)["documents"]["doc_id"]) == a
    # search reads the warehouse's latest run through the format registry
    source = SentencesSource.open(str(out))
    assert source.table_format == "delta" and source.manifest["run_id"] == "audit-2026-02-01"
    res = search(str(out), ["shares fall"], top=3)
    assert len(res.hits[0]) == 3 and {h["doc_id"] for h in res.hits[0]} <= set(a)


def test_an_output_of_another_format_is_refused(tmp_path: Path) -> None:
    from docintel.pipeline.output.protocol import RunOutput
    from tests.unit.test_edges_output import _complete, _docs, _plan

    inp = _docs(tmp_path / "in.parquet")
    parquet, delta = tmp_path / "pq", tmp_path / "delta"
    _complete(_plan(inp), parquet)
    with pytest.raises(UsageError, match=r"Parquet output.*--format parquet"):
        RunOutput.open(_plan(inp, **{"output.format": "delta"}), str(parquet), "r2")
    with RunOutput.open(_plan(inp, **{"output.format": "delta"}), str(delta), "r1") as o:
        assert not o.complete and (delta / "documents" / "_delta_log").is_dir()
    for other in ("parquet", "iceberg"):
        with pytest.raises(UsageError, match=r"Delta Lake output.*--format delta"):
            RunOutput.open(_plan(inp, **{"output.format": other}), str(delta), "r3")
