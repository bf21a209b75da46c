"""Issue 31, trust round two, the warehouse and the manifest: properties that name code
(refused before pyiceberg imports anything), run ids that would leave OUTPUT, an OUTPUT
path holding "?", "#" or "%", secrets in the manifest's config and catalog URIs. No Ray:
real pyiceberg catalogs on SQLite, real manifests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from docintel.pipeline.config import Config, load_config
from docintel.pipeline.errors import ConfigError, UsageError
from docintel.pipeline.exitcodes import ExitCode, exit_code
from docintel.pipeline.formats.iceberg import IcebergSink
from docintel.pipeline.output.protocol import RECORDED_SECTIONS, REDACTED, recorded_config
from docintel.pipeline.search.source import SentencesSource
from tests.conftest import REPO
from tests.unit.test_edges_output import _complete, _docs, _plan

FS = pafs.LocalFileSystem()


def _evil_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module that, if imported, leaves a marker file: what a warehouse must not run."""
    marker = tmp_path / "IMPORTED"
    pkg = tmp_path / "evilpkg"
    pkg.mkdir()
    (pkg / "evil_io.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "class EvilIO:\n    def __init__(self, properties):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.setenv("PYTHONPATH", str(pkg))
    return marker


def _poisoned_warehouse(out: Path, table: str, props: dict[str, str]) -> None:
    """An embedded-catalog warehouse whose ``table`` carries ``props`` in its metadata, as
    whoever can write the warehouse's files would leave them (pyiceberg never loads it)."""
    from pyiceberg.catalog.sql import SqlCatalog

    out.mkdir(parents=True)
    cat = SqlCatalog("docintel", uri=f"sqlite:///{out}/_catalog.db", warehouse=f"file://{out}")
    cat.create_namespace("docintel")
    t = cat.create_table(f"docintel.{table}", schema=pa.schema([pa.field("doc_id", pa.string())]))
    meta = Path(t.metadata_location.removeprefix("file://"))
    doc = json.loads(meta.read_text())
    doc["properties"].update(props)
    meta.write_text(json.dumps(doc))
    (out / "_runs" / "r1").mkdir(parents=True)  # a committed run, as search finds one
    (out / "_runs" / "r1" / "_manifest.json").write_text(json.dumps({"run_id": "r1"}))


def test_a_table_property_naming_code_is_refused_before_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "wh"
    _poisoned_warehouse(out, "sentences", {"py-io-impl": "evil_io.EvilIO"})
    marker = _evil_module(tmp_path, monkeypatch)
    cfg = load_config(None, {"output.format": "iceberg"})
    # the run's and the audit's path: the sink opens the warehouse, checking its tables
    with pytest.raises(UsageError, match="py-io-impl") as caught:
        IcebergSink(FS, str(out), cfg, ("a",)).open()
    assert exit_code(caught.value) == ExitCode.USAGE
    # search's path: a committed run's rows
    source = SentencesSource.open(str(out), cfg=cfg)
    with pytest.raises(UsageError, match="py-io-impl"):
        list(source.tables.batches("sentences", ["doc_id"]))
    # the CLI (index reads every sentence): exit 2 with a message, no traceback
    done = subprocess.run(
        [sys.executable, "-m", "docintel.jobs.cli", "index", str(out)],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == ExitCode.USAGE, done.stderr[-2000:]
    assert "py-io-impl" in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists()  # the warehouse's code never ran


def test_catalog_properties_naming_code_or_secrets_are_refused(tmp_path: Path) -> None:
    for key in ("py-io-impl", "write.py-location-provider.impl", "py-catalog-impl"):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, {"output.catalog_properties": {key: "os.system"}})
    secret = "s3cr3t-v4lue"
    for key in ("header.Authorization", "adls.account-key", "adls.connection-string"):
        with pytest.raises(ConfigError) as caught:
            load_config(None, {"output.catalog_properties": {key: secret}})
        msg = str(caught.value)
        assert key in msg and "PYICEBERG_CATALOG__DOCINTEL__" in msg and secret not in msg
    # a token in the catalog URI's query string or fragment: refused, never repeated
    for uri in (f"https://cat.example/api?token={secret}", f"https://cat.example/api#{secret}"):
        with pytest.raises(ConfigError) as caught:
            load_config(None, {"output.catalog_uri": uri})
        assert secret not in str(caught.value) and exit_code(caught.value) == ExitCode.USAGE


def test_run_ids_cannot_leave_output(tmp_path: Path) -> None:
    for bad in ("../../x", "a/b", "..", ".hidden", "x" * 129, "a b"):
        with pytest.raises(ConfigError, match="run id"):
            load_config(None, {"run.run_id": bad})
    for good in ("r1", "audit-2026-02-01", "20261204-124129-978562", "A.b_c-1"):
        assert load_config(None, {"run.run_id": good}).run.run_id == good
    inp = tmp_path / "in.parquet"
    _docs(inp)
    done = subprocess.run(
        [sys.executable, "-m", "docintel.jobs.cli", "run", str(inp), str(tmp_path / "o" / "wh"),
         "--format", "iceberg", "--run-id", "../../escaped"],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == ExitCode.USAGE and "run id" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]  # nothing written


def test_an_output_path_with_url_characters_keeps_the_catalog_inside(tmp_path: Path) -> None:
    inp = _docs(tmp_path / "in.parquet")
    out = tmp_path / "odd" / "wh?x=1#y%2F"
    p = _plan(inp, **{"output.format": "iceberg"})
    _complete(p, out)
    assert (out / "_catalog.db").is_file()
    assert (out / "docintel" / "documents" / "metadata").is_dir()
    assert sorted(x.name for x in (tmp_path / "odd").iterdir()) == ["wh?x=1#y%2F"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["in.parquet", "odd"]


def test_the_manifest_records_an_allow_listed_config(tmp_path: Path) -> None:
    cfg = Config.model_validate(
        {
            "stages": {"mine": {"api_key": "k-123", "db_password": "p-456", "threshold": 0.5}},
            "output": {"catalog_properties": {"s3.region": "eu-west-1", "adls.sas": "t-789"}},
        }
    )
    rec = recorded_config(cfg)
    assert rec["stages"]["mine"] == {"api_key": REDACTED, "db_password": REDACTED, "threshold": 0.5}
    assert rec["output"]["catalog_properties"] == {"s3.region": "eu-west-1", "adls.sas": REDACTED}
    # every section of the config is either recorded or deliberately filtered: a new section
    # must be added to the allow-list by hand (nothing reaches a manifest by default)
    assert set(Config.model_fields) == {*RECORDED_SECTIONS, "output", "stages"}
    # a real manifest written by a run holds no value of a secret-named property
    inp = _docs(tmp_path / "in.parquet")
    p = _plan(inp, **{"output.catalog_properties": {"adls.sas": "t-789"}})
    _complete(p, tmp_path / "out")
    text = (tmp_path / "out" / "_manifest.json").read_text()
    assert "t-789" not in text and json.loads(text)["config"]["output"]["format"] == "parquet"
