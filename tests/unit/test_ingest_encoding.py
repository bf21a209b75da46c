"""`docintel ingest` decodes text files that are not UTF-8 with their detected encoding
(charset-normalizer) or the one given, records it per file, and names every file it had
to decode lossily."""

# ruff: noqa: RUF001 (the texts of the corpus hold curly quotes, CJK, Cyrillic and Greek)
from __future__ import annotations

import codecs
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from docintel.pipeline.errors import InputError
from docintel.pipeline.input.ingest import detect_encoding, ingest_folder

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


# Issue 31 item 3: a corpus of known encodings, each file generated from known text and
# decoded back exactly. The Western texts are the two the detector got wrong before the
# cp1252 rule: a Latin-1 news file whose "£" read as shift_jis "｣" (charset-normalizer
# 3.5 finds no mess in halfwidth katakana), and a cp1252 one with "€" read as mac_latin2.
LLOYDS = (
    "Shares in Lloyds Banking Group fell sharply on Wednesday after the lender set aside "
    "more money for bad loans. The bank said pre-tax profit for the quarter was £{a}m, "
    "below the £{b}bn analysts had expected. Its chief executive said the outlook "
    "remained uncertain.\n\n"
)
LATIN1_NEWS = "".join(LLOYDS.format(a=100 + 7 * i, b=f"{1 + i % 9}.{i % 10}") for i in range(12))
CP1252_NEWS = (
    "LONDON — Barclays said on Tuesday its pre-tax profit rose to £2.1bn, while the café "
    "chain Pret reported sales of €450m. Analysts at Société Générale expect the pound to "
    "weaken against the euro, which traded at €1.16.\n"
)
ENGLISH = (
    "Barclays said on Tuesday that pre-tax profit rose 12% to £2.1bn, while its euro-zone "
    "arm earned €450m. Analysts at Société Générale had expected less; the bank’s shares "
    "rose 3p to £1.62 in early trading.\n"
)
JAPANESE = (
    "東京株式市場で日経平均株価は大幅に続落し、前日比で五百円以上値下がりした。"
    "円高が進んだことで、自動車や電機など輸出関連株に売りが広がった。"
    "市場関係者は「米国の金利動向を見極めたいとの声が多い」と話している。\n"
)
RUSSIAN = (
    "Центральный банк России в пятницу повысил ключевую ставку до шестнадцати процентов. "
    "Аналитики ожидают, что инфляция замедлится к концу года, а рубль укрепится. "
    "Глава регулятора заявила, что банк сохраняет осторожный прогноз на следующий год.\n"
)
POLISH = (  # a one-sentence text reads as cp1252, with or without the cp1252 rule
    "Zarząd spółki poinformował, że zysk netto w trzecim kwartale wzrósł o dwadzieścia "
    "procent. Akcje zdrożały na giełdzie w Warszawie."
)
# file: (bytes, the text they hold, the encodings accepted, how it was decoded)
CORPUS: dict[str, tuple[bytes, str, set[str], str]] = {
    "utf8.txt": (ENGLISH.encode(), ENGLISH, {"utf-8"}, "exact"),
    "utf8_bom.txt": (ENGLISH.encode("utf-8-sig"), ENGLISH, {"utf-8-sig"}, "exact"),
    "utf16le_bom.txt": (ENGLISH.encode("utf-16"), ENGLISH, {"utf-16-le"}, "exact"),
    "utf16be_bom.txt": (
        codecs.BOM_UTF16_BE + JAPANESE.encode("utf-16-be"),
        JAPANESE,
        {"utf-16-be"},
        "exact",
    ),
    "cp1252.txt": (CP1252_NEWS.encode("cp1252"), CP1252_NEWS, {"cp1252"}, "guessed"),
    "latin1.txt": (LATIN1_NEWS.encode("latin-1"), LATIN1_NEWS, {"cp1252", "latin_1"}, "guessed"),
    "shift_jis.txt": (JAPANESE.encode("shift_jis"), JAPANESE, {"shift_jis", "cp932"}, "guessed"),
    "koi8_r.txt": (RUSSIAN.encode("koi8-r"), RUSSIAN, {"koi8_r"}, "guessed"),
}


def _decoded(path: Path) -> dict[str, tuple[str, str, str]]:
    t = pq.read_table(path).to_pylist()
    return {r["doc_id"]: (r["text"], r["encoding"], r["decoding"]) for r in t}


def test_known_encodings_decode_to_their_exact_text(tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name, (raw, _, _, _) in CORPUS.items():
        (folder / name).write_bytes(raw)
    out = tmp_path / "corpus.parquet"
    r = ingest_folder(folder, out, ["*.txt"])
    rows = _decoded(out)
    assert r.documents == len(CORPUS) and not r.skipped and not r.lossy
    for name, (_, text, encodings, how) in CORPUS.items():
        got, encoding, decoding = rows[name]
        assert got == text, f"{name} decoded as {encoding}: {got[:80]!r}"
        assert encoding in encodings and decoding == how, (name, encoding, decoding)
    guessed = {n for n, (_, _, _, how) in CORPUS.items() if how == "guessed"}
    assert dict(r.guessed).keys() == guessed  # each guessed file named, with its encoding
    assert all(rows[doc_id][1] == enc for doc_id, enc in r.guessed)


def test_western_text_that_reads_as_cp1252_is_cp1252_not_shift_jis() -> None:
    raw = LATIN1_NEWS.encode("latin-1")
    assert detect_encoding(raw) == "cp1252"
    assert "｣" not in raw.decode(detect_encoding(raw) or "")
    assert detect_encoding(CP1252_NEWS.encode("cp1252")) == "cp1252"  # not mac_latin2
    assert detect_encoding("Prices: €5, £4 and ¥600.".encode("cp1252")) == "cp1252"


@pytest.mark.parametrize(
    ("text", "codec"),
    [
        (JAPANESE, "shift_jis"),
        (JAPANESE, "euc_jp"),
        (RUSSIAN, "koi8_r"),
        (RUSSIAN, "cp1251"),
        (
            "中国人民银行周二宣布下调存款准备金率，以支持实体经济发展。分析人士认为，此举将释放流动性。",
            "gb18030",
        ),
        ("삼성전자는 올해 2분기 영업이익이 전년 동기 대비 크게 증가했다고 발표했다.", "euc_kr"),
        ("Η Ευρωπαϊκή Κεντρική Τράπεζα αύξησε τα επιτόκια κατά μισή ποσοστιαία μονάδα.", "cp1253"),
        (POLISH, "cp1250"),
    ],
)
def test_the_cp1252_rule_leaves_other_scripts_alone(text: str, codec: str) -> None:
    raw = text.encode(codec)
    guess = detect_encoding(raw)
    assert guess is not None and raw.decode(guess) == text, (codec, guess)


def test_a_mark_that_its_encoding_rejects_is_not_trusted(tmp_path: Path) -> None:
    folder = tmp_path / "marks"
    folder.mkdir()
    (folder / "noise.txt").write_bytes(codecs.BOM_UTF16_LE + b"\x00\xd8" * 40)  # lone surrogates
    (folder / "damaged.txt").write_bytes(codecs.BOM_UTF8 + "Café".encode() + b"\xff")
    out = tmp_path / "marks.parquet"
    r = ingest_folder(folder, out, ["*.txt"])
    assert [s.doc_id for s in r.skipped] == ["noise.txt"]
    assert r.skipped[0].reason.startswith("binary")
    assert _decoded(out)["damaged.txt"] == ("Café\ufffd", "utf-8", "lossy")
    assert r.lossy == ["damaged.txt"] and not r.guessed


def test_cli_names_every_guessed_file(tmp_path: Path) -> None:
    from docintel.jobs.cli import app

    folder = tmp_path / "news"
    folder.mkdir()
    (folder / "lloyds.txt").write_bytes(LATIN1_NEWS.encode("latin-1"))
    (folder / "tokyo.txt").write_bytes(JAPANESE.encode("shift_jis"))
    (folder / "plain.txt").write_text(ENGLISH, encoding="utf-8")
    out = tmp_path / "news.parquet"
    r = CliRunner().invoke(app, ["ingest", str(folder), str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "2 with a guessed encoding, listed on stderr" in r.stdout
    assert "warning: lloyds.txt: not UTF-8; decoded as cp1252, a guessed encoding" in r.stderr
    assert "warning: tokyo.txt: not UTF-8; decoded as shift_jis" in r.stderr
    assert "plain.txt" not in r.stderr
    given = CliRunner().invoke(
        app, ["ingest", str(folder), str(out), "--no-progress", "--encoding", "cp1252"]
    )
    assert given.exit_code == 0 and "a guessed encoding" not in given.stdout + given.stderr
