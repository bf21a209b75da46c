"""docintel.pipeline.parse: DOCX files made with python-docx (paragraphs, headings, a
list, a table), and the bad ones: not a zip, a damaged zip, a zip that is not a Word
document, zip bombs by declared size, by ratio and by a lying header."""

from __future__ import annotations

import io
import struct
import time
import zipfile

import pytest

from docintel.pipeline.parse import ParseLimits, parse_file, word_recall
from docintel.pipeline.parse.errors import (
    CorruptFile,
    NotAWordDocument,
    NotAZip,
    ParseError,
    ZipBomb,
)
from tests.data_make.parse_files import memo_docx, zip_bytes


def test_memo_paragraphs_headings_and_table_rows() -> None:
    made = memo_docx()
    [doc] = parse_file("memos/q3.docx", made.data)
    recall = word_recall(made.source, doc.text)
    print(f"docx recall {recall:.3f}")
    assert recall >= 0.97
    assert doc.text.split("\n\n") == made.paragraphs  # each heading, item and row apart
    assert "Industrial | 2.1 bn | 14%" in doc.text
    assert doc.title == "Memo: third-quarter results"  # no core title: the first heading
    assert (doc.source_format, doc.pages, doc.n_pages) == ("docx", None, None)


def test_core_title_wins_over_first_heading() -> None:
    [doc] = parse_file("q3.docx", memo_docx(title="Q3 board memo").data)
    assert doc.title == "Q3 board memo"


def test_merged_cells_appear_once() -> None:
    from docx import Document

    document = Document()
    table = document.add_table(rows=2, cols=3)
    merged = table.cell(0, 0).merge(table.cell(0, 2))
    merged.text = "Full-year totals"
    for cell, value in zip(table.rows[1].cells, ["a", "b", "c"], strict=True):
        cell.text = value
    buf = io.BytesIO()
    document.save(buf)
    [doc] = parse_file("t.docx", buf.getvalue())
    assert doc.text == "Full-year totals\n\na | b | c"


def test_paragraphs_inside_content_controls() -> None:
    """Word's cover pages wrap their paragraphs in a content control (w:sdt)."""
    from docx import Document
    from docx.oxml import OxmlElement

    document = Document()
    cover = document.add_paragraph("Prepared for the audit committee")
    document.add_paragraph("Body text follows the cover.")
    sdt, content = OxmlElement("w:sdt"), OxmlElement("w:sdtContent")
    cover._p.addprevious(sdt)
    sdt.append(content)
    content.append(cover._p)
    buf = io.BytesIO()
    document.save(buf)
    [doc] = parse_file("cover.docx", buf.getvalue())
    assert doc.text == "Prepared for the audit committee\n\nBody text follows the cover."


def test_docx_that_is_not_a_zip() -> None:
    with pytest.raises(NotAZip, match=r"^old\.docx: not a zip archive.*\.doc must be converted"):
        parse_file("old.docx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1 an old binary .doc" * 20)


def test_truncated_docx_is_corrupt() -> None:
    data = memo_docx().data
    with pytest.raises(CorruptFile, match=r"^cut\.docx: "):
        parse_file("cut.docx", data[: len(data) // 2])


def test_zip_without_word_part_is_not_a_word_document() -> None:
    data = zip_bytes({"xl/workbook.xml": b"<workbook/>", "[Content_Types].xml": b"<Types/>"})
    with pytest.raises(NotAWordDocument, match=r"word/document\.xml"):
        parse_file("sheet.docx", data)


def bomb(member_bytes: int, members: int = 1) -> bytes:
    """A zip holding word/document.xml and ``members`` members of zeros each inflating to
    ``member_bytes`` (deflate packs zeros ~1,000x)."""
    parts = {"word/document.xml": b"<w:document/>"}
    parts.update({f"word/media/pad{i}.bin": bytes(member_bytes) for i in range(members)})
    return zip_bytes(parts)


def test_zip_bomb_by_total_size_is_refused_before_inflating() -> None:
    data = bomb(64 * 1024 * 1024)
    assert len(data) < 200_000  # 64 MiB of zeros in under 200 KB
    started = time.perf_counter()
    with pytest.raises(ZipBomb, match=r"inflates to 67,108,877 bytes, over the 33,554,432"):
        parse_file("bomb.docx", data, ParseLimits(max_uncompressed_bytes=32 * 1024 * 1024))
    assert time.perf_counter() - started < 1.0  # refused by the directory, not inflated


def test_zip_bomb_by_ratio_is_refused_under_the_default_limits() -> None:
    with pytest.raises(ZipBomb, match=r"word/media/pad0\.bin inflates 1,0\d\dx, over 200x"):
        parse_file("bomb.docx", bomb(16 * 1024 * 1024))


def test_zip_with_a_lying_size_is_refused_while_reading() -> None:
    """The central directory and local header claim 100 bytes; the member inflates to
    8 MiB: the read stops at the declared size and the file is refused."""
    data = bytearray(bomb(8 * 1024 * 1024))
    name = b"word/media/pad0.bin"
    local = data.find(name) - 30  # the local header: 30 bytes, then the name
    central = data.find(name, local + 30 + len(name)) - 46  # the directory entry: 46, name
    assert data[local : local + 4] == b"PK\x03\x04" and data[central : central + 4] == b"PK\x01\x02"
    struct.pack_into("<I", data, local + 22, 100)  # uncompressed size
    struct.pack_into("<I", data, central + 24, 100)
    with pytest.raises(ParseError) as info:
        parse_file("liar.docx", bytes(data))
    assert isinstance(info.value, (ZipBomb, CorruptFile))
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as zf:  # the lie took
        assert zf.getinfo("word/media/pad0.bin").file_size == 100
