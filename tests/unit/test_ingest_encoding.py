"""`docintel ingest` decodes text files that are not UTF-8 with their detected encoding
(charset-normalizer) or the one given, records it per file, and names every file it had
to decode lossily."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from docintel.pipeline.errors import InputError
from docintel.pipeline.ingest import detect_encoding, ingest_folder

FRENCH = "Société Générale annonce une baisse de ses bénéfices trimestriels."


def _rows(path: Path) -> dict[str, tuple[str, str]]:
    t = pq.read_table(path).to_pylist()
    return {r["doc_id"]: (r["text"], r["encoding"]) for r in t}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "utf8.txt").write_text("Profits rose 5%.", encoding="utf-8")
    (folder / "latin1.txt").write_bytes(FRENCH.encode("latin-1"))
    # UTF-8 with one damaged byte: still UTF-8 (its é is valid), the bad byte replaced
    (folder / "damaged.txt").write_bytes("Café sales fell.".encode() + b"\xff")
    return folder


def test_latin1_french_is_decoded_correctly_and_recorded(tmp_path: Path, src: Path) -> None:
    out = tmp_path / "docs.parquet"
    r = ingest_folder(src, out, ["*.txt"])
    rows = _rows(out)
    assert rows["latin1.txt"][0] == FRENCH
    assert rows["latin1.txt"][1] in ("cp1252", "latin_1", "iso8859_15")
    assert rows["utf8.txt"] == ("Profits rose 5%.", "utf-8")
    assert rows["damaged.txt"] == ("Café sales fell.\ufffd", "utf-8")
    assert r.lossy == ["damaged.txt"] and r.replaced == 1
    assert sum(r.encodings.values()) == 1 and "utf-8" not in r.encodings


def test_given_encoding_is_used_for_every_file(tmp_path: Path) -> None:
    folder = tmp_path / "jp"
    folder.mkdir()
    text = "東京証券取引所の株価は大きく下落した。"
    (folder / "a.txt").write_bytes(text.encode("shift_jis"))
    out = tmp_path / "jp.parquet"
    r = ingest_folder(folder, out, ["*.txt"], encoding="Shift-JIS")
    assert _rows(out)["a.txt"] == (text, "shift_jis") and not r.lossy
    with pytest.raises(InputError, match="no-such-codec"):
        ingest_folder(folder, tmp_path / "x.parquet", ["*.txt"], encoding="no-such-codec")


def test_detection_finds_no_encoding_in_binary_noise() -> None:
    assert detect_encoding(bytes(range(128, 256)) * 8) is None
    assert detect_encoding("Zażółć gęślą jaźń, spółka.".encode("cp1250")) == "cp1250"


def test_cli_names_lossy_files_and_detected_encodings(tmp_path: Path, src: Path) -> None:
    from docintel.jobs.cli import app

    out = tmp_path / "docs.parquet"
    r = CliRunner().invoke(app, ["ingest", str(src), str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "wrote 3 documents" in r.stdout and "1 decoded lossily" in r.stdout
    assert "decoded as cp1252" in r.stdout
    assert "warning: damaged.txt: decoded lossily" in r.stderr
    bad = CliRunner().invoke(app, ["ingest", str(src), str(out), "--encoding", "nope"])
    assert bad.exit_code == 2 and "'nope'" in bad.stderr
