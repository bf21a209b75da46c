"""The `docintel` command as a user runs it: subprocesses, exit codes, messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, VALID_CSV, assert_exactly_once, write_docs

DOCINTEL = [sys.executable, "-m", "docintel.jobs.cli"]


def docintel(
    *args: str | Path, timeout: float = 600, **env_extra: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", **env_extra}
    return subprocess.run(
        [*DOCINTEL, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
        check=False,
    )


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_docs(
        tmp_path / "docs.parquet",
        ["a", "b", "c"],
        ["Profits fell sharply. Guidance was cut.", "Shares jumped 10%.", ""],
    )


def test_help_explains_every_command() -> None:
    top = docintel("--help")
    assert top.returncode == 0
    for cmd in (
        "run",
        "train",
        "evaluate",
        "ingest",
        "quantize",
        "audit",
        "submit",
        "status",
        "logs",
    ):
        assert cmd in top.stdout
        sub = docintel(cmd, "--help")
        assert sub.returncode == 0, sub.stderr
        assert "Example" in sub.stdout, f"`docintel {cmd} --help` shows no example"
    run_help = docintel("run", "--help").stdout
    for opt in (
        "--config",
        "--id-column",
        "--text-column",
        "--run-id",
        "--batch-size",
        "--embeddings",
        "--no-embeddings",
        "--spill",
        "--gpus",
    ):
        assert opt in run_help


def test_python_m_jobs_cli_has_every_command() -> None:
    """`python -m docintel.jobs.cli` must see the commands that register from their own modules."""
    r = subprocess.run(
        [sys.executable, "-m", "docintel.jobs.cli", "audit", "--help"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "run_date" in r.stdout


def test_error_messages_keep_config_section_names(tmp_path: Path, corpus: Path) -> None:
    """Messages name config keys as `[sentencize] spacy_model`; rich must not eat them as
    markup."""
    cfg = tmp_path / "missing-spacy.toml"
    cfg.write_text('[sentencize]\nspacy_model = "xx_no_such_pipeline"\n')
    r = docintel("run", corpus, tmp_path / "out", "--config", cfg)
    assert r.returncode == 2, r.stderr
    assert '[sentencize] spacy_model = "blank:en"' in r.stderr


def test_missing_text_column_exits_2_naming_columns(tmp_path: Path, corpus: Path) -> None:
    r = docintel("run", corpus, tmp_path / "out", "--text-column", "body")
    assert r.returncode == 2
    assert "'body'" in r.stderr and "doc_id, text" in r.stderr and "docs.parquet" in r.stderr
    assert not (tmp_path / "out" / "documents").exists()  # no work was started


def test_missing_id_column_exits_2(tmp_path: Path, corpus: Path) -> None:
    r = docintel("run", corpus, tmp_path / "out", "--id-column", "uuid")
    assert r.returncode == 2 and "'uuid'" in r.stderr and "--id-column" in r.stderr


def test_duplicate_ids_exit_2_before_work(tmp_path: Path) -> None:
    path = write_docs(tmp_path / "dup.parquet", ["x", "y", "x"], ["One.", "Two.", "Three."])
    r = docintel("run", path, tmp_path / "out")
    assert r.returncode == 2
    assert "'x' x2" in r.stderr and "more than once" in r.stderr
    assert not (tmp_path / "out").exists()


def test_non_parquet_file_alone_exits_2_naming_it(tmp_path: Path) -> None:
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"this is not parquet at all")
    r = docintel("run", broken, tmp_path / "out")
    assert r.returncode == 2 and "broken.parquet" in r.stderr and "not a readable" in r.stderr


def test_non_parquet_file_in_a_folder_is_skipped_and_the_run_is_partial(
    tmp_path: Path, corpus: Path
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "good.parquet").write_bytes(corpus.read_bytes())
    (folder / "broken.parquet").write_bytes(b"this is not parquet at all")
    out = tmp_path / "out"
    r = docintel("run", folder, out, "--num-cpus", "2")
    assert r.returncode == 3, r.stderr[-3000:]
    assert "broken.parquet" in r.stderr and "partial run" in r.stderr
    assert_exactly_once(out, ["a", "b", "c"])  # the good file was processed in full
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["partial"] is True
    assert [s["uri"] for s in manifest["skipped_files"]] == [str(folder / "broken.parquet")]


def test_missing_input_exits_2(tmp_path: Path) -> None:
    r = docintel("run", tmp_path / "nope.parquet", tmp_path / "out")
    assert r.returncode == 2 and "nope.parquet" in r.stderr and "does not exist" in r.stderr


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('[embed]\nmodel_path = "/no/such/encoder"\n', "/no/such/encoder"),
        ('[classify]\nmodel_dir = "/no/such/classifier"\n', "/no/such/classifier"),
        ('[sentencize]\nspacy_model = "xx_no_such_pipeline"\n', "xx_no_such_pipeline"),
        ("[run]\nbatch_size = 0\n", "run.batch_size"),
        ("[run]\nbatchsize = 10\n", "batchsize"),
        ("[run\n", "not valid TOML"),
    ],
)
def test_bad_config_or_model_exits_2(
    tmp_path: Path, corpus: Path, toml: str, expected: str
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    r = docintel("run", corpus, tmp_path / "out", "--config", cfg)
    assert r.returncode == 2, r.stderr
    assert expected in r.stderr


def test_incompatible_classifier_exits_2(tmp_path: Path, corpus: Path) -> None:
    clf = tmp_path / "clf"
    clf.mkdir()
    for f in ("model.keras", "labels.json"):
        (clf / f).write_bytes((REPO / "models" / "finsent" / f).read_bytes())
    (clf / "training.json").write_text(json.dumps({"embedding_dim": 768, "embedder": "x"}))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[classify]\nmodel_dir = "{clf}"\n')
    r = docintel("run", corpus, tmp_path / "out", "--config", cfg)
    assert r.returncode == 2 and "768-d" in r.stderr and "384-d" in r.stderr


def test_run_then_rerun_is_a_noop(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    r = docintel("run", corpus, out, "--run-id", "cli1", "--num-cpus", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "docintel run cli1" in r.stdout and "documents" in r.stdout
    tables = assert_exactly_once(out, ["a", "b", "c"])
    assert tables["documents"].set_index("doc_id").loc["c", "n_sentences"] == 0
    again = docintel("run", corpus, out, "--run-id", "cli1")
    assert again.returncode == 0 and "already complete" in again.stdout


def test_ingest_folder_of_text_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "q3").mkdir(parents=True)
    (src / "q3" / "report.txt").write_text("Revenue rose. Costs fell.")
    (src / "notes.md").write_text("# Notes\n\nMargins were stable.")
    (src / "latin1.txt").write_bytes("Caf\xe9 sales dipped.".encode("latin-1"))
    (src / "skip.csv").write_text("not,taken")
    out = tmp_path / "docs.parquet"
    r = docintel("ingest", src, out)
    assert r.returncode == 0, r.stderr
    t = pq.read_table(out).to_pydict()
    assert t["doc_id"] == ["latin1.txt", "notes.md", "q3/report.txt"]
    assert t["text"][2] == "Revenue rose. Costs fell."
    # a Latin-1 file is decoded by its detected encoding, not with replacement characters
    assert t["text"][0] == "Café sales dipped." and "\ufffd" not in t["text"][0]
    assert t["encoding"][0] != "utf-8" and t["encoding"][2] == "utf-8"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert docintel("ingest", empty, tmp_path / "x.parquet").returncode == 2


def test_train_and_evaluate_small(tmp_path: Path) -> None:
    rows = pd.read_csv(VALID_CSV).groupby("label").head(60)  # 180 rows, all 3 classes
    data = tmp_path / "small.parquet"
    pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), data)
    more = tmp_path / "more.csv"  # --add-data: trained on with DATA, hold-out from both
    pd.read_csv(VALID_CSV).groupby("label").tail(10).to_csv(more, index=False)
    model = tmp_path / "clf"
    names = "Bearish,Bullish,Neutral"
    # --add-weight without --add-data, not a positive number, or with --head joint (which
    # fits no head to weigh): refused before training
    joint = ["--add-data", more, "--add-weight", "3", "--fine-tune", "--head", "joint"]
    for bad in (["--add-weight", "3"], ["--add-data", more, "--add-weight", "0"], joint):
        refused = docintel("train", data, "--out", model, "--label-names", names, *bad)
        assert refused.returncode == 2 and "--add-weight" in refused.stderr, refused.stderr
    for option in ("--top-layers", "--preserve"):  # what to tune needs --fine-tune
        refused = docintel("train", data, "--out", model, "--label-names", names, option, "2")
        assert refused.returncode == 2 and "--fine-tune" in refused.stderr, refused.stderr
    assert not model.exists()
    added = ["--add-data", more, "--add-weight", "3"]
    r = docintel("train", data, "--out", model, "--label-names", names, *added)
    assert r.returncode == 0, r.stderr[-3000:]
    training = json.loads((model / "training.json").read_text())
    assert training["rows"] == 210 and training["holdout_rows"] == 21
    assert training["data"] == "small.parquet" and training["more_data"] == ["more.csv"]
    assert training["more_data_weight"] == 3.0
    assert {"model.keras", "labels.json", "training.json", "metrics.json"} <= {
        p.name for p in model.iterdir()
    }
    metrics = json.loads((model / "metrics.json").read_text())
    assert metrics["split"] == "holdout" and 0 <= metrics["macro_f1"] <= 1
    assert json.loads((model / "labels.json").read_text()) == ["Bearish", "Bullish", "Neutral"]
    ev = docintel("evaluate", model, data)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "macro-F1" in ev.stdout and "confusion matrix" in ev.stdout


def test_quantize_builds_both_int8_models_and_a_parity_report(tmp_path: Path) -> None:
    rows = pd.read_csv(VALID_CSV).groupby("label").head(20)  # 60 rows, all 3 classes
    data = tmp_path / "small.csv"
    rows.to_csv(data, index=False)
    target = tmp_path / "int8"
    r = docintel("quantize", "--out", target, "--data", data)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (target / "model.int8.onnx").is_file()
    heads = list((target / "classify").glob("finsent_ft@*.int8.onnx"))
    assert len(heads) == 1, heads
    parity = json.loads((target / "parity.json").read_text())
    assert parity["n"] == 60 and parity["encoder"]["cosine_mean"] > 0.98
    assert "int8 vs fp32 on small.csv" in r.stdout and str(target / "parity.json") in r.stdout


def test_two_concurrent_runs_on_one_output_one_writes_the_other_is_refused(
    tmp_path: Path,
) -> None:
    """A resubmitted run while the first is alive: one writer per OUTPUT. The second is
    refused with exit 2 naming the holder; the output ends exactly once, every part
    readable."""
    ids = [f"d{i:02d}" for i in range(24)]
    corpus = write_docs(
        tmp_path / "docs.parquet", ids, [f"Revenue rose {i}%. Costs fell." for i in range(24)]
    )
    out = tmp_path / "out"
    env = {**os.environ, "COLUMNS": "200"}
    args = [*DOCINTEL, "run", str(corpus), str(out), "--run-id", "twin", "--num-cpus", "2",
            "--batch-size", "4"]  # fmt: skip
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen(args, cwd=REPO, env=env, **pipes) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]  # reads both pipes to the end
    results = [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, _, err in results if code == 2)
    assert "being written by another docintel process" in refused
    assert "docintel run twin" in refused  # names the holder's run
    tables = assert_exactly_once(out, ids)
    assert len(tables["documents"]) == 24
    for part in out.rglob("part-*.parquet"):
        pq.read_table(part)  # every committed part is whole Parquet
    assert not list(out.rglob("*.tmp")) and not (out / "_lease.json").exists()
