"""Issue 31 item 2: a 0-row input exits 0 with the contract's three tables, empty and
readable (pandas, DuckDB, the format's own reader), in every table format, and says
"0 documents" plainly. Real runs on a local Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from docintel.actors.runner import execute
from docintel.pipeline.schema import EMBEDDING
from tests.conftest import REPO, run_config

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _empty_input(path: Path) -> Path:
    schema = pa.schema([("doc_id", pa.string()), ("text", pa.string())])
    pq.write_table(schema.empty_table(), path)
    return path


def test_an_empty_parquet_input_writes_empty_tables(tmp_path: Path) -> None:
    inp = _empty_input(tmp_path / "empty.parquet")
    out = tmp_path / "out"
    summary = execute(run_config(**{"run.embeddings": True}), str(inp), str(out))
    assert summary.documents == 0 and not summary.partial
    assert any("0 documents" in w for w in summary.warnings)
    docs = pd.read_parquet(out / "documents")
    sents = pq.read_table(out / "sentences")
    errs = pd.read_parquet(out / "errors")
    assert len(docs) == len(sents) == len(errs) == 0
    assert {"doc_id", "status", "n_sentences", "top_label", "top_score"} <= set(docs.columns)
    assert sents.schema.field(EMBEDDING).type == pa.list_(pa.float32(), 384)
    assert {"doc_id", "stage", "error_type", "message"} <= set(errs.columns)
    con = duckdb.connect()
    n = con.execute(f"select count(*) from read_parquet('{out}/documents/*.parquet')").fetchone()
    assert n == (0,)
    again = execute(run_config(**{"run.embeddings": True}), str(inp), str(out))
    assert again.already_complete and again.documents == 0


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_an_empty_input_leaves_empty_warehouse_tables(tmp_path: Path, fmt: str) -> None:
    inp = _empty_input(tmp_path / "empty.parquet")
    out = tmp_path / "wh"
    summary = execute(run_config(**{"output.format": fmt}), str(inp), str(out))
    assert summary.documents == 0
    if fmt == "delta":
        from deltalake import DeltaTable

        counts = [DeltaTable(str(out / t)).to_pyarrow_table().num_rows for t in TABLES]
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        cat = SqlCatalog("docintel", uri=f"sqlite:///{out}/_catalog.db", warehouse=str(out))
        counts = [cat.load_table(f"docintel.{t}").scan().to_arrow().num_rows for t in TABLES]
    assert counts == [0, 0, 0]


def test_the_cli_says_0_documents(tmp_path: Path) -> None:
    inp = _empty_input(tmp_path / "empty.parquet")
    done = subprocess.run(
        [sys.executable, "-m", "docintel.jobs.cli", "run", str(inp), str(tmp_path / "o"),
         "--no-progress", "--num-cpus", "2"],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "0 documents" in done.stdout + done.stderr
    assert len(pd.read_parquet(tmp_path / "o" / "sentences")) == 0


TABLES = ("documents", "sentences", "errors")
