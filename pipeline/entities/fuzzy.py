"""Fuzzy matching (``min_similarity``): typos and transliterations, word by word.

**Design, for speed.** A near miss is found through the listed *words*, never by comparing
a sentence with every name:

1. Each word of the sentence (of at least ``MIN_WORD_CHARS`` letters) is compared with the
   distinct listed words of a length within ``MAX_LENGTH_CHANGE`` that share its first or
   its last letter (rapidfuzz ``process.extract``, C++, with a score cutoff; ``Gaddafi``
   finds ``Qaddafi`` by its last letter), and its neighbours, the ``MAX_NEIGHBOURS`` most
   similar listed words at least ``word_cutoff`` similar (a common word has thousands in
   a 10^6-name list: "around" ~ "Arounds", "Aroud", ...), are cached: news text repeats
   its words, so most sentences cost dictionary look-ups (``CACHE_WORDS`` words kept per process).
2. Windows of the sentence are then spelled with each word's own code or a neighbour's,
   and walked down the automaton's trie (``Automaton.match`` prunes a prefix no name
   starts with), so only names that every word of the window nearly spells are reached.
3. A reached name made with at least one neighbour is kept when the whole window is
   ``min_similarity`` similar to it: ``rapidfuzz.fuzz.ratio`` (normalised Indel
   similarity, 0..1) of the normalised window and name; that is the match's similarity.

A word's cutoff is looser than the name's (``word_cutoff``), since one word of a long name
may be further off ("Poutine" for "Putin": 0.83) while the whole name still passes.
Cost: a word not yet cached costs one scan of its buckets (~15 ms of one core at 10^6
names, ~1 ms at 10^5); a cached one, ~(neighbours + 1) trie look-ups per window start.
Not found: a name whose words are joined or split differently (``CocaCola``), a word of
under ``MIN_WORD_CHARS`` letters spelled differently (those words must be exact), a word
whose first and last letters both differ from the listed word's.
"""

from __future__ import annotations

from rapidfuzz import fuzz, process

from docintel.pipeline.entities.compiled import CODE_WIDTH, UNKNOWN, CompiledLists

MIN_WORD_CHARS = 5  # shorter words are matched exactly only ("said", "the", "gmbh")
MAX_LENGTH_CHANGE = 2  # a neighbour is at most 2 letters longer or shorter than the word
MAX_NEIGHBOURS = 24  # the most similar listed words kept per sentence word
CACHE_WORDS = 200_000  # neighbour lists kept per process; the cache is emptied when full
MAX_PREFIXES = 64  # trie prefixes followed per window start (bounds a pathological sentence)

Hit = tuple[int, int, int, float]


def word_cutoff(min_similarity: float) -> float:
    """The similarity a word needs to stand for a listed word: twice as far off as the
    whole name may be (0.85 -> 0.7), at least 0.5."""
    return max(0.5, 1 - 2 * (1 - min_similarity))


class FuzzyIndex:
    """The lists' words by length, and a cache of each sentence word's neighbours."""

    def __init__(self, compiled: CompiledLists, min_similarity: float) -> None:
        self.compiled = compiled
        self.min_similarity = min_similarity
        self.cutoff = word_cutoff(min_similarity) * 100
        self.word_of: dict[str, str] = {code: word for word, code in compiled.codes.items()}
        # (length, first letter) and (length, -1, last letter) -> listed words, their codes
        self.buckets: dict[tuple, tuple[list[str], list[str]]] = {}
        for word, code in compiled.codes.items():
            for bucket in ((len(word), word[0]), (len(word), -1, word[-1])):
                words, codes = self.buckets.setdefault(bucket, ([], []))
                words.append(word)
                codes.append(code)
        self.cache: dict[str, list[str]] = {}

    def neighbours(self, word: str) -> list[str]:
        """Codes of the listed words (other than ``word``) similar enough to it."""
        found = self.cache.get(word)
        if found is not None:
            return found
        found: dict[str, float] = {}
        if len(word) >= MIN_WORD_CHARS:
            s = self.cutoff / 100
            low = max(int(len(word) * s / (2 - s)), len(word) - MAX_LENGTH_CHANGE, 1)
            high = min(int(len(word) * (2 - s) / s) + 1, len(word) + MAX_LENGTH_CHANGE)
            for length in range(low, high + 1):
                for bucket in ((length, word[0]), (length, -1, word[-1])):
                    words, codes = self.buckets.get(bucket, ((), ()))
                    hits = process.extract(
                        word, words, scorer=fuzz.ratio, score_cutoff=self.cutoff, limit=None
                    )
                    found.update((codes[i], score) for w, score, i in hits if w != word)
        best = sorted(found, key=found.__getitem__, reverse=True)[:MAX_NEIGHBOURS]
        if len(self.cache) >= CACHE_WORDS:
            self.cache.clear()
        self.cache[word] = best
        return best

    def hits(self, words: list[str], codes: list[str]) -> list[Hit]:
        """Near misses in a sentence (made with at least one neighbour word)."""
        near = [self.neighbours(w) for w in words]
        if not any(near):
            return []
        options = [
            ([(c, False)] if c != UNKNOWN else []) + [(n, True) for n in alt]
            for c, alt in zip(codes, near, strict=True)
        ]
        out: list[Hit] = []
        for first in range(len(words)):
            out += self._walk(words, options, first)
        return out

    def _walk(self, words: list[str], options: list, first: int) -> list[Hit]:
        """Names reached from ``first``, each window word spelled by an option."""
        automaton = self.compiled.automaton
        prefixes: list[tuple[str, bool]] = [("", False)]
        out: list[Hit] = []
        last = min(len(words), first + self.compiled.max_key_words)
        for end in range(first + 1, last + 1):
            grown = []
            for prefix, fuzzy in prefixes:
                for code, alt in options[end - 1]:
                    key = prefix + code
                    if automaton.match(key):
                        grown.append((key, fuzzy or alt))
            prefixes = grown[:MAX_PREFIXES]
            for key, fuzzy in prefixes:
                if fuzzy and automaton.exists(key):
                    hit = self._check(words[first:end], key, first, end)
                    if hit is not None:
                        out.append(hit)
            if not prefixes:
                break
        return out

    def _check(self, window: list[str], key: str, first: int, end: int) -> Hit | None:
        name = " ".join(
            self.word_of[key[i : i + CODE_WIDTH]] for i in range(0, len(key), CODE_WIDTH)
        )
        similarity = fuzz.ratio(" ".join(window), name) / 100
        if similarity < self.min_similarity:
            return None
        return first, end, self.compiled.automaton.get(key), round(similarity, 4)
