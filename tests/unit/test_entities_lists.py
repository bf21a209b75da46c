"""Watch lists in (issue 34): CSV and Parquet read, each bad list refused naming the file
and the line (CSV, header = line 1) or row index (Parquet), with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from docintel.pipeline.entities import Matcher, compile_lists, load_list
from docintel.pipeline.entities import lists as lists_module
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.exitcodes import ExitCode, exit_code

HEADER = "entity_id,name,aliases,type\n"


def write(tmp_path: Path, text: str, name: str = "pep.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refused(path: Path, *fragments: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_list(path)
    message = str(info.value)
    for fragment in (str(path), *fragments):
        assert fragment in message, message
    return info.value


def test_csv_read_with_aliases_and_types(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEADER + "P1,Hans Müller,Hans Mueller| H. Müller ||,person\nC2,Acme Corp,,\n",
    )
    wl = load_list(path)
    assert wl.name == "pep"
    assert wl.ids == ["P1", "C2"]
    assert wl.names == ["Hans Müller", "Acme Corp"]
    assert wl.aliases == [("Hans Mueller", "H. Müller"), ()]
    assert wl.types == ["person", ""]


def test_csv_without_optional_columns_and_with_a_bom(tmp_path: Path) -> None:
    path = tmp_path / "clients.csv"
    path.write_bytes("\ufeffname,entity_id\nAcme,1\n".encode())
    wl = load_list(path)
    assert (wl.name, wl.ids, wl.names, wl.aliases, wl.types) == (
        "clients",
        ["1"],
        ["Acme"],
        [()],
        [""],
    )


def test_same_id_same_name_merges_aliases(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "P1,Hans Müller,HM,person\nP1,Hans  Müller,H. Müller,\n")
    wl = load_list(path)
    assert wl.ids == ["P1"]
    assert wl.aliases == [("HM", "H. Müller")]


def test_parquet_read(tmp_path: Path) -> None:
    path = tmp_path / "sanctions.parquet"
    table = pa.table(
        {"entity_id": [10, 11], "name": ["Acme", "Zorvex"], "aliases": [None, "Zorvex AG"]}
    )
    pq.write_table(table, path)
    wl = load_list(path)
    assert (wl.name, wl.ids, wl.aliases) == ("sanctions", ["10", "11"], [(), ("Zorvex AG",)])
    matches = Matcher(compile_lists([path])).find("Zorvex AG sued Acme")
    assert [(m.entity_id, m.list) for m in matches] == [("11", "sanctions"), ("10", "sanctions")]


def test_parquet_aliases_as_a_list_column(tmp_path: Path) -> None:
    path = tmp_path / "pep.parquet"
    aliases = pa.array([["Hans Mueller", "H. Müller"], None], pa.list_(pa.string()))
    pq.write_table(
        pa.table({"entity_id": ["P1", "P2"], "name": ["Hans Müller", "Acme"], "aliases": aliases}),
        path,
    )
    assert load_list(path).aliases == [("Hans Mueller", "H. Müller"), ()]


def test_missing_column_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "id,name\nP1,Acme\n")
    error = refused(path, "line 1", "missing column(s) entity_id", "found: id, name")
    assert exit_code(error) == ExitCode.USAGE == 2


def test_missing_column_in_parquet_refused(tmp_path: Path) -> None:
    path = tmp_path / "pep.parquet"
    pq.write_table(pa.table({"entity_id": ["P1"], "label": ["Acme"]}), path)
    refused(path, "the schema", "missing column(s) name")


def test_empty_file_refused(tmp_path: Path) -> None:
    refused(write(tmp_path, ""), "line 1", "missing column(s) entity_id, name")


@pytest.mark.parametrize("name", ["", "   ", "!!! --"])
def test_empty_name_refused(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, HEADER + f"P1,Acme,,\nP2,{name},,\n")
    refused(path, "line 3", "P2")


def test_empty_name_in_parquet_refused_by_row_index(tmp_path: Path) -> None:
    path = tmp_path / "pep.parquet"
    pq.write_table(pa.table({"entity_id": ["P1", "P2", "P3"], "name": ["A", "B", None]}), path)
    refused(path, "row index 2", "empty name", "P3")


def test_empty_id_refused(tmp_path: Path) -> None:
    refused(write(tmp_path, HEADER + "P1,Acme,,\n,Zorvex,,\n"), "line 3", "empty entity_id")


def test_one_id_two_names_refused(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "P1,Acme,,\nP2,Zorvex,,\n\nP1,Acme Corp,,\n")
    refused(path, "line 5", "'P1'", "'Acme Corp'", "'Acme' at line 2")


def test_line_numbers_count_a_quoted_multiline_field(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + 'P1,Acme,"A|\nB",\nP2,,,\n')
    refused(path, "line 4", "P2")


def test_unreadable_file_refused(tmp_path: Path) -> None:
    refused(tmp_path / "absent.csv", "unreadable")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"entity_id,name\n1,\xff\xfe\x00bad\n")
    refused(binary, "unreadable")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    refused(broken, "unreadable")


def test_name_too_long_refused(tmp_path: Path) -> None:
    long_name = " ".join(["word"] * (lists_module.MAX_NAME_WORDS + 1))
    refused(write(tmp_path, HEADER + f"P1,{long_name},,\n"), "line 2", "more than 16")


def test_list_over_the_bound_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lists_module, "MAX_LIST_NAMES", 4)
    path = write(tmp_path, HEADER + "P1,A,B|C,\nP2,D,,\nP3,E,,\n")
    refused(path, "line 4", "more than 4 names and aliases")


def test_two_lists_with_one_name_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    first = write(tmp_path / "a", HEADER + "P1,Acme,,\n", name="pep.csv")
    second = write(tmp_path, HEADER + "P2,Zorvex,,\n", name="pep.csv")
    with pytest.raises(ConfigError, match="same name 'pep'"):
        compile_lists([first, second])
