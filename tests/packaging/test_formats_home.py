"""Issue 30: one home per table format. A format's name is spelled (as code, not in a
docstring) in at most three modules; only pipeline/formats/ imports a format's own
module (the run, the audit and search ask the registry); the registry's formats are the
ones ``[output] format`` accepts, each detected from its own markers."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from docintel.pipeline import formats
from docintel.pipeline.config import load_config
from docintel.pipeline.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CODE = ("pipeline", "actors", "jobs")
MAX_MODULES = 3
FORMAT_MODULES = {"iceberg", "delta", "warehouse"}  # parquet's helpers serve latest/ too


def _modules() -> list[tuple[Path, ast.Module]]:
    return [
        (p, ast.parse(p.read_text(encoding="utf-8")))
        for d in CODE
        for p in (REPO / d).rglob("*.py")
    ]


def _docstrings(tree: ast.Module) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, kinds) and n.body and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }  # fmt: skip


def test_a_format_name_is_code_in_at_most_three_modules() -> None:
    for name in formats.names():
        spelled = set()
        for path, tree in _modules():
            docs = _docstrings(tree)
            for n in ast.walk(tree):
                if (
                    isinstance(n, ast.Constant)
                    and isinstance(n.value, str)
                    and id(n) not in docs
                    and n.value.strip().lower() == name
                ):
                    spelled.add(str(path.relative_to(REPO)))
        assert len(spelled) <= MAX_MODULES, f"{name!r} is spelled in {sorted(spelled)}"


def test_only_the_formats_package_imports_a_format_module() -> None:
    for path, tree in _modules():
        if path.parent.name == "formats":
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module:
                parts = n.module.split(".")
                if "formats" in parts and set(parts[parts.index("formats") + 1 :]) & FORMAT_MODULES:
                    raise AssertionError(f"{path.relative_to(REPO)} imports {n.module}")


def test_the_registry_is_what_the_config_accepts(tmp_path: Path) -> None:
    for name in formats.names():
        assert load_config(None, {"output.format": name}).output.format == name
        assert formats.get(name).name == name
    with pytest.raises(ConfigError, match=r"delta, iceberg, parquet"):
        formats.get("orc")
    with pytest.raises(ConfigError):
        load_config(None, {"output.format": "orc"})
    fs = pafs.LocalFileSystem()
    assert formats.detect(fs, str(tmp_path / "none")) is None
    (tmp_path / "p" / "documents").mkdir(parents=True)
    assert formats.detect(fs, str(tmp_path / "p")) is formats.get("parquet")
    (tmp_path / "p" / "documents" / "_delta_log").mkdir()
    assert formats.detect(fs, str(tmp_path / "p")) is formats.get("delta")
    (tmp_path / "i" / "_catalog.db").parent.mkdir()
    (tmp_path / "i" / "_catalog.db").write_bytes(b"")
    assert formats.detect(fs, str(tmp_path / "i")) is formats.get("iceberg")
