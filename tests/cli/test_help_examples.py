"""Help examples a reader can paste (issue 31, item 16): every repository path an example
names exists, and the demo's output is the folder `make demo` writes (demo-out, not
out/demo). What stays a placeholder is listed here: the reader's own files and folders."""

from __future__ import annotations

import re
import shlex

from tests.cli.test_help import _commands, _example_lines
from tests.conftest import REPO

# The reader's own inputs and outputs, or what an earlier example line of the same help
# writes: names no checkout holds.
PLACEHOLDERS = {
    "corpus/", "out/run1", "my_reports/", "reports.parquet", "out/", "audits", "in.csv",
    "labelled.csv", "my-head", "my-model", "watch.txt", ".", "clients.csv", "pep.parquet",
}  # fmt: skip
# Options whose value is no path.
NOT_A_PATH = {
    "--label", "--doc-id", "--date", "--run-id", "--address", "--ray-address", "--out",
    "--text-column", "--id-column", "--label-names", "--encoder", "--top", "--gpus",
    "--entity", "--mode",
}  # fmt: skip
NOT_A_PATH_WORD = re.compile(r"raysubmit_\w+|default|.* .*|\w+://\S*")  # ids, queries, URLs


def _demo_out() -> str:
    (value,) = re.findall(r"^DEMO_OUT \?= (\S+)$", (REPO / "Makefile").read_text(), re.M)
    return value


def _paths(example: str) -> list[str]:
    """The arguments of an example that name a file or folder (shell words)."""
    words = shlex.split(example, comments=True)[2:]  # after "docintel COMMAND"
    return [
        word
        for prev, word in zip(["", *words], words, strict=False)
        if not word.startswith("-")
        and prev not in NOT_A_PATH
        and not NOT_A_PATH_WORD.fullmatch(word)
    ]


def test_example_paths_exist_or_are_the_readers() -> None:
    demo_out = _demo_out()
    seen = set()
    for command, text in _commands().items():
        for example in _example_lines(text):
            for path in _paths(example):
                seen.add(path)
                if path in PLACEHOLDERS or path == demo_out:
                    continue
                assert (REPO / path).exists(), f"`docintel {command}` example: {path}"
    assert demo_out in seen and "data/demo/documents.parquet" in seen
    assert "out/demo" not in seen
