"""Text normalisation shared by the lists and the sentences: words, not characters.

A sentence and a listed name go through the same steps, so that they compare equal when
they differ only by what the matching rules ignore:

- **Words.** A word is a run of letters and digits (Unicode ``\\w`` less ``_``, combining
  marks kept with their letter). Everything else (punctuation, whitespace, ``_``) only
  separates words, so ``Coca-Cola`` = ``Coca Cola`` and ``AT&T`` = ``AT & T``, and a name
  can never match inside a longer word.
- **Case and accents.** A word is case-folded, decomposed (NFKD) and stripped of its
  combining marks: ``Müller`` = ``Muller``, ``SOCIÉTÉ`` = ``societe``, ``Straße`` =
  ``strasse``. Letters that do not decompose are spelled out (``ø`` -> ``o``, ``æ`` ->
  ``ae``, ``ł`` -> ``l``, ``þ`` -> ``th``, ...).
- **German umlauts.** A *listed* name with ``ä``/``ö``/``ü`` is also indexed in its German
  transliteration, so ``Mueller`` in a sentence matches a listed ``Müller`` (similarity
  1.0). The reverse (a listed ``Mueller`` and ``Müller`` in a sentence) is not an exact
  match: ``ue`` cannot be told from a real ``u`` + ``e``; fuzzy matching finds it.
- **Initials.** Single letters joined by dots are one word: ``J.P.`` = ``JP``,
  ``S.p.A.`` = ``SpA``, ``U. S.`` = ``US``. A listed name is indexed both with its runs of
  single letters joined and apart, so ``J P Morgan``, ``J.P. Morgan`` and ``JP Morgan``
  all match each other.
- **Possessives.** ``Acme's`` is the words ``acme`` ``s``: the name ``Acme`` matches the
  first word, and the match covers ``Acme`` (not the ``'s``).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

# a word: a letter or digit, then letters, digits and combining marks (Müller in NFD form)
WORD = re.compile(r"[^\W_](?:[^\W_]|[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff])*")
# what may separate two single letters that are one word: "J.P.", "J. P."
INITIALS_GAP = re.compile(r"\.\s?")

# letters NFKD leaves alone (no combining mark to strip), spelled as in ASCII
SPELLED = str.maketrans(
    {
        "ø": "o",
        "đ": "d",
        "ð": "d",
        "ħ": "h",
        "\u0131": "i",  # dotless i
        "ł": "l",
        "ŧ": "t",
        "æ": "ae",
        "œ": "oe",
        "þ": "th",
        "ŋ": "n",
    }
)
UMLAUTS = str.maketrans({"ä": "ae", "ö": "oe", "ü": "ue"})

# corporate suffixes that are optional at the end of a name (normalised forms)
SUFFIXES = frozenset(
    [
        "inc",
        "corp",
        "corporation",
        "co",
        "company",
        "ltd",
        "limited",
        "plc",
        "ag",
        "sa",
        "spa",
        "nv",
        "oy",
        "gmbh",
        "llc",
    ]
)
ARTICLE = "the"  # optional at the start of a name
# suffixes that say the same: "Acme Corporation" is listed "Acme Corp" rather than "Acme"
SAME_SUFFIX = {"corporation": "corp", "company": "co", "limited": "ltd"}


def fold(word: str) -> str:
    """One word case-folded and stripped of accents (``Müller`` -> ``muller``)."""
    if word.isascii():
        return word.lower()
    decomposed = unicodedata.normalize("NFKD", word.casefold())
    bare = "".join(c for c in decomposed if not unicodedata.combining(c))
    return bare.translate(SPELLED)


@dataclass(frozen=True, slots=True)
class Words:
    """A text's words: normalised forms and their ``[start, end)`` in the original text."""

    words: list[str]
    starts: list[int]
    ends: list[int]


def sentence_words(text: str) -> Words:
    """The words of a sentence, initials joined (``J.P.`` -> ``jp``), with their offsets."""
    words: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    initials = False  # whether the last word is single letters joined by dots so far
    for m in WORD.finditer(text):
        word, start, end = fold(m.group()), m.start(), m.end()
        single = len(word) == 1
        if single and initials and INITIALS_GAP.fullmatch(text, ends[-1], start):
            words[-1] += word
            ends[-1] = end
            continue
        words.append(word)
        starts.append(start)
        ends.append(end)
        initials = single
    return Words(words, starts, ends)


def name_forms(name: str) -> list[tuple[str, ...]]:
    """The word sequences under which a listed name is indexed: as a sentence reads it, with
    runs of single letters joined and apart, and in German transliteration (umlauts)."""
    if name.isascii():  # the usual case, fast: folding is lower-casing
        plain = tuple(WORD.findall(name.lower()))
        if all(len(w) > 1 for w in plain):
            return [plain] if plain else []
    else:
        plain = tuple(fold(m.group()) for m in WORD.finditer(name))
        if all(len(w) > 1 for w in plain) and not any(ch in name for ch in "äöüÄÖÜ\u0308"):
            return [plain] if plain else []
    forms: list[tuple[str, ...]] = []
    spellings = [name]
    folded = unicodedata.normalize("NFC", name).casefold()
    translit = folded.translate(UMLAUTS)
    if translit != folded:
        spellings.append(translit)
    for spelling in spellings:
        read = sentence_words(spelling).words
        plain = [fold(m.group()) for m in WORD.finditer(spelling)]
        for form in (read, plain, _join_initials(plain)):
            if form and tuple(form) not in forms:
                forms.append(tuple(form))
    return forms


def _join_initials(words: list[str]) -> list[str]:
    """Runs of single-letter words joined into one (``j p morgan`` -> ``jp morgan``)."""
    out: list[str] = []
    run = False
    for word in words:
        if len(word) == 1 and run:
            out[-1] += word
            continue
        out.append(word)
        run = len(word) == 1
    return out


def core_span(words: Sequence[str]) -> tuple[int, int]:
    """Where a name's core is in its words: less a leading "The" and trailing corporate
    suffixes, unless nothing would be left (a company called "The Company" keeps its
    words)."""
    start = 1 if words and words[0] == ARTICLE else 0
    end = len(words)
    while end > start and words[end - 1] in SUFFIXES:
        end -= 1
    return (start, end) if end > start else (0, len(words))


def core(words: tuple[str, ...]) -> tuple[str, ...]:
    """A name's core words (``core_span``): ``the acme co ltd`` -> ``acme``."""
    start, end = core_span(words)
    return words[start:end]


def suffix_tail(words: Sequence[str]) -> tuple[str, ...]:
    """Suffix words in one spelling each (``corporation`` -> ``corp``), to compare them."""
    return tuple(SAME_SUFFIX.get(w, w) for w in words)
