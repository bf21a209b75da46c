"""`docintel ingest` (docintel.pipeline.input.ingest): real files in tmp_path, no mocks."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from docintel.pipeline.errors import InputError, OutputError
from docintel.pipeline.input.ingest import (
    MAX_FILE_BYTES,
    IngestResult,
    doc_id_for,
    doc_id_to_path,
    ingest_folder,
)

PATTERNS = ["*.txt", "*.md"]
PNG_LIKE = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00" + bytes(range(256)) * 4


def _ids(out: Path) -> list[str]:
    return pq.read_table(out).column("doc_id").to_pylist()


def _texts(out: Path) -> dict[str, str]:
    t = pq.read_table(out).to_pydict()
    return dict(zip(t["doc_id"], t["text"], strict=True))


def _reasons(result: IngestResult) -> dict[str, str]:
    return {s.doc_id: s.reason for s in result.skipped}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "a.txt").write_text("Revenue rose.")
    return d


def test_symlink_to_a_file_outside_is_skipped_and_reported(tmp_path: Path, src: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    (src / "leak.txt").symlink_to(secret)
    out = tmp_path / "docs.parquet"
    r = ingest_folder(src, out, PATTERNS)
    assert r.documents == 1 and _ids(out) == ["a.txt"]
    assert "outside the input folder" in _reasons(r)["leak.txt"]
    assert "TOP SECRET" not in "".join(_texts(out).values())


def test_directory_symlink_outside_is_skipped(tmp_path: Path, src: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "b.txt").write_text("not ours")
    (src / "linked").symlink_to(elsewhere, target_is_directory=True)
    out = tmp_path / "docs.parquet"
    r = ingest_folder(src, out, PATTERNS)
    assert _ids(out) == ["a.txt"]
    assert list(_reasons(r)) == ["linked"]
    assert "folder outside the input folder" in _reasons(r)["linked"]


def test_symlink_inside_the_folder_does_not_duplicate(tmp_path: Path, src: Path) -> None:
    (src / "sub").mkdir()
    (src / "sub" / "alias.txt").symlink_to(src / "a.txt")  # same file, later in order
    (src / "0first.txt").symlink_to("z.txt")  # relative link, earlier in order
    (src / "z.txt").write_text("Costs fell.")
    (src / "mirror").symlink_to(src / "sub", target_is_directory=True)  # folder alias
    out = tmp_path / "docs.parquet"
    r = ingest_folder(src, out, PATTERNS)
    assert _ids(out) == ["0first.txt", "a.txt"]  # the first path in sorted order wins
    assert _texts(out)["0first.txt"] == "Costs fell."
    reasons = _reasons(r)
    assert reasons["sub/alias.txt"] == "same file as a.txt (via a symlink)"
    assert reasons["z.txt"] == "same file as 0first.txt (via a symlink)"
    assert reasons["mirror/alias.txt"] == "same file as a.txt (via a symlink)"


def test_directory_symlink_loop_is_not_followed(tmp_path: Path, src: Path) -> None:
    (src / "sub").mkdir()
    (src / "sub" / "up").symlink_to("..", target_is_directory=True)
    (src / "self").symlink_to(".", target_is_directory=True)
    out = tmp_path / "docs.parquet"
    r = ingest_folder(src, out, PATTERNS)
    assert _ids(out) == ["a.txt"]
    assert "loop" in _reasons(r)["sub/up"] and "loop" in _reasons(r)["self"]


def test_non_utf8_file_name_gets_the_escaped_id(tmp_path: Path, src: Path) -> None:
    raw_name = b"caf\xe9 100%.txt"
    if sys.getfilesystemencoding() != "utf-8":  # os.fsdecode would not give surrogates
        pytest.skip(f"file names decode as {sys.getfilesystemencoding()}, not UTF-8")
    try:
        fd = os.open(os.fsencode(src) + b"/" + raw_name, os.O_WRONLY | os.O_CREAT, 0o644)
    except (OSError, UnicodeError) as e:
        pytest.skip(f"this filesystem refuses non-UTF-8 file names: {e}")
    os.write(fd, b"Caf\xc3\xa9 sales dipped.")
    os.close(fd)
    out = tmp_path / "docs.parquet"
    r = ingest_folder(src, out, PATTERNS)
    assert r.documents == 2 and not r.skipped
    assert _ids(out) == ["a.txt", "caf%E9 100%25.txt"]
    assert _texts(out)["caf%E9 100%25.txt"] == "Café sales dipped."
    assert doc_id_to_path("caf%E9 100%25.txt") == raw_name  # reversible
    assert doc_id_for(b"caf\xe9.txt") == "caf%E9.txt"


def test_escaping_round_trips() -> None:
    for raw in [b"plain/x.txt", b"100%.md", b"%E9.txt", b"q3/\xff\xfe\x80.txt", "é/ü.md".encode()]:
        doc_id = doc_id_for(raw)
        assert doc_id.isprintable() and doc_id.encode("utf-8")  # no lone surrogates
        assert doc_id_to_path(doc_id) == raw
    assert doc_id_for(b"%E9.txt") == "%25E9.txt"  # a literal % never reads as an escape


def test_binary_file_is_reported_and_not_ingested(tmp_path: Path, src: Path) -> None:
    (src / "image.txt").write_bytes(PNG_LIKE)
    (src / "noise.md").write_bytes(bytes(range(128, 256)) * 8)  # no NUL, all undecodable
    out = tmp_path / "docs.parquet"
    r = ingest_folder(src, out, PATTERNS)
    assert _ids(out) == ["a.txt"] and r.replaced == 0
    assert _reasons(r)["image.txt"].startswith("binary: NUL bytes")
    assert _reasons(r)["noise.md"].startswith("binary: 100% of its bytes")


def test_latin1_text_is_decoded_with_its_detected_encoding(tmp_path: Path, src: Path) -> None:
    (src / "latin1.txt").write_bytes("Café sales dipped; naïve guidance.".encode("latin-1"))
    out = tmp_path / "docs.parquet"
    r = ingest_folder(src, out, PATTERNS)
    assert r.documents == 2 and r.replaced == 0 and not r.skipped  # see test_ingest_encoding
    assert _texts(out)["latin1.txt"] == "Café sales dipped; naïve guidance."


def test_streams_row_groups_and_keeps_sorted_order(tmp_path: Path) -> None:
    src = tmp_path / "many"
    (src / "sub").mkdir(parents=True)
    names = [f"doc{i:03d}.txt" for i in range(40)] + [f"sub/n{i}.md" for i in range(10)]
    for name in names:
        (src / name).write_text(f"Document {name}.")
    out = tmp_path / "docs.parquet"
    seen: list[tuple[int, int]] = []
    r = ingest_folder(
        src, out, PATTERNS, row_group_docs=8, on_file=lambda d, t: seen.append((d, t))
    )
    assert r.documents == 50
    assert pq.ParquetFile(out).num_row_groups == 7  # 6 x 8 + 2
    assert _ids(out) == sorted(names)
    assert seen == [(i, 50) for i in range(1, 51)]
    by_bytes = tmp_path / "by_bytes.parquet"
    ingest_folder(src, by_bytes, PATTERNS, row_group_bytes=100)  # ~18 bytes a file
    assert pq.ParquetFile(by_bytes).num_row_groups > 1 and _ids(by_bytes) == sorted(names)


def test_oversized_file_is_skipped(tmp_path: Path, src: Path) -> None:
    (src / "big.txt").write_text("x" * 1001)
    (src / "edge.txt").write_text("y" * 1000)
    out = tmp_path / "docs.parquet"
    r = ingest_folder(src, out, PATTERNS, max_file_bytes=1000)
    assert _ids(out) == ["a.txt", "edge.txt"]
    assert _reasons(r)["big.txt"].startswith("too large: 1,001 bytes, over the 1,000-byte cap")


def test_failure_mid_ingest_leaves_output_untouched(tmp_path: Path) -> None:
    src = tmp_path / "many"
    src.mkdir()
    for i in range(30):
        (src / f"d{i:02d}.txt").write_text(f"Document {i}.")
    out = tmp_path / "docs.parquet"

    def crash_after_20(done: int, total: int) -> None:
        if done == 20:  # row groups of 5: four are already written to the temporary file
            raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        ingest_folder(src, out, PATTERNS, row_group_docs=5, on_file=crash_after_20)
    assert list(tmp_path.iterdir()) == [src]  # no OUTPUT, no temporary file left
    out.write_bytes(b"previous run")
    with pytest.raises(RuntimeError):
        ingest_folder(src, out, PATTERNS, row_group_docs=5, on_file=crash_after_20)
    assert out.read_bytes() == b"previous run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.parquet", "many"]


def test_nothing_ingested_raises_and_writes_nothing(tmp_path: Path, src: Path) -> None:
    (src / "b.md").write_text("z" * 50)
    out = tmp_path / "docs.parquet"
    with pytest.raises(InputError, match=r"nothing ingested .*a\.txt: too large"):
        ingest_folder(src, out, PATTERNS, max_file_bytes=5)
    assert list(tmp_path.iterdir()) == [src]
    with pytest.raises(InputError, match="holds no files matching"):
        ingest_folder(src, out, ["*.csv"])
    with pytest.raises(InputError, match="relative to the folder"):
        ingest_folder(src, out, ["/etc/*.txt"])
    with pytest.raises(OutputError, match="is a folder"):
        ingest_folder(src, tmp_path, PATTERNS)
    assert list(tmp_path.iterdir()) == [src]


def test_cli_lists_skipped_files_escaped_and_exits_0(tmp_path: Path, src: Path) -> None:
    from docintel.jobs import cli_run
    from docintel.jobs.cli import app

    (src / "[red]x.txt").write_bytes(PNG_LIKE)  # markup-like names print literally
    out = tmp_path / "docs.parquet"
    r = CliRunner().invoke(app, ["ingest", str(src), str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "wrote 1 documents" in r.output and "skipped 1 files" in r.output
    assert "[red]x.txt: binary: NUL bytes" in r.output
    default_mib = inspect.signature(cli_run.ingest).parameters["max_file_mib"].default
    assert default_mib * 1024 * 1024 == MAX_FILE_BYTES


def test_cli_never_prints_control_characters_of_file_names(tmp_path: Path, src: Path) -> None:
    """A file name may carry terminal escapes (colour, cursor moves, a carriage return that
    overwrites the line): ingest's lines and error messages show them as visible escapes,
    on stdout and stderr alike (issue 20, item 11)."""
    from docintel.jobs.cli import app

    evil = "evil\x1b[31m\rname\u202e\x9b2J.txt"
    (src / evil).write_bytes(PNG_LIKE)  # binary: skipped and listed by name
    out = tmp_path / "out\x1b]0;title\x07.parquet"
    r = CliRunner().invoke(app, ["ingest", str(src), str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    shown = r.stdout + r.stderr
    for raw in ("\x1b", "\r", "\x07", "\x9b", "\u202e"):
        assert raw not in shown, (raw, shown)
    assert "evil\\x1b[31m\\x0dname\\u202e\\x9b2J.txt: binary" in r.stdout
    assert "out\\x1b]0;title\\x07.parquet" in r.stdout
    # the same name inside an error message (nothing ingested: exit 2, on stderr)
    (src / "a.txt").unlink()
    r = CliRunner().invoke(app, ["ingest", str(src), str(tmp_path / "x.parquet"), "--no-progress"])
    assert r.exit_code == 2, r.output
    assert "nothing ingested" in r.stderr and "evil\\x1b[31m\\x0dname" in r.stderr
    assert not any(raw in r.stdout + r.stderr for raw in ("\x1b", "\r", "\x9b", "\u202e"))
