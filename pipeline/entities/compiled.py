"""Lists compiled once per run into one picklable object that replicas share.

**Design.** Matching is on words, not characters. Every distinct word of the listed names
gets an id, written as ``CODE_WIDTH`` (3) characters of a 128-letter alphabet; a name is
the concatenation of its words' codes, and all names go into one Aho-Corasick automaton
(pyahocorasick, ``STORE_INTS``: the value is the key's number). A sentence is split into
words the same way (``normalise``), each word replaced by its code (an unlisted word by a
code no key contains) and the automaton run once over the result: every hit that ends on a
word boundary (a multiple of ``CODE_WIDTH``) is a listed name made of whole words. Compared
with an automaton over the names' characters this has about a third of the nodes (a
10^6-name list: ~110 MB instead of ~320 MB) and cannot match inside a word.

A key is a name's *core*: its words less a leading "The" and trailing corporate suffixes
(``normalise.core``). Each key lists its entries (entity row, the suffix words the listed
name had, whether it began with "The") in CSR arrays, so "Acme" and "Acme Corp" listed as
two entities share the key ``acme`` and the one whose suffixes are in the sentence wins.

The entities themselves (id, name, aliases, type, list) are an Arrow table. The whole
object pickles (``to_bytes``; Ray's object store holds it once per run); each replica that
loads it holds the automaton and the word table in its own memory (``stats()``).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import ahocorasick
import numpy as np
import pyarrow as pa

from docintel.pipeline.entities.lists import WatchList, load_list
from docintel.pipeline.entities.normalise import core_span, name_forms, suffix_tail
from docintel.pipeline.errors import ConfigError

CODE_WIDTH = 3  # characters per word code
CODE_BASE = 128  # letters of the code alphabet
CODE_FIRST = 0x100  # first code point of the alphabet (any 128 code points would do)
MAX_WORDS = CODE_BASE**CODE_WIDTH - 1  # distinct words over all lists (2,097,151)
UNKNOWN = chr(CODE_FIRST) * CODE_WIDTH  # word id 0: a sentence word no list has


def encode(word_id: int) -> str:
    """A word id as ``CODE_WIDTH`` characters (most significant first)."""
    b, first = CODE_BASE, CODE_FIRST  # CODE_WIDTH == 3, written out: compiling calls it 10^6x
    return (
        chr(first + word_id // (b * b)) + chr(first + word_id // b % b) + chr(first + word_id % b)
    )


@dataclass
class CompiledLists:
    """Every list of a run, compiled. Picklable; build with ``compile_lists``."""

    lists: tuple[str, ...]  # list names (file stems), indexed by the entities' ``list``
    entities: pa.Table  # entity_id, name, aliases (list<string>), type, list (int16)
    codes: dict[str, str]  # normalised word -> its code
    automaton: ahocorasick.Automaton  # concatenated codes of a key -> key number
    key_words: np.ndarray  # uint8, words in each key
    offsets: np.ndarray  # int64, key k's entries are [offsets[k], offsets[k + 1])
    entry_rows: np.ndarray  # int32, entity row of each entry
    entry_tails: np.ndarray  # int32, index into ``tails``: the suffix words of the entry
    entry_the: np.ndarray  # bool, whether the entry's name began with "The"
    tails: tuple[tuple[str, ...], ...]  # distinct suffix-word tails, () first
    max_key_words: int

    def to_bytes(self) -> bytes:
        return pickle.dumps(self, protocol=5)

    @staticmethod
    def from_bytes(data: bytes) -> CompiledLists:
        out = pickle.loads(data)
        if not isinstance(out, CompiledLists):
            raise TypeError(f"not compiled watch lists: {type(out).__name__}")
        return out

    def stats(self) -> dict[str, int]:
        """Sizes: entities, keys, distinct words, automaton nodes and bytes."""
        auto = self.automaton.get_stats()
        arrays = (self.key_words, self.offsets, self.entry_rows, self.entry_tails)
        return {
            "entities": self.entities.num_rows,
            "keys": len(self.key_words),
            "words": len(self.codes),
            "automaton_nodes": auto["nodes_count"],
            "automaton_bytes": auto["total_size"],
            "arrays_bytes": sum(a.nbytes for a in arrays) + self.entities.nbytes,
        }


def compile_lists(paths: Iterable[str | Path]) -> CompiledLists:
    """Load (``load_list``) and compile the lists of a run, in order."""
    return compile_watch_lists([load_list(p) for p in paths])


def compile_watch_lists(lists: Sequence[WatchList]) -> CompiledLists:
    """Compile lists already loaded (two lists may not share a name)."""
    seen: dict[str, str] = {}
    for wl in lists:
        if wl.name in seen:
            raise ConfigError(
                f"watch lists {seen[wl.name]} and {wl.path} have the same name {wl.name!r} "
                "(a list is named by its file's stem): rename one"
            )
        seen[wl.name] = wl.path
    builder = _Builder()
    row = 0
    for wl in lists:
        for i in range(len(wl)):
            for text in (wl.names[i], *wl.aliases[i]):
                builder.add(text, row)
            row += 1
    return builder.finish(lists, _entity_table(lists))


def _entity_table(lists: Sequence[WatchList]) -> pa.Table:
    return pa.table(
        {
            "entity_id": pa.array([i for wl in lists for i in wl.ids], pa.string()),
            "name": pa.array([n for wl in lists for n in wl.names], pa.string()),
            "aliases": pa.array([list(a) for wl in lists for a in wl.aliases]),
            "type": pa.array([t for wl in lists for t in wl.types], pa.string()),
            "list": pa.array([k for k, wl in enumerate(lists) for _ in wl.ids], pa.int16()),
        }
    )


class _Builder:
    """Accumulates keys and entries; ``finish`` makes the automaton and the arrays."""

    def __init__(self) -> None:
        self.codes: dict[str, str] = {}
        self.keys: dict[str, int] = {}
        self.key_words: list[int] = []
        self.tails: dict[tuple[str, ...], int] = {(): 0}
        # the entries, one per (name form, row): key number, row, tail, "The"
        self.entries: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])

    def add(self, text: str, row: int) -> None:
        codes, keys, (e_key, e_row, e_tail, e_the) = self.codes, self.keys, self.entries
        for form in name_forms(text):
            start, end = core_span(form)
            key = "".join([codes.get(w) or self._code(w) for w in form[start:end]])
            key_no = keys.get(key)
            if key_no is None:
                key_no = keys[key] = len(keys)
                self.key_words.append(end - start)
            tail_id = 0
            if end < len(form):
                tail_id = self.tails.setdefault(suffix_tail(form[end:]), len(self.tails))
            e_key.append(key_no)
            e_row.append(row)
            e_tail.append(tail_id)
            e_the.append(start)

    def _code(self, word: str) -> str:
        if len(self.codes) >= MAX_WORDS:
            raise ConfigError(f"watch lists: more than {MAX_WORDS:,} distinct words")
        code = self.codes[word] = encode(len(self.codes) + 1)
        return code

    def finish(self, lists: Sequence[WatchList], entities: pa.Table) -> CompiledLists:
        automaton = ahocorasick.Automaton(ahocorasick.STORE_INTS)
        for key, key_no in self.keys.items():
            automaton.add_word(key, key_no)
        automaton.make_automaton()
        self.keys.clear()
        entries = _unique_rows(np.array(self.entries, dtype=np.int64).T)
        self.entries = ([], [], [], [])
        counts = np.bincount(entries[:, 0], minlength=len(self.key_words))
        return CompiledLists(
            lists=tuple(wl.name for wl in lists),
            entities=entities,
            codes=self.codes,
            automaton=automaton,
            key_words=np.array(self.key_words, dtype=np.uint8),
            offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            entry_rows=entries[:, 1].astype(np.int32),
            entry_tails=entries[:, 2].astype(np.int32),
            entry_the=entries[:, 3].astype(bool),
            tails=tuple(self.tails),
            max_key_words=max(self.key_words, default=0),
        )


def _unique_rows(entries: np.ndarray) -> np.ndarray:
    """The distinct rows of an (n, 4) array, sorted by its columns (the first first)."""
    if not len(entries):
        return entries.reshape(0, 4)
    order = np.lexsort(entries.T[::-1])
    entries = entries[order]
    keep = np.ones(len(entries), dtype=bool)
    keep[1:] = (entries[1:] != entries[:-1]).any(axis=1)
    return entries[keep]
