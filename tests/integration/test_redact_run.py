"""Issue 35 end to end (local Ray, real models, real Parquet): a run with redaction leaves
no inserted value in any file of its output folder (every table's rows and Parquet
statistics, the manifest, the run state, error rows, an ANN index, search hits, the
command's output), its embeddings are those of the redacted sentences, a resume with
another setting is refused, and an audited night's outputs are redacted too."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from docintel.actors.runner import execute
from docintel.pipeline.audit import run_audit
from docintel.pipeline.config import Config, load_config
from docintel.pipeline.errors import RunFailed, UsageError
from docintel.pipeline.exitcodes import exit_code
from docintel.pipeline.privacy import Redactor
from docintel.pipeline.search import index as ann_index
from docintel.pipeline.search.query import QueryEncoder, search
from docintel.pipeline.stages.sentencize import joined
from tests.cli.test_cli import docintel
from tests.conftest import assert_exactly_once, write_docs

pytestmark = pytest.mark.usefixtures("ray_cluster")

CUSTOMER_REGEX = r"CU-\d{6}"
# Every value the corpus holds, by type, as written (and the compact forms a card or an
# IBAN might be stored in)
VALUES = {
    "EMAIL_ADDRESS": ["ann@example.com", "J.Smith@Corp-Bank.COM", "li.wei+bill@mail.example.co.uk"],
    "PHONE_NUMBER": ["(212) 555-0147", "+44 20 7946 0958", "+49 (30) 123456", "+33 1 23 45 67 89"],
    "CREDIT_CARD": ["4111 1111 1111 1111", "5555555555554444", "3782 822463 10005"],
    "IBAN_CODE": ["DE89 3704 0044 0532 0130 00", "GB82 WEST 1234 5698 7654 32"],
    "US_SSN": ["536-22-1234", "123-45-6789"],
    "IP_ADDRESS": ["192.168.1.10", "2001:db8::1"],
    "CUSTOMER_ID": ["CU-004211"],
}  # fmt: skip
V = {t: iter(vs) for t, vs in VALUES.items()}
DOCS = {
    "d1": f"Please write to {next(V['EMAIL_ADDRESS'])} or {next(V['EMAIL_ADDRESS'])} about "
    "the claim. The branch said revenue rose 4.5% to $12.3 million in 2024.",
    "d2": f"Call {next(V['PHONE_NUMBER'])} or\n{next(V['PHONE_NUMBER'])} before Friday.\n\n"
    f"Our Berlin office is on {next(V['PHONE_NUMBER'])}. Shares fell 3% on Tuesday.",
    "d3": f"The card {next(V['CREDIT_CARD'])} was charged twice. A refund went to "
    f"{next(V['CREDIT_CARD'])} and to the Amex {next(V['CREDIT_CARD'])} yesterday.",
    "d4": f"Pay into {next(V['IBAN_CODE'])}, or {next(V['IBAN_CODE'])} for sterling. The bank "
    "cut 1,200 jobs.",
    "d5": f"Her SSN is {next(V['US_SSN'])} according to the form, his {next(V['US_SSN'])}. "
    f"Logins came from {next(V['IP_ADDRESS'])} and {next(V['IP_ADDRESS'])} overnight.",
    "d6": f"Contact {next(V['EMAIL_ADDRESS'])} on {next(V['PHONE_NUMBER'])}. It failed.",
    "d7": f"Customer {next(V['CUSTOMER_ID'])} complained again. Profits fell sharply.",
}
POISONED = "d6"  # fails in embed: an error row, after its text was redacted
SENSITIVE = [v for vs in VALUES.values() for v in vs]
SENSITIVE += [v.replace(" ", "") for v in VALUES["CREDIT_CARD"] + VALUES["IBAN_CODE"]]

TOML = f"""
[run]
batch_size = 3
show_progress = false
[resources.sentencize]
gpu_replicas = 0
[resources.embed]
gpu_replicas = 0
[resources.classify]
gpu_replicas = 0
[privacy.patterns]
CUSTOMER_ID = '{CUSTOMER_REGEX}'
[faults]
poison_stage = "embed"
poison_doc_ids = ["{POISONED}"]
"""


def _leaks(text: str) -> list[str]:
    return [v for v in SENSITIVE if v in text]


def _readable(path: Path) -> str:
    """What a file holds, as text a value would show in: a Parquet file's rows and its
    column statistics, another file's bytes."""
    if path.suffix != ".parquet":
        return path.read_bytes().decode("utf-8", errors="replace")
    f = pq.ParquetFile(path)
    stats = [
        str(f.metadata.row_group(g).column(c).statistics)
        for g in range(f.metadata.num_row_groups)
        for c in range(f.metadata.num_columns)
    ]
    return json.dumps(f.read().to_pylist(), default=str) + "\n".join(stats)


def _folder_leaks(root: Path) -> dict[str, list[str]]:
    """Every file under ``root`` (a Lance dataset read back as rows too) -> values in it."""
    found = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        leaks = _leaks(_readable(path))
        if leaks:
            found[str(path.relative_to(root))] = leaks
    for ds in (p for p in root.rglob("*.lance") if p.is_dir()):
        import lance

        leaks = _leaks(json.dumps(lance.dataset(str(ds)).to_table().to_pylist(), default=str))
        if leaks:
            found[str(ds.relative_to(root))] = leaks
    return found


@dataclass
class Redacted:
    root: Path
    out: Path
    cfg: Config
    cli: subprocess.CompletedProcess[str]
    refusals: list[UsageError] = field(default_factory=list)
    written_before_resume: list[str] = field(default_factory=list)


def _interrupt(total: int, done: int) -> None:
    raise RunFailed("run interrupted (test)")


@pytest.fixture(scope="module")
def redacted(tmp_path_factory: pytest.TempPathFactory, ray_cluster: Any) -> Redacted:
    """Run r1 started with --redact's setting and interrupted once its pools were up; three
    resumes with another setting refused; then resumed by `docintel run --redact`."""
    root = tmp_path_factory.mktemp("redact")
    docs = write_docs(root / "docs.parquet", list(DOCS), list(DOCS.values()), row_group_size=3)
    (root / "c.toml").write_text(TOML)
    cfg = load_config(root / "c.toml", {"run.run_id": "r1", "privacy.redact": True})
    out = root / "out"
    with pytest.raises(RunFailed):
        execute(cfg, str(docs), str(out), _interrupt)
    run = Redacted(root, out, cfg, None)  # type: ignore[arg-type]
    for other in (
        {"privacy.redact": ["EMAIL_ADDRESS", "PHONE_NUMBER"]},
        {"privacy.redact": False},
        {"privacy.patterns": {"CUSTOMER_ID": r"CU-\d{5,6}"}},
    ):
        with pytest.raises(UsageError) as e:
            execute(cfg.with_overrides(other), str(docs), str(out))
        run.refusals.append(e.value)
    run.written_before_resume = sorted(p.name for p in out.iterdir())
    run.cli = docintel("run", docs, out, "-c", root / "c.toml", "--run-id", "r1", "--redact")
    assert run.cli.returncode == 0, run.cli.stderr[-3000:]
    return run


def test_no_value_reaches_any_file_of_the_output_nor_search(redacted: Redacted) -> None:
    out = redacted.out
    tables = assert_exactly_once(out, list(DOCS))
    assert tables["errors"]["doc_id"].tolist() == [POISONED]
    assert tables["errors"]["stage"].tolist() == ["embed"]
    ann_index.build_index(str(out))  # OUTPUT/_index/<build>.lance, from the stored rows
    hits = search(str(out), ["contact me by e-mail or phone", "card charged"], top=30)
    assert hits.used_index and all(len(h) > 3 for h in hits.hits)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert any(f.startswith("_index/") for f in files) and "_manifest.json" in files
    assert {f.split("/")[0] for f in files} >= {"documents", "sentences", "errors", "_index"}
    assert _folder_leaks(out) == {}
    assert _leaks(json.dumps(hits.hits, default=str)) == []
    assert _leaks(redacted.cli.stdout + redacted.cli.stderr) == []
    assert "<EMAIL_ADDRESS>" in json.dumps(hits.hits)  # the hits are there, redacted


def test_sentences_keep_their_offsets_and_list_their_placeholders(redacted: Redacted) -> None:
    s = pd.read_parquet(redacted.out / "sentences")
    redactor = Redactor(None, {"CUSTOMER_ID": CUSTOMER_REGEX})
    found: dict[str, int] = {}
    for row in s.itertuples():
        original = joined(DOCS[row.doc_id][row.start_char : row.end_char])
        assert row.text == redactor.redact(original)[0]
        for span in row.pii:
            assert row.text[span["start"] : span["end"]] == f"<{span['type']}>"
            found[span["type"]] = found.get(span["type"], 0) + 1
    expected = {t: len(vs) for t, vs in VALUES.items()}
    expected["EMAIL_ADDRESS"] -= 1  # d6's are in its error row's batch only: not written
    expected["PHONE_NUMBER"] -= 1
    assert found == expected
    assert set(s.privacy_backend) == {"cpu-fp32"}
    assert s.privacy_model.str.startswith("redact:phonenumbers-").all()


def test_embeddings_are_those_of_the_redacted_text(redacted: Redacted) -> None:
    s = pd.read_parquet(redacted.out / "sentences")
    stored = np.stack(s["embedding"].to_numpy())
    encoder = QueryEncoder(redacted.cfg.embed)
    try:
        of_redacted, _ = encoder.encode(s["text"].tolist())
        originals = [joined(DOCS[r.doc_id][r.start_char : r.end_char]) for r in s.itertuples()]
        of_originals, _ = encoder.encode(originals)
    finally:
        encoder.close()
    np.testing.assert_allclose(stored, of_redacted, atol=1e-5)
    with_values = np.array([len(p) > 0 for p in s["pii"]])
    assert with_values.sum() >= 8
    cos_raw = np.sum(stored * of_originals, axis=1)
    assert (cos_raw[with_values] < 0.999).all()  # not what the raw sentence would give


def test_the_manifest_records_the_setting_and_no_regex(redacted: Redacted) -> None:
    manifest = json.loads((redacted.out / "_manifest.json").read_text())
    types = ["EMAIL_ADDRESS", "IBAN_CODE", "CREDIT_CARD", "US_SSN", "IP_ADDRESS", "PHONE_NUMBER"]
    assert manifest["privacy"] == {"redacted": True, "types": types, "patterns": ["CUSTOMER_ID"]}
    assert manifest["plan"]["privacy"]["patterns"]["CUSTOMER_ID"].startswith("sha256:")
    assert manifest["stages"][manifest["stages"].index("sentencize") + 1] == "privacy"
    assert manifest["config"]["privacy"]["redact"] is True
    assert CUSTOMER_REGEX not in json.dumps(manifest) and "CU-" not in json.dumps(manifest)


def test_a_resume_or_a_rerun_with_another_setting_is_refused(redacted: Redacted) -> None:
    assert len(redacted.refusals) == 3
    for e in redacted.refusals:
        text = str(e)
        assert exit_code(e) == 2
        assert "run 'r1'" in text and "was started with privacy" in text and "--redact" in text
        assert CUSTOMER_REGEX not in text
    assert "sentences" not in redacted.written_before_resume  # refused before any work
    # the completed run: the same refusal, and the same setting is a no-op
    with pytest.raises(UsageError, match="made with privacy") as e:
        execute(
            redacted.cfg.with_overrides({"privacy.redact": ["US_SSN"]}),
            str(redacted.root / "docs.parquet"),
            str(redacted.out),
        )
    assert exit_code(e.value) == 2
    again = execute(redacted.cfg, str(redacted.root / "docs.parquet"), str(redacted.out))
    assert again.run_id == "r1"


def test_an_audited_night_is_redacted(tmp_path: Path) -> None:
    """The audit runs each night with the config's [privacy] setting: the night's tables,
    report and CSVs and latest/ hold placeholders, never the values."""
    src, out = tmp_path / "source", tmp_path / "audit"
    write_docs(src / "a.parquet", list(DOCS), list(DOCS.values()))
    (tmp_path / "c.toml").write_text(
        TOML.replace('"embed"', '"classify"') + "[privacy]\nredact = true\n"
    )
    cfg = load_config(tmp_path / "c.toml", {"run.embeddings": False})
    summary = run_audit(cfg, str(src), str(out), "2026-01-01", execute)
    assert summary.ran and summary.documents == len(DOCS)
    night = out / "run_date=2026-01-01"
    assert {"report.html", "report.json", "review.csv", "changes.csv"} <= {
        p.name for p in night.iterdir()
    }
    assert json.loads((night / "_manifest.json").read_text())["privacy"]["redacted"]
    assert (
        "&lt;CREDIT_CARD&gt;" in (night / "report.html").read_text()
        or "<CREDIT_CARD>" in (night / "report.json").read_text()
    )
    assert _folder_leaks(night) == {}
    assert _folder_leaks(out / "latest") == {}
    # the staged copy of the night's source is gone once the night is committed: the
    # whole audit output holds no value (the source folder is the user's, not ours)
    assert _folder_leaks(out) == {}
    assert (out / "_audit" / "inputs" / "run_date=2026-01-01" / "_selection.json").exists()
