"""Output parts merged at the end of a run: sizes, exactly-once, and crashes mid-merge."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from docintel.actors.runner import execute
from docintel.pipeline import registry
from docintel.pipeline.formats.parquet import ParquetPartsSink, part_path
from docintel.pipeline.output import compact
from tests.conftest import assert_exactly_once, run_config, write_docs

FS = pafs.LocalFileSystem()
TABLES = ("documents", "sentences", "errors")


def _files(out: Path) -> dict[str, list[str]]:
    return {t: sorted(p.name for p in (out / t).iterdir()) for t in TABLES}


def _run(inp: Path, out: Path, target_mb: float) -> dict:
    cfg = run_config(**{"run.run_id": "c1", "run.batch_size": 2, "run.part_target_mb": target_mb})
    execute(cfg, str(inp), str(out))
    return json.loads((out / "_manifest.json").read_text())


@pytest.fixture(scope="module")
def corpus(
    tmp_path_factory: pytest.TempPathFactory, headlines: list[str]
) -> tuple[Path, list[str]]:
    ids = [f"d{i:02d}" for i in range(24)]
    folder = tmp_path_factory.mktemp("compaction-in")
    return write_docs(folder / "in.parquet", ids, headlines[:24], row_group_size=6), ids


@pytest.fixture(scope="module")
def plain(
    tmp_path_factory: pytest.TempPathFactory, corpus: tuple[Path, list[str]]
) -> tuple[Path, dict]:
    """One run of the corpus without merging (12 batches: one file per batch and table)."""
    out = tmp_path_factory.mktemp("compaction-plain") / "out"
    return out, _run(corpus[0], out, target_mb=0)


def _copy(plain: tuple[Path, dict], to: Path) -> Path:
    shutil.copytree(plain[0], to)
    return to


def test_small_parts_are_merged_into_groups_near_the_target(
    tmp_path: Path, corpus: tuple[Path, list[str]], plain: tuple[Path, dict]
) -> None:
    inp, ids = corpus
    plain_out, plain_manifest = plain
    assert {t: len(f) for t, f in _files(plain_out).items()} == dict.fromkeys(TABLES, 12)
    per_batch = sum(plain_manifest["parts"]["tables"][t]["bytes"] for t in TABLES) / 12
    # a target of about 4 batches' parts: 12 batches in 3 or 4 groups
    target_mb = 4.5 * per_batch / 2**20
    out = tmp_path / "merged"
    manifest = _run(inp, out, target_mb)
    files = _files(out)
    assert 3 <= len(files["documents"]) <= 4, files
    assert all(n.startswith("part-merged-") for t in TABLES for n in files[t]), files
    assert manifest["parts"]["merged_batches"] == 12
    assert manifest["parts"]["parts_removed"] == 36
    for table in TABLES:
        sizes = [p.stat().st_size for p in (out / table).iterdir()]
        assert manifest["parts"]["tables"][table] == {"files": len(sizes), "bytes": sum(sizes)}
    merged = assert_exactly_once(out, ids)
    before = assert_exactly_once(plain_out, ids)
    key = ["doc_id", "sent_index"]
    for table in ("documents", "sentences"):
        a = merged[table].sort_values(key if table == "sentences" else ["doc_id"])
        b = before[table].sort_values(key if table == "sentences" else ["doc_id"])
        assert (
            a.drop(columns=["embedding"], errors="ignore")
            .reset_index(drop=True)
            .equals(b.drop(columns=["embedding"], errors="ignore").reset_index(drop=True))
        )
    assert manifest["counts"] == plain_manifest["counts"]
    assert manifest["stages"] == registry.chain(run_config()).names  # the chain, in order


def _staged_crash(out: Path, keep_members: bool, drop_merged_documents: bool) -> None:
    """Merge the output's first group by hand, then put back what a crash would leave."""
    (out / "_manifest.json").unlink()  # the crash came before the commit
    saved = out.parent / "saved"
    shutil.copytree(out, saved)
    sink = ParquetPartsSink(FS, str(out), part_target_bytes=10 * 2**20)
    group = sink.plan_groups()[0]
    sink.merge_group(group)
    if drop_merged_documents:  # died after the errors and sentences merges: every
        Path(part_path(str(out), "documents", group.name)).unlink()  # member is still there
    if keep_members:  # died before deleting the members' own parts (or some of them)
        step = 1 if drop_merged_documents else 2
        for table in TABLES:
            for batch_id in group.batch_ids[::step]:
                name = f"part-{batch_id}.parquet"
                shutil.copy(saved / table / name, out / table / name)
    shutil.rmtree(saved)


@pytest.mark.parametrize(
    ("keep_members", "drop_merged_documents"),
    [(True, False), (True, True), (False, False)],
    ids=["merged-and-members", "orphan-merged-sentences", "merged-only"],
)
def test_a_crash_during_compaction_resumes_exactly_once(
    tmp_path: Path,
    corpus: tuple[Path, list[str]],
    plain: tuple[Path, dict],
    keep_members: bool,
    drop_merged_documents: bool,
) -> None:
    inp, ids = corpus
    out = _copy(plain, tmp_path / "out")
    first = plain[1]
    _staged_crash(out, keep_members, drop_merged_documents)
    manifest = _run(inp, out, target_mb=10)  # the resume: nothing to process, merge the rest
    assert manifest["resumed_batches"] == 12  # every batch came from the earlier invocation
    assert manifest["counts"] == first["counts"]
    assert manifest["backends"] == first["backends"]
    files = _files(out)
    assert all(len(f) == 1 and f[0].startswith("part-merged-") for f in files.values()), files
    assert_exactly_once(out, ids)


def test_recover_keeps_the_merged_copy_and_drops_orphans(
    tmp_path: Path, plain: tuple[Path, dict]
) -> None:
    out = _copy(plain, tmp_path / "out")
    _staged_crash(out, keep_members=True, drop_merged_documents=False)
    merged = ParquetPartsSink(FS, str(out)).settle()
    assert len(merged) == 12 and all(s.documents == 2 for s in merged.values())
    files = _files(out)
    assert all(len(f) == 1 for f in files.values()), files  # the members' copies are gone

    out2 = _copy(plain, tmp_path / "out2")
    _staged_crash(out2, keep_members=True, drop_merged_documents=True)
    assert ParquetPartsSink(FS, str(out2)).settle() == {}
    assert {t: len(f) for t, f in _files(out2).items()} == dict.fromkeys(TABLES, 12)


def test_batches_at_half_the_target_or_more_are_left_alone(plain: tuple[Path, dict]) -> None:
    """Through pipeline/output/compact.py, the entry point tools use: the sink's own planning."""
    out = plain[0]
    sizes = [
        sum((out / t / p.name).stat().st_size for t in TABLES)
        for p in (out / "documents").iterdir()
    ]
    assert compact.plan_groups(FS, str(out), 2 * min(sizes)) == []  # each is half of it
    pairs = compact.plan_groups(FS, str(out), 2 * max(sizes) + 2)
    assert [len(g.batch_ids) for g in pairs] == [2] * 6
