"""An out-of-tree stage package, written into a temporary folder by tests.

The package is plain user code: it imports only ``docintel.pipeline.stages.Stage`` (the
public protocol) and pyarrow. Tests put its folder on ``sys.path`` (and ``PYTHONPATH`` for
subprocesses), exactly as a user's own package would be found.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

PACKAGE = "docintel_userstage_pkg"
ENTRY = f"{PACKAGE}.keywords:Keywords"

REPO = Path(__file__).resolve().parent.parent


def readme_stage() -> str:
    """The example stage of docs/configuration.md, "Your own stage", as written there: the
    test runs the documented code itself."""
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = text[text.index("### Your own stage") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```", start)]


# Classes for the refusals: not a Stage; a Stage that needs a column nobody makes.
REFUSED = textwrap.dedent(
    """

    class NotAStage:
        name = "nope"


    class NeedsMissing(Stage):
        name = "needs_missing"
        input_columns = ("sentiment_vector",)
        output_columns = ("x",)

        def setup(self):
            pass

        def __call__(self, table):
            return table
    """
)
KEYWORDS = readme_stage() + REFUSED


def write_package(root: Path) -> Path:
    """The package ``docintel_userstage_pkg`` under ``root``; returns ``root``."""
    pkg = root / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "keywords.py").write_text(KEYWORDS)
    return root


def write_entry_point(root: Path, name: str = "keywords") -> None:
    """An installed distribution's metadata under ``root`` declaring the entry point
    ``name`` in the group ``docintel.stages`` (what ``pip install`` of a package with
    ``[project.entry-points."docintel.stages"]`` leaves in site-packages)."""
    info = root / "docintel_userstage_pkg-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: docintel-userstage-pkg\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(f"[docintel.stages]\n{name} = {ENTRY}\n")
