"""Watch-list screening: which listed names a sentence names (issue 34).

``load_list`` reads a list file, ``compile_lists`` compiles lists once per run into a
picklable ``CompiledLists``, and ``Matcher.find`` returns the ``Match``es of one sentence.
The matching rules are in ``normalise`` (what compares equal) and ``matcher`` (what wins).
"""

from docintel.pipeline.entities.compiled import (
    CompiledLists,
    compile_lists,
    compile_watch_lists,
)
from docintel.pipeline.entities.lists import MAX_LIST_NAMES, WatchList, load_list
from docintel.pipeline.entities.matcher import Match, Matcher

__all__ = [
    "MAX_LIST_NAMES",
    "CompiledLists",
    "Match",
    "Matcher",
    "WatchList",
    "compile_lists",
    "compile_watch_lists",
    "load_list",
]
