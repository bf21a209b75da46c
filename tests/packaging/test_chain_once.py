"""The stage chain is resolved in few places (read with ``ast``: nothing is imported).

Why: ``registry.chain(cfg)`` imports user stages' modules, checks the chain and builds its
specs. A run resolves it once, in the plan (``prepare``), and everything downstream reads
the plan's :class:`~docintel.pipeline.registry.Chain`: layouts, replica builds, split
caps, artefacts, the user stages shipped to the workers. A new ``chain(`` call site is a
second resolution somewhere on that path; the few left are named here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

SOURCE_FOLDERS = ("pipeline", "actors", "jobs")
# registry.check_config (the run's one resolution, in prepare()), registry.resolve (the
# default of callers outside a run: `docintel quantize`, the audit's model checks), and
# the audit's tables (stage names of the audited output's config).
MAX_CHAIN_CALL_SITES = 3


def chain_call_sites() -> list[str]:
    """``path:line`` of every call of a function named ``chain`` (``chain(...)`` or
    ``<anything>.chain(...)``) in the code folders."""
    sites = []
    for folder in SOURCE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name == "chain":
                    sites.append(f"{Path(path).relative_to(REPO)}:{node.lineno}")
    return sites


def test_the_chain_is_resolved_in_few_places() -> None:
    sites = chain_call_sites()
    assert sites, "the scanner finds registry.check_config's call"
    assert len(sites) <= MAX_CHAIN_CALL_SITES, (
        "registry.chain(cfg) is called at "
        + ", ".join(sites)
        + ": pass the plan's resolved chain (Plan.chain) instead of resolving it again"
    )


def test_the_scanner_sees_both_spellings() -> None:
    tree = ast.parse("registry.chain(cfg)\nchain(cfg)\ncheck_chain(a, b)\nx.chain\n")
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    names = [c.func.id if isinstance(c.func, ast.Name) else c.func.attr for c in calls]
    assert sorted(n for n in names if n == "chain") == ["chain", "chain"]
