"""The audit's selection over a folder of document files (issue 32 item 8), without Ray:
files hashed by content, a touched file with the same bytes unchanged, selected files
staged under their relative paths, hidden and _-prefixed ones never listed, a model change
reprocessing every file; the Parquet path still taken for Parquet sources."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from docintel.pipeline.audit.select_documents import CHUNK_BYTES, select_night
from docintel.pipeline.audit.state import AuditLayout, commit_state, read_index, read_state
from docintel.pipeline.config import Config
from docintel.pipeline.output.sink import resolve_output
from tests.conftest import write_docs

CFG = Config()
D1, D2, D3 = "2026-01-01", "2026-01-02", "2026-01-03"
MODELS = {"embed": "e1"}


def _night(lay: AuditLayout, src: Path, day: str, models: dict[str, str]) -> dict[str, Any]:
    state = read_state(lay)
    sel = select_night(CFG, lay, day, str(src), state, models)
    commit_state(lay, day, state, sel, {"date": day}, CFG.storage)
    return sel


def _staged(lay: AuditLayout, day: str) -> list[str]:
    root = Path(lay.staging(day))
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name[0] != "_"
    )


def _bump(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def test_document_files_are_selected_by_content(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "deep.md").write_text("# Deep\n\nA note.\n")
    (src / "keep.txt").write_text("Kept as it is.\n")
    (src / "touch.html").write_text("<p>Touched, same bytes.</p>")
    (src / "edit.txt").write_text("First version.\n")
    (src / "gone.txt").write_text("Removed tomorrow.\n")
    big = os.urandom(CHUNK_BYTES * 2 + 17)  # hashed over several chunks
    (src / "big.txt").write_bytes(big)
    (src / ".hidden.txt").write_text("never")
    (src / "_skip").mkdir()
    (src / "_skip" / "x.txt").write_text("never")
    lay = AuditLayout(*resolve_output(str(tmp_path / "out"), CFG.storage))

    s1 = _night(lay, src, D1, MODELS)
    files = ["a/b/deep.md", "big.txt", "edit.txt", "gone.txt", "keep.txt", "touch.html"]
    assert s1["counts"] == {"new": 6, "changed": 0, "removed": 0, "unchanged": 0,
                            "reprocessed": 0}  # fmt: skip
    assert s1["input"] == "documents" and _staged(lay, D1) == files
    index = read_index(lay)
    assert index["doc_id"].to_pylist() == files
    want = hashlib.blake2b(big, digest_size=16).digest()
    assert index.to_pydict()["content_hash"][1] == want

    (src / "edit.txt").write_text("Second version, longer.\n")
    _bump(src / "touch.html")
    (src / "gone.txt").unlink()
    (src / "new.pdf").write_bytes(b"%PDF-1.4 not parsed here")
    s2 = _night(lay, src, D2, MODELS)
    assert s2["counts"] == {"new": 1, "changed": 1, "removed": 1, "unchanged": 4,
                            "reprocessed": 0}  # fmt: skip
    assert s2["selected"] == 2 and _staged(lay, D2) == ["edit.txt", "new.pdf"]
    dates = dict(zip(*read_index(lay).select(["doc_id", "processed_date"]).to_pydict().values(),
                     strict=True))  # fmt: skip
    assert str(dates["touch.html"]) == D1 and str(dates["edit.txt"]) == D2
    assert pq.read_table(lay.index_of(read_state(lay))).num_rows == 6

    s3 = _night(lay, src, D3, {"embed": "e2"})  # a new model: every file again
    assert s3["counts"]["reprocessed"] == 6 and s3["selected"] == 6
    assert len(_staged(lay, D3)) == 6


def test_parquet_sources_keep_the_parquet_selection(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write_docs(src / "a.parquet", ["d1", "d2"], ["One text.", "Two text."])
    lay = AuditLayout(*resolve_output(str(tmp_path / "out"), CFG.storage))
    sel = select_night(CFG, lay, D1, str(src), None, MODELS)
    assert "input" not in sel and sel["counts"]["new"] == 2
    assert [p.name for p in Path(lay.staging(D1)).glob("input-*.parquet")]
