"""Input resolution, planning, id checks and reading, on real Parquet files in tmp_path."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from docintel.pipeline.config import StorageConfig
from docintel.pipeline.errors import InputError
from docintel.pipeline.input.source import check_ids, plan, read_unit, resolve_input, split_readable
from docintel.pipeline.schema import DOC_ID, ERRORS_SCHEMA, TEXT

STORAGE = StorageConfig()  # defaults: these tests read local files only


def _docs(n: int, prefix: str = "d") -> pa.Table:
    return pa.table(
        {
            DOC_ID: [f"{prefix}{i:03d}" for i in range(n)],
            TEXT: [f"Document {i} says revenue rose {i}%." for i in range(n)],
        }
    )


def _write(path: Path, table: pa.Table, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **kw)
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A nested input folder with files that must and must not be picked up."""
    root = tmp_path / "in"
    _write(root / "a.parquet", _docs(3, "a"))
    _write(root / "sub" / "b.parquet", _docs(3, "b"))
    _write(root / "sub" / "deep" / "c.parquet", _docs(3, "c"))
    _write(root / "sub" / "d.parq", _docs(2, "d"))
    _write(root / ".hidden.parquet", _docs(1, "h"))
    _write(root / "_metadata.parquet", _docs(1, "m"))
    _write(root / ".cache" / "e.parquet", _docs(1, "e"))
    _write(root / "_tmp" / "f.parquet", _docs(1, "f"))
    (root / "README.rst").write_text("not parquet, and no document type docintel reads")
    (root / "sub" / "notes.csv").write_text("doc_id,text\n1,x\n")
    return root


def _rel(files, root: Path) -> list[str]:
    return [os.path.relpath(f.path, root) for f in files]


def test_resolve_single_file(tree):
    fs, files = resolve_input(str(tree / "a.parquet"), STORAGE)
    assert len(files) == 1
    f = files[0]
    assert f.uri == str(tree / "a.parquet")
    assert f.path == str(tree / "a.parquet")
    assert f.size == (tree / "a.parquet").stat().st_size
    assert fs.get_file_info(f.path).size == f.size


def test_resolve_folder_is_recursive_and_skips_hidden_underscore_and_other_files(tree):
    _, files = resolve_input(str(tree), STORAGE)
    assert _rel(files, tree) == ["a.parquet", "sub/b.parquet", "sub/d.parq", "sub/deep/c.parquet"]
    # a trailing slash means the same folder
    _, again = resolve_input(str(tree) + "/", STORAGE)
    assert _rel(again, tree) == _rel(files, tree)
    assert len({f.key for f in files}) == len(files)


def test_resolve_relative_folder(tree, monkeypatch):
    monkeypatch.chdir(tree.parent)
    _, files = resolve_input("in/sub", STORAGE)
    assert _rel(files, tree / "sub") == ["b.parquet", "d.parq", "deep/c.parquet"]


def test_resolve_glob(tree):
    _, files = resolve_input(str(tree / "sub" / "*.parq"), STORAGE)
    assert _rel(files, tree / "sub") == ["d.parq"]
    _, files = resolve_input(str(tree / "**" / "c.parquet"), STORAGE)
    assert _rel(files, tree) == ["sub/deep/c.parquet"]
    _, files = resolve_input(str(tree / "sub" / "[bd].parq*"), STORAGE)
    assert _rel(files, tree / "sub") == ["b.parquet", "d.parq"]


def test_glob_star_does_not_descend_into_subfolders(tree):
    """``in/*.parquet`` means the Parquet files directly in ``in/`` (shell and pathlib
    semantics), not every Parquet file below it."""
    _, files = resolve_input(str(tree / "*.parquet"), STORAGE)
    assert _rel(files, tree) == ["a.parquet"]


def test_glob_skips_hidden_and_underscore_files(tree):
    _, files = resolve_input(str(tree / "**.parquet"), STORAGE)
    rel = _rel(files, tree)
    assert ".hidden.parquet" not in rel
    assert "_metadata.parquet" not in rel
    assert not any(r.startswith((".cache", "_tmp")) for r in rel)


@pytest.mark.parametrize("suffix", ["nope", "nope.parquet", "nope/*.parquet"])
def test_missing_input_raises_input_error(tmp_path, suffix):
    uri = str(tmp_path / suffix)
    with pytest.raises(InputError, match=re.escape(uri)):
        resolve_input(uri, STORAGE)


def test_folder_without_parquet_raises_input_error(tmp_path):
    (tmp_path / "x.csv").write_text("hello")
    with pytest.raises(InputError, match="no Parquet files or documents"):
        resolve_input(str(tmp_path), STORAGE)
    with pytest.raises(InputError, match=re.escape("'*.json'")):
        resolve_input(str(tmp_path / "*.json"), STORAGE)


def test_plan_missing_text_column_names_file_column_and_existing_columns(tmp_path):
    path = _write(
        tmp_path / "docs.parquet", pa.table({DOC_ID: ["a"], "body": ["x"], "lang": ["en"]})
    )
    fs, files = resolve_input(str(path), STORAGE)
    with pytest.raises(InputError) as exc:
        plan(fs, files, DOC_ID, TEXT, 10)
    msg = str(exc.value)
    assert str(path) in msg
    assert repr(TEXT) in msg
    assert "--text-column" in msg
    for col in (DOC_ID, "body", "lang"):
        assert col in msg


def test_plan_missing_id_column(tmp_path):
    path = _write(tmp_path / "docs.parquet", pa.table({"uuid": ["a"], TEXT: ["x"]}))
    fs, files = resolve_input(str(path), STORAGE)
    with pytest.raises(InputError, match="--id-column") as exc:
        plan(fs, files, DOC_ID, TEXT, 10)
    assert "uuid" in str(exc.value)


def test_plan_float_id_column_is_refused(tmp_path):
    path = _write(tmp_path / "docs.parquet", pa.table({DOC_ID: [1.5], TEXT: ["x"]}))
    fs, files = resolve_input(str(path), STORAGE)
    with pytest.raises(InputError, match="double"):
        plan(fs, files, DOC_ID, TEXT, 10)


@pytest.mark.parametrize("content", [os.urandom(2048), b"", b"PAR1 but not really"])
def test_non_parquet_file_raises_input_error_naming_it(tmp_path, content):
    path = tmp_path / "junk.parquet"
    path.write_bytes(content)
    fs, files = resolve_input(str(path), STORAGE)
    with pytest.raises(InputError, match=re.escape(str(path))):
        plan(fs, files, DOC_ID, TEXT, 10)
    with pytest.raises(InputError, match=re.escape(str(path))):
        check_ids(fs, files, DOC_ID)


def test_batches_are_deterministic_unique_and_cover_every_row(tmp_path):
    _write(tmp_path / "in" / "one.parquet", _docs(23, "x"), row_group_size=5)
    _write(tmp_path / "in" / "two" / "two.parquet", _docs(7, "y"), row_group_size=4)
    fs, files = resolve_input(str(tmp_path / "in"), STORAGE)
    units = plan(fs, files, DOC_ID, TEXT, batch_size=2)
    again = plan(*resolve_input(str(tmp_path / "in"), STORAGE), DOC_ID, TEXT, batch_size=2)
    ids = [b for u in units for b in u.batch_ids]
    assert ids == [b for u in again for b in u.batch_ids]
    assert len(ids) == len(set(ids))
    # row groups 5,5,5,5,3 and 4,3 rows; 2 per batch
    assert [u.n_rows for u in units] == [5, 5, 5, 5, 3, 4, 3]
    assert [len(u.batch_ids) for u in units] == [3, 3, 3, 3, 2, 2, 2]
    assert sum(u.n_rows for u in units) == 30

    seen_ids: list[str] = []
    for u in units:
        batches = read_unit(fs, u, DOC_ID, TEXT, batch_size=2)
        assert [b.batch_id for b in batches] == list(u.batch_ids)
        for b in batches:
            assert 1 <= b.n_docs <= 2
            assert b.table[DOC_ID].to_pylist() == b.doc_ids.to_pylist()
            assert b.errors.num_rows == 0
            seen_ids += b.doc_ids.to_pylist()
    expected = [f"x{i:03d}" for i in range(23)] + [f"y{i:03d}" for i in range(7)]
    assert seen_ids == expected


def test_batch_ids_do_not_depend_on_where_the_folder_lives(tmp_path):
    for name in ("run1", "run2"):
        _write(tmp_path / name / "part" / "f.parquet", _docs(4), row_group_size=2)
    ids = []
    for name in ("run1", "run2"):
        units = plan(*resolve_input(str(tmp_path / name), STORAGE), DOC_ID, TEXT, batch_size=3)
        ids.append([b for u in units for b in u.batch_ids])
    assert ids[0] == ids[1]


def test_check_ids_counts_documents(tmp_path):
    _write(tmp_path / "in" / "a.parquet", _docs(4, "a"))
    _write(
        tmp_path / "in" / "b.parquet",
        pa.table({DOC_ID: pa.array([1, 2, 3], pa.int64()), TEXT: ["x", "y", "z"]}),
    )
    fs, files = resolve_input(str(tmp_path / "in"), STORAGE)
    assert check_ids(fs, files, DOC_ID) == 7


def test_check_ids_duplicate_within_a_file(tmp_path):
    path = _write(
        tmp_path / "a.parquet",
        pa.table({DOC_ID: ["keep-1", "dup-7", "keep-2", "dup-7"], TEXT: ["a", "b", "c", "d"]}),
    )
    fs, files = resolve_input(str(path), STORAGE)
    with pytest.raises(InputError, match="'dup-7' x2") as exc:
        check_ids(fs, files, DOC_ID)
    assert "keep-1" not in str(exc.value)


def test_check_ids_duplicate_across_files(tmp_path):
    _write(tmp_path / "in" / "a.parquet", pa.table({DOC_ID: ["same", "a1"], TEXT: ["a", "b"]}))
    _write(tmp_path / "in" / "b.parquet", pa.table({DOC_ID: ["b1", "same"], TEXT: ["c", "d"]}))
    fs, files = resolve_input(str(tmp_path / "in"), STORAGE)
    with pytest.raises(InputError, match="'same'") as exc:
        check_ids(fs, files, DOC_ID)
    assert str(tmp_path / "in" / "a.parquet") in str(exc.value)


def test_check_ids_integer_and_string_forms_collide(tmp_path):
    # doc ids are strings in the output: 7 and "7" would be the same row
    _write(
        tmp_path / "in" / "a.parquet",
        pa.table({DOC_ID: pa.array([7, 8], pa.int64()), TEXT: ["a", "b"]}),
    )
    _write(tmp_path / "in" / "b.parquet", pa.table({DOC_ID: ["7"], TEXT: ["c"]}))
    fs, files = resolve_input(str(tmp_path / "in"), STORAGE)
    with pytest.raises(InputError, match="'7'"):
        check_ids(fs, files, DOC_ID)


def test_check_ids_null_raises(tmp_path):
    path = _write(
        tmp_path / "a.parquet", pa.table({DOC_ID: ["a", None, "c"], TEXT: ["x", "y", "z"]})
    )
    fs, files = resolve_input(str(path), STORAGE)
    with pytest.raises(InputError, match="null") as exc:
        check_ids(fs, files, DOC_ID)
    assert "row 1" in str(exc.value)
    assert str(path) in str(exc.value)


def test_read_unit_invalid_utf8_becomes_an_error_row(tmp_path):
    texts = [
        b"Fine text. Two sentences.",
        b"caf\xc3\xa9 is UTF-8",
        b"bad \xff\xfe bytes",
        None,
        b"last",
    ]
    path = _write(
        tmp_path / "bin.parquet",
        pa.table({DOC_ID: ["a", "b", "bad", "null", "e"], TEXT: pa.array(texts, pa.binary())}),
    )
    fs, files = resolve_input(str(path), STORAGE)
    (unit,) = plan(fs, files, DOC_ID, TEXT, 10)
    (batch,) = read_unit(fs, unit, DOC_ID, TEXT, 10)
    assert batch.doc_ids.to_pylist() == ["a", "b", "bad", "null", "e"]
    assert batch.table.schema.field(TEXT).type == pa.string()
    assert batch.table[DOC_ID].to_pylist() == ["a", "b", "null", "e"]
    assert batch.table[TEXT].to_pylist() == [
        "Fine text. Two sentences.",
        "café is UTF-8",
        None,
        "last",
    ]
    assert batch.errors.schema == ERRORS_SCHEMA
    (err,) = batch.errors.to_pylist()
    assert err[DOC_ID] == "bad"
    assert err["stage"] == "read"
    assert err["error_type"] == "UnicodeDecodeError"
    assert str(path) in err["message"]
    assert err["batch_id"] == batch.batch_id


def test_read_unit_integer_text_column_makes_every_doc_an_error(tmp_path):
    path = _write(
        tmp_path / "ints.parquet",
        pa.table({DOC_ID: ["a", "b", "c"], "body": pa.array([1, 2, 3], pa.int64())}),
    )
    fs, files = resolve_input(str(path), STORAGE)
    (unit,) = plan(fs, files, DOC_ID, "body", 10)
    (batch,) = read_unit(fs, unit, DOC_ID, "body", 10)
    assert batch.table.num_rows == 0
    assert batch.doc_ids.to_pylist() == ["a", "b", "c"]
    errs = batch.errors.to_pylist()
    assert [e[DOC_ID] for e in errs] == ["a", "b", "c"]
    for e in errs:
        assert e["stage"] == "read"
        assert e["error_type"] == "TypeError"
        assert "'body'" in e["message"]
        assert "int64" in e["message"]


def test_read_unit_integer_ids_become_strings(tmp_path):
    path = _write(
        tmp_path / "ids.parquet",
        pa.table({DOC_ID: pa.array([10, 2, 300], pa.int64()), TEXT: ["x", "y", "z"]}),
    )
    fs, files = resolve_input(str(path), STORAGE)
    (unit,) = plan(fs, files, DOC_ID, TEXT, 2)
    batches = read_unit(fs, unit, DOC_ID, TEXT, 2)
    assert [b.doc_ids.to_pylist() for b in batches] == [["10", "2"], ["300"]]
    for b in batches:
        assert b.doc_ids.type == pa.string()
        assert b.table.schema.field(DOC_ID).type == pa.string()


def test_read_unit_dictionary_and_large_string_columns(tmp_path):
    table = pa.table(
        {
            DOC_ID: pa.array(["a", "b"]).dictionary_encode(),
            TEXT: pa.array(["One.", "Two."], pa.large_string()),
        }
    )
    path = _write(tmp_path / "dict.parquet", table)
    fs, files = resolve_input(str(path), STORAGE)
    (unit,) = plan(fs, files, DOC_ID, TEXT, 10)
    (batch,) = read_unit(fs, unit, DOC_ID, TEXT, 10)
    assert batch.doc_ids.to_pylist() == ["a", "b"]
    assert batch.table[TEXT].to_pylist() == ["One.", "Two."]
    assert batch.table.schema.field(TEXT).type == pa.string()


def test_many_tiny_row_groups_are_read_by_few_units(tmp_path):
    """2,000 one-row row groups: units merge them up to a batch, so a read task parses the
    footer once per batch, not once per row group; every row is read exactly once."""
    path = _write(tmp_path / "tiny.parquet", _docs(2000), row_group_size=1)
    assert pq.ParquetFile(path).metadata.num_row_groups == 2000
    fs, files = resolve_input(str(path), STORAGE)
    files, _ = split_readable(fs, files)
    units = plan(fs, files, DOC_ID, TEXT, batch_size=128)
    assert len(units) == 16  # ceil(2000 / 128)
    assert all(len(u.batch_ids) == 1 for u in units)
    assert [u.row_groups[0] for u in units[:2]] == [0, 128]
    seen = [d for u in units for b in read_unit(fs, u, DOC_ID, TEXT, 128) for d in b.doc_ids]
    assert [d.as_py() for d in seen] == [f"d{i:03d}" for i in range(2000)]


def test_batch_ids_carry_the_files_identity_not_only_its_name(tmp_path):
    """Two different inputs with the same file name never share batch ids."""
    _write(tmp_path / "one" / "f.parquet", _docs(4, "a"), row_group_size=2)
    _write(tmp_path / "two" / "f.parquet", _docs(4, "b"), row_group_size=2)
    keys = []
    for name in ("one", "two"):
        fs, files = resolve_input(str(tmp_path / name), STORAGE)
        files, _ = split_readable(fs, files)
        keys.append({b for u in plan(fs, files, DOC_ID, TEXT, 2) for b in u.batch_ids})
    assert not keys[0] & keys[1]


def test_a_corrupt_row_group_in_a_merged_unit_spoils_only_its_own_documents(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(_docs(6), path, row_group_size=2, compression="none")
    offset = pq.ParquetFile(path).metadata.row_group(1).column(1).data_page_offset
    raw = bytearray(path.read_bytes())
    raw[offset : offset + 12] = b"\xff" * 12  # smash row group 1's text page header
    path.write_bytes(bytes(raw))
    fs, files = resolve_input(str(path), STORAGE)
    files, _ = split_readable(fs, files)
    units = plan(fs, files, DOC_ID, TEXT, batch_size=6)
    assert [u.row_groups for u in units] == [(0, 1, 2)]  # merged up to a batch
    (batch,) = read_unit(fs, units[0], DOC_ID, TEXT, 6)
    assert batch.errors[DOC_ID].to_pylist() == ["d002", "d003"]
    assert set(batch.errors["error_type"].to_pylist()) == {"CorruptData"}
    assert "c.parquet (row group 1)" in batch.errors["message"][0].as_py()
    assert batch.table[DOC_ID].to_pylist() == ["d000", "d001", "d004", "d005"]


def test_an_oversized_id_is_refused_naming_file_and_row(tmp_path):
    ids = ["ok-1", "x" * 5000, "ok-2"]
    path = _write(tmp_path / "ids.parquet", pa.table({DOC_ID: ids, TEXT: ["a", "b", "c"]}))
    fs, files = resolve_input(str(path), STORAGE)
    with pytest.raises(InputError, match=r"ids\.parquet.*row 1 is 5,000 bytes.*max_id_bytes"):
        check_ids(fs, files, DOC_ID, max_id_bytes=1024)
    assert check_ids(fs, files, DOC_ID, max_id_bytes=5000) == 3


def test_a_huge_row_group_is_read_in_streamed_slices(tmp_path, monkeypatch):
    """A row group over UNIT_BYTES is cut into units of whole batches, each streamed from
    the row group (never read whole); batch ids are those of the uncut row group."""
    from docintel.pipeline.input import source

    path = _write(tmp_path / "big.parquet", _docs(100), row_group_size=100)
    fs, files = resolve_input(str(path), STORAGE)
    files, _ = split_readable(fs, files)
    whole = plan(fs, files, DOC_ID, TEXT, batch_size=10)
    assert len(whole) == 1 and not whole[0].streamed
    size = pq.ParquetFile(path).metadata.row_group(0).total_byte_size
    monkeypatch.setattr(source, "UNIT_BYTES", size // 3)  # ~3 batches' worth per unit
    monkeypatch.setattr(source, "STREAM_ROWS", 7)  # record batches across batch bounds
    units = plan(fs, files, DOC_ID, TEXT, batch_size=10)
    assert len(units) > 1 and all(u.streamed for u in units)
    assert [b for u in units for b in u.batch_ids] == list(whole[0].batch_ids)
    assert "rows 0-" in units[0].where
    read = [b for u in units for b in read_unit(fs, u, DOC_ID, TEXT, 10)]
    assert [b.batch_id for b in read] == list(whole[0].batch_ids)
    assert [d for b in read for d in b.doc_ids.to_pylist()] == [f"d{i:03d}" for i in range(100)]
    assert all(b.errors.num_rows == 0 and b.n_docs == 10 for b in read)


def test_a_corrupt_huge_row_group_becomes_error_rows_slice_by_slice(tmp_path, monkeypatch):
    from docintel.pipeline.input import source

    path = tmp_path / "bigbad.parquet"
    pq.write_table(_docs(60), path, row_group_size=60, compression="none")
    md = pq.ParquetFile(path).metadata.row_group(0)
    raw = bytearray(path.read_bytes())
    offset = md.column(1).data_page_offset
    raw[offset : offset + 12] = b"\xff" * 12
    path.write_bytes(bytes(raw))
    monkeypatch.setattr(source, "UNIT_BYTES", md.total_byte_size // 3)
    fs, files = resolve_input(str(path), STORAGE)
    files, _ = split_readable(fs, files)
    units = plan(fs, files, DOC_ID, TEXT, batch_size=10)
    assert len(units) > 1
    batches = [b for u in units for b in read_unit(fs, u, DOC_ID, TEXT, 10)]
    errors = [e for b in batches for e in b.errors.to_pylist()]
    assert sorted(e[DOC_ID] for e in errors) == [f"d{i:03d}" for i in range(60)]
    assert {e["error_type"] for e in errors} == {"CorruptData"}
    assert all(b.table.num_rows == 0 for b in batches)


def test_batches_sized_by_text_bytes(tmp_path):
    """An "auto" batch size with GPU pools: about target bytes of text per batch (from the
    footers), at least the CPU batch size, at most MAX_BATCH_DOCS documents."""
    from docintel.pipeline.input.source import MAX_BATCH_DOCS, plan_sized

    texts = [f"{i:06d} " + "x" * 93 for i in range(4_000)]  # 100 bytes each, unique
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"doc_id": [f"d{i}" for i in range(4_000)], "text": texts}),
        path,
        row_group_size=4_000,
        use_dictionary=False,
    )
    fs, files = resolve_input(str(path), StorageConfig())
    units, size = plan_sized(fs, files, "doc_id", "text", 128, target_bytes=100_000)
    assert 900 <= size <= 1_000  # ~1,000 documents of ~100 bytes (+ length prefixes)
    assert sum(len(u.batch_ids) for u in units) == -(-4_000 // size)
    _, cpu = plan_sized(fs, files, "doc_id", "text", 128)  # no target: as given
    assert cpu == 128
    _, small = plan_sized(fs, files, "doc_id", "text", 128, target_bytes=1_000)
    assert small == 128  # never below the CPU batch size
    _, big = plan_sized(fs, files, "doc_id", "text", 128, target_bytes=1 << 40)
    assert big == MAX_BATCH_DOCS


def test_document_files_are_listed_with_their_relative_paths(tree: Path, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    for name in ("b.pdf", "a/memo.docx", "a/page.HTM", "mail.eml", "notes.md", "x.txt"):
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_bytes(b"x")
    (docs / "image.png").write_bytes(b"x")  # not a document type: left out
    _, files = resolve_input(str(docs), STORAGE)
    assert [f.rel for f in files] == ["a/memo.docx", "a/page.HTM", "b.pdf", "mail.eml",
                                      "notes.md", "x.txt"]  # fmt: skip
    assert all(f.document for f in files)
    _, one = resolve_input(str(docs / "b.pdf"), STORAGE)
    assert one[0].rel == "b.pdf" and one[0].document
    _, globbed = resolve_input(str(docs / "**" / "*.docx"), STORAGE)
    assert [f.rel for f in globbed] == ["a/memo.docx"]


def test_a_mix_of_parquet_and_documents_is_refused_naming_both(tree: Path) -> None:
    (tree / "sub" / "memo.txt").write_text("a memo")
    with pytest.raises(InputError, match=r"mixes Parquet files \(a\.parquet.*memo\.txt"):
        resolve_input(str(tree), STORAGE)
