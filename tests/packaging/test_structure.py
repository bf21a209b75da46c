"""Static structure of the code folders, read with ``ast`` (nothing under test is imported).

Why: the folders install as one namespace (``docintel.pipeline``, ``docintel.actors``,
``docintel.jobs``) and are layered: ``pipeline`` is the run definition (no Ray), ``actors``
runs it on Ray, ``jobs`` is the command line and job entry points on top. An import that
crosses a layer upwards, a cycle, or a bare ``import pipeline`` (which would load a second
copy of a module, or a user's own ``pipeline/`` folder) works in the editable checkout and
breaks elsewhere, so they are checked on the source.

Import rules: every ``import`` / ``from ... import`` counts, at module level or inside a
function, except inside ``if TYPE_CHECKING:`` blocks. ``from docintel.x import y`` is an
import of module ``docintel.x.y`` when that module exists, else of ``docintel.x``. A
package's ``__init__.py`` is the package module.

``bench/`` (benchmark scripts, not installed, outside the layering) is held to the same
function-length limit, and walks process trees in one module (bench/common.py).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO

NAMESPACE = "docintel"
SOURCE_FOLDERS = ("pipeline", "actors", "jobs")  # installed as docintel.<folder>
BARE_NAMES = frozenset({"pipeline", "actors", "jobs", "models"})
MAX_FUNCTION_LINES = 60  # in jobs/: entry points delegate, they do not grow a second pipeline
BENCH_FOLDER = "bench"  # benchmark scripts: the same function-length limit


@dataclass(frozen=True)
class Import:
    """One imported name: ``target`` is the module as written (absolute, dotted)."""

    source: str  # the importing module
    target: str
    path: Path
    line: int
    type_checking: bool  # inside an `if TYPE_CHECKING:` block
    level: int = 0  # relative import level as written (0 = absolute)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def module_name(path: Path) -> str:
    """``pipeline/stages/base.py`` -> ``docintel.pipeline.stages.base``; ``__init__`` -> package."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([NAMESPACE, *parts])


@cache
def source_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for folder in SOURCE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                files[module_name(path)] = path
    return files


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: -(level - 1)]
    return ".".join([*base, name] if name else base)


def scan_imports(source: str, tree: ast.Module, path: Path) -> list[Import]:
    """Every imported name of one module, with whether it sits under TYPE_CHECKING."""
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(source, alias.name, path, node.lineno, type_checking))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _resolve_relative(source, is_package, node.level, node.module)
            else:
                base = node.module or ""
            for alias in node.names:
                # the candidate submodule; resolve_target() falls back to the package
                target = base if alias.name == "*" else f"{base}.{alias.name}"
                found.append(Import(source, target, path, node.lineno, type_checking, node.level))
        for child in ast.iter_child_nodes(node):
            visit(child, type_checking)

    visit(tree, False)
    return found


@cache
def parsed(name: str) -> ast.Module:
    path = source_files()[name]
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@cache
def all_imports() -> tuple[Import, ...]:
    return tuple(
        imp
        for name, path in source_files().items()
        for imp in scan_imports(name, parsed(name), path)
    )


def resolve_target(target: str, modules: set[str]) -> str:
    """The project module an import loads: the longest known module prefix of ``target``
    (``docintel.x.y`` when it is a module, else ``docintel.x``)."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return target


def _is_in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def project_edges() -> dict[str, dict[str, list[str]]]:
    """module -> imported project module -> where (file:line); TYPE_CHECKING imports and
    self-imports excluded."""
    modules = set(source_files())
    graph: dict[str, dict[str, list[str]]] = {m: {} for m in modules}
    for imp in all_imports():
        if imp.type_checking or not _is_in(imp.target, NAMESPACE):
            continue
        dst = resolve_target(imp.target, modules)
        # A module importing itself (`from docintel.jobs.cli import main` under
        # `if __name__ == "__main__":`, where it runs as __main__) is no cycle among modules.
        if dst in modules and dst != imp.source:
            graph[imp.source].setdefault(dst, []).append(imp.where)
    return graph


def strongly_connected(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Tarjan's SCCs that are cycles: two or more members, or one that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1 or v in graph[v]:
                sccs.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sccs


def one_cycle(graph: dict[str, dict[str, list[str]]], members: list[str]) -> list[str]:
    """A shortest import cycle through the first member, inside its SCC (BFS)."""
    inside = set(members)
    start = members[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in inside:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start]


def _edge(graph: dict[str, dict[str, list[str]]], a: str, b: str) -> str:
    return f"  {a} -> {b}  ({', '.join(dict.fromkeys(graph[a][b]))})"


def describe_scc(graph: dict[str, dict[str, list[str]]], members: list[str]) -> str:
    """The members, one cycle through them, and every import edge inside the SCC."""
    cycle = one_cycle(graph, members)
    inside = [_edge(graph, a, b) for a in members for b in sorted(graph[a]) if b in members]
    return "\n".join(
        [
            f"cycle among {len(members)} modules: {', '.join(members)}",
            "one cycle: " + " -> ".join(cycle),
            *(_edge(graph, a, b) for a, b in itertools.pairwise(cycle)),
            "every import inside the cycle:",
            *inside,
        ]
    )


# --- the checker's own rules, on a snippet ---------------------------------------------------


def test_import_scanner_rules() -> None:
    code = (
        "from typing import TYPE_CHECKING\n"
        "import docintel.pipeline.config\n"
        "from docintel.pipeline import config, errors\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n"
        "    import docintel.jobs.cli\n"
        "else:\n"
        "    import docintel.jobs.run\n"
        "def f():\n"
        "    from docintel.actors.cluster import ray_session\n"
    )
    path = REPO / "pipeline" / "stages" / "x.py"
    imps = scan_imports("docintel.pipeline.stages.x", ast.parse(code), path)
    got = [(i.target, i.type_checking) for i in imps if i.target != "typing.TYPE_CHECKING"]
    assert got == [
        ("docintel.pipeline.config", False),
        ("docintel.pipeline.config", False),
        ("docintel.pipeline.errors", False),
        ("docintel.pipeline.stages.sibling", False),
        ("docintel.jobs.cli", True),
        ("docintel.jobs.run", False),
        ("docintel.actors.cluster.ray_session", False),
    ]
    modules = {"docintel.pipeline", "docintel.pipeline.config", "docintel.actors.cluster"}
    assert resolve_target("docintel.pipeline.errors", modules) == "docintel.pipeline"
    assert resolve_target("docintel.actors.cluster.ray_session", modules) == (
        "docintel.actors.cluster"
    )
    graph = {"a": {"b": ["a.py:1"]}, "b": {"c": ["b.py:1"]}, "c": {"a": ["c.py:1"]}, "d": {}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_source_folders_are_found() -> None:
    names = set(source_files())
    for folder in SOURCE_FOLDERS:
        assert any(_is_in(n, f"{NAMESPACE}.{folder}") for n in names), folder
    assert "docintel.pipeline" in names  # pipeline/__init__.py is the package module


# --- the checks ----------------------------------------------------------------------------


def test_no_import_cycle() -> None:
    graph = project_edges()
    sccs = strongly_connected(graph)
    if sccs:
        report_text = "\n\n".join(describe_scc(graph, members) for members in sccs)
        print(report_text)
        pytest.fail(f"import cycles (TYPE_CHECKING imports excluded):\n{report_text}")


LAYERS = [
    # (importing package, forbidden package, why)
    ("docintel.pipeline", "docintel.actors", "the run definition does not know Ray actors"),
    ("docintel.pipeline", "docintel.jobs", "the run definition does not know the CLI/jobs"),
    ("docintel.actors", "docintel.jobs", "actors do not know the CLI/jobs"),
    ("docintel.pipeline.stages", "docintel.pipeline.offline", "stages load artefacts only"),
]


def _violations(importer: str, forbidden: str) -> list[str]:
    return [
        f"{imp.where}: {imp.source} imports {imp.target}"
        for imp in all_imports()
        if not imp.type_checking and _is_in(imp.source, importer) and _is_in(imp.target, forbidden)
    ]


@pytest.mark.parametrize(("importer", "forbidden", "why"), LAYERS)
def test_layering(importer: str, forbidden: str, why: str) -> None:
    bad = _violations(importer, forbidden)
    assert not bad, f"{importer} must not import {forbidden} ({why}):\n" + "\n".join(bad)


def test_pipeline_never_imports_ray() -> None:
    bad = [
        f"{imp.where}: {imp.source} imports {imp.target}"
        for imp in all_imports()
        if not imp.type_checking
        and imp.level == 0
        and _is_in(imp.source, f"{NAMESPACE}.pipeline")
        and _is_in(imp.target, "ray")
    ]
    assert not bad, "docintel.pipeline must not import ray:\n" + "\n".join(bad)


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _long_in(path: Path, tree: ast.AST) -> list[str]:
    """Functions or methods (nested ones too) of one file spanning more than 60 lines,
    from the ``def`` line (decorators excluded) to the last line."""
    long: list[str] = []
    for fn in _functions(tree):
        assert fn.end_lineno is not None
        length = fn.end_lineno - fn.lineno + 1
        if length > MAX_FUNCTION_LINES:
            long.append(f"{path.relative_to(REPO)}:{fn.lineno} {fn.name}() {length} lines")
    return long


def _long_functions(*packages: str) -> list[str]:
    """Functions longer than MAX_FUNCTION_LINES in ``packages`` (of SOURCE_FOLDERS)."""
    long: list[str] = []
    for name, path in source_files().items():
        if any(_is_in(name, f"{NAMESPACE}.{p}") for p in packages):
            long += _long_in(path, parsed(name))
    return long


@cache
def bench_files() -> dict[Path, ast.Module]:
    """The benchmark scripts (bench/: not installed, not in the layering) and their trees."""
    return {
        path: ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for path in sorted((REPO / BENCH_FOLDER).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def test_jobs_functions_are_short() -> None:
    """Entry points delegate: they do not grow a second pipeline."""
    long = _long_functions("jobs")
    assert not long, f"functions in jobs/ longer than {MAX_FUNCTION_LINES} lines:\n" + "\n".join(
        long
    )


def test_no_bare_folder_imports() -> None:
    """`import pipeline` / `from jobs.x import y` load the folder as a second top-level
    package (or a user's own `pipeline/`), never docintel's module. TYPE_CHECKING included."""
    bad = [
        f"{imp.where}: {imp.source} imports {imp.target}"
        for imp in all_imports()
        if imp.level == 0 and imp.target.split(".")[0] in BARE_NAMES
    ]
    assert not bad, "bare folder imports (use docintel.<folder>):\n" + "\n".join(bad)


def test_pipeline_and_actors_functions_are_short() -> None:
    """A long function in pipeline/ or actors/ is a second pipeline growing in one step."""
    long = _long_functions("pipeline", "actors")
    assert not long, f"functions longer than {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_bench_functions_are_short() -> None:
    """The benchmarks print the tables of BENCHMARKS.md: each table, each measuring step
    its own function, so a change to one is reviewed as one."""
    files = bench_files()
    assert REPO / BENCH_FOLDER / "common.py" in files  # the checker sees bench/
    long = [line for path, tree in files.items() for line in _long_in(path, tree)]
    assert not long, f"functions in bench/ longer than {MAX_FUNCTION_LINES} lines:\n" + (
        "\n".join(long)
    )


def _tree_walks(tree: ast.AST) -> list[int]:
    """Lines calling psutil's process-tree walk: ``<proc>.children(recursive=...)``."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "children"
        and any(k.arg == "recursive" for k in node.keywords)
    ]


def test_bench_has_one_process_tree_sampler() -> None:
    """Process trees are walked and sampled in bench/common.py only (process_tree,
    cpu_seconds, TreeSampler): three copies of a sampler had drifted apart."""
    code = "p = psutil.Process(1)\nkids = p.children(recursive=True)\nother = p.children()\n"
    assert _tree_walks(ast.parse(code)) == [2]
    walks = {
        str(path.relative_to(REPO)): lines
        for path, tree in bench_files().items()
        if (lines := _tree_walks(tree))
    }
    assert list(walks) == [f"{BENCH_FOLDER}/common.py"], f"process-tree walks: {walks}"


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _modules_with_strings(match: Callable[[str], bool]) -> dict[str, list[str]]:
    """module -> file:line of every string literal (docstrings aside) that ``match``es."""
    found: dict[str, list[str]] = {}
    for name, path in source_files().items():
        tree = parsed(name)
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in skip
                and match(node.value)
            ):
                found.setdefault(name, []).append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


# One home per stage: each built-in stage's own module, plus three others: the registry,
# classify's cache subfolder name in artefacts/paths.py (an on-disk name), and the schema,
# where the entities stage's output column is called ``entities`` too.
def max_stage_name_modules() -> int:
    from docintel.pipeline.registry import BUILTIN_NAMES

    return len(BUILTIN_NAMES) + 3


def test_stage_names_are_spelled_in_few_modules() -> None:
    from docintel.pipeline.registry import BUILTIN_NAMES

    found = _modules_with_strings(lambda s: s in BUILTIN_NAMES)
    listing = "\n".join(f"{m}: {', '.join(w)}" for m, w in sorted(found.items()))
    most = max_stage_name_modules()
    assert len(found) <= most, (
        f"stage names {BUILTIN_NAMES} are spelled as string literals in {len(found)} modules "
        f"(at most {most}: the stages' own, the registry, paths, schema):\n{listing}"
    )


def test_part_file_naming_is_known_by_one_module() -> None:
    found = _modules_with_strings(lambda s: "part-" in s)
    listing = "\n".join(f"{m}: {', '.join(w)}" for m, w in sorted(found.items()))
    assert len(found) == 1, f"`part-` file naming is spelled in {len(found)} modules:\n{listing}"
