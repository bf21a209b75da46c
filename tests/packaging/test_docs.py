"""The documentation fits and points at things that exist (fast: files only, no Ray).

README.md stays a short entry point (what docintel is, the two commands, a tour, links);
the reference lives in docs/. A link in README.md or a docs/ page leads to a file (and, for
a Markdown page, a heading) that is there; the code cites only Markdown files that exist;
the benchmark reports name only repository files that exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

README_MAX_LINES = 400
DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CODE_FOLDERS = ("pipeline", "actors", "jobs", "bench")
BENCH_REPORTS = [REPO / "BENCHMARKS.md", *sorted((REPO / "bench").glob("*.md"))]
REPO_FOLDERS = ("pipeline", "actors", "jobs", "bench", "tests", "data", "models", "infra", "docs")

# [text](target) and ![alt](target); the target ends at whitespace or ")"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# a Markdown file path in code: `docs/design.md`, README.md, bench/spill.md; not a glob
# (*.md), not a suffix alone (.txt/.md), not part of a longer path (/tmp/x.md)
MD_CITATION = re.compile(r"(?<![\w*./-])((?:[\w.-]+/)*[\w-][\w.-]*\.md)\b(?![\w/])")
# what a benchmark writes is not a citation: --output-md FILE
OUTPUT_OPTION = re.compile(r"--output-md[ =]$")
# a repository file in a benchmark report: `pipeline/run/slices.py`, bench/spill.md (a file
# name with its extension, so "docs/s" the unit is not one)
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:" + "|".join(REPO_FOLDERS) + r")/[\w./-]*\.[a-z]+)(?![\w/*-])"
)


def _outside_code_blocks(text: str) -> list[str]:
    """The lines of a Markdown text that are not inside a fenced code block."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as
    dashes; a repeated heading gets -1, -2..."""
    anchors: set[str] = set()
    count: dict[str, int] = {}
    for line in _outside_code_blocks(page.read_text(encoding="utf-8")):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        n = count.get(slug, 0)
        anchors.add(f"{slug}-{n}" if n else slug)
        count[slug] = n + 1
    return anchors


def _links(page: Path) -> list[str]:
    text = "\n".join(_outside_code_blocks(page.read_text(encoding="utf-8")))
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return LINK.findall(text)


def test_readme_is_short() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move reference "
        "material to a docs/ page and link it"
    )


def test_readme_keeps_the_two_commands() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text  # CI greps for `make test`


def test_the_reference_pages_exist() -> None:
    pages = {p.name for p in DOC_PAGES}
    for name in ("design.md", "configuration.md", "output-formats.md", "security.md"):
        assert name in pages, f"docs/{name} is missing"


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a file
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(REPO)})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(REPO)})")
    assert not broken, f"{page.relative_to(REPO)}: broken links: {broken}"


def _md_citations(path: Path) -> list[str]:
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        for m in MD_CITATION.finditer(line):
            if not OUTPUT_OPTION.search(line[: m.start()]):
                found.append(m.group(1))
    return found


def test_code_cites_only_markdown_files_that_exist() -> None:
    missing = []
    for folder in CODE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for cited in _md_citations(path):
                if not ((REPO / cited).exists() or (path.parent / cited).exists()):
                    missing.append(f"{path.relative_to(REPO)}: {cited}")
    assert not missing, f"citations of Markdown files that do not exist: {missing}"


def test_the_citation_pattern_reads_what_code_writes() -> None:
    line = 'see docs/design.md and README.md; not "*.md", ".txt/.md" or /tmp/x.md'
    assert [m.group(1) for m in MD_CITATION.finditer(line)] == ["docs/design.md", "README.md"]
    assert OUTPUT_OPTION.search("python bench/x.py --output-md ")  # what follows: an output


@pytest.mark.parametrize("report", BENCH_REPORTS, ids=lambda p: str(p.relative_to(REPO)))
def test_benchmark_reports_name_files_that_exist(report: Path) -> None:
    text = report.read_text(encoding="utf-8")
    missing = sorted({p for p in REPO_PATH.findall(text) if not (REPO / p).exists()})
    assert not missing, f"{report.relative_to(REPO)} names files that are not there: {missing}"
