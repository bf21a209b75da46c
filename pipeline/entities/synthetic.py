"""Synthetic watch lists and a labelled test set, deterministic (seeded), nothing downloaded.

Used by ``bench/entities.py`` (throughput, compile cost, precision and recall) and by the
tests (a 10^5-name list). Names are made of pronounceable syllables, some with accented
letters; companies carry corporate suffixes, a few a leading "The".

The test set (``labelled_cases``) hides listed names in news-like sentences, in the variants the
matching rules must see through (case, accents stripped, German transliteration, suffix
added, dropped or changed, leading "The", possessive, hyphens and odd whitespace), among
decoys that must not match: similar but different names (a word changed, two letters
changed), listed names inside longer words, a person's first name alone, and sentences of
common words only. Each sentence comes with its expected (entity id, matched text) pairs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from docintel.pipeline.entities.normalise import core, name_forms

ONSETS = [
    "b",
    "br",
    "c",
    "ch",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "j",
    "k",
    "kl",
    "l",
    "m",
    "n",
    "p",
    "pr",
    "qu",
    "r",
    "s",
    "st",
    "sk",
    "t",
    "tr",
    "v",
    "w",
    "z",
    "zh",
]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ai", "ou"]
ACCENTED = {"a": "á", "e": "é", "o": "ö", "u": "ü", "i": "í"}
CODAS = ["", "", "n", "r", "l", "s", "x", "th", "nd", "rk"]
SUFFIXES = ["Inc", "Corp", "Ltd", "plc", "AG", "SA", "GmbH", "LLC", "Co", "NV", "Oy", "SpA"]
SECTORS = ["Holdings", "Capital", "Group", "Partners", "Energy", "Mining", "Shipping"]
TEMPLATES = [
    "Shares of {} fell sharply after the quarterly results.",
    "Analysts at the bank downgraded {} on Tuesday.",
    "Regulators fined {} over reporting failures last year.",
    "The board said {} would cut costs by ten percent.",
    "Investors welcomed the news that {} raised its forecast.",
]
FILLER = [
    "Markets closed higher on Friday as oil prices rose.",
    "The central bank kept interest rates unchanged.",
    "Quarterly revenue beat estimates across the sector.",
    "Company shares rallied after the group reported limited losses.",
]


def word(rng: random.Random, syllables: int, accent: float = 0.0) -> str:
    """A capitalised pronounceable word; with probability ``accent`` one vowel accented."""
    parts = [rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(syllables)]
    text = "".join(parts) + rng.choice(CODAS)
    if rng.random() < accent:
        i = next((k for k, ch in enumerate(text) if ch in ACCENTED), None)
        if i is not None:
            text = text[:i] + ACCENTED[text[i]] + text[i + 1 :]
    return text.capitalize()


def names(count: int, seed: int = 34) -> list[tuple[str, str, str]]:
    """``count`` distinct (entity id, name, type): half people, half companies."""
    rng = random.Random(seed)
    out: dict[str, tuple[str, str, str]] = {}
    firsts = [word(rng, rng.randint(1, 2), 0.1) for _ in range(2000)]
    while len(out) < count:
        if len(out) % 2:
            name = f"{rng.choice(firsts)} {word(rng, rng.randint(2, 3), 0.15)}"
            kind = "person"
        else:
            core = " ".join(word(rng, rng.randint(2, 3), 0.1) for _ in range(rng.randint(1, 2)))
            name = f"{core} {rng.choice(SECTORS + SUFFIXES)}"
            name = f"The {name}" if rng.random() < 0.05 else name
            kind = "company"
        out.setdefault(name.casefold(), (f"E{len(out):07d}", name, kind))
    return list(out.values())


@dataclass(frozen=True)
class Case:
    """One sentence of the test set and what it should yield: (entity id, matched text)."""

    sentence: str
    expected: tuple[tuple[str, str], ...]
    kind: str  # the variant or decoy it tests


def labelled_cases(
    listed: list[tuple[str, str, str]],
    seed: int = 7,
    whole_list: list[tuple[str, str, str]] | None = None,
) -> list[Case]:
    """Sentences naming ``listed`` entities in every variant, and decoys, shuffled; no
    decoy names an entity of ``whole_list`` (the list ``listed`` is a sample of)."""
    rng = random.Random(seed)
    taken = {_core(n) for _, n, _ in whole_list or listed}
    cases: list[Case] = []
    for entity_id, name, _ in listed:
        for kind, mention, matched in variants(name, rng):
            sentence = rng.choice(TEMPLATES).format(mention)
            cases.append(Case(sentence, ((entity_id, matched),), kind))
        for kind, decoy in decoys(name, rng):
            words = _core(decoy)
            windows = {words[i:j] for i in range(len(words)) for j in range(i + 1, len(words) + 1)}
            if taken.isdisjoint(windows):
                cases.append(Case(rng.choice(TEMPLATES).format(decoy), (), kind))
    cases += [Case(s, (), "decoy: common words") for s in FILLER]
    rng.shuffle(cases)
    return cases


def variants(name: str, rng: random.Random) -> list[tuple[str, str, str]]:
    """(kind, how the sentence writes it, what should match) for one listed name."""
    core, suffix = _split_suffix(name)
    bare = core.removeprefix("The ")
    spaced = name.replace(" ", rng.choice(["-", "  ", "\n"]), 1)
    out = [
        ("exact", name, name),
        ("upper case", name.upper(), name.upper()),
        ("possessive", f"{name}'s", name),
        ("hyphen and spaces", spaced, spaced),
    ]
    if _strip(name) != name:
        out.append(("accents stripped", _strip(name), _strip(name)))
    if any(ch in name for ch in "äöü"):
        translit = name.replace("ö", "oe").replace("ü", "ue").replace("ä", "ae")
        out.append(("umlaut transliterated", translit, translit))
    if suffix:
        other = f"{core} {rng.choice([s for s in SUFFIXES if s != suffix])}"
        out += [("suffix dropped", core, core), ("suffix changed", other, other)]
        if bare != core:
            out.append(("leading The dropped", f"{bare} {suffix}", f"{bare} {suffix}"))
    elif name.rsplit(maxsplit=1)[-1] in SECTORS:
        sfx = rng.choice(SUFFIXES)
        out.append(("suffix added", f"{name} {sfx}.", f"{name} {sfx}"))
    return out


def decoys(name: str, rng: random.Random) -> list[tuple[str, str]]:
    """(kind, text) of names that look like the listed one but must not match it."""
    core, _ = _split_suffix(name)
    words = core.removeprefix("The ").split()
    out = [("decoy: two letters changed", " ".join([*words[:-1], _mutate(words[-1], rng)]))]
    if len(words) > 1:
        out.append(("decoy: word changed", " ".join([*words[:-1], word(rng, 3)])))
        out.append(("decoy: first word only", words[0]))
    else:
        out.append(("decoy: inside a longer word", f"{words[0]}ville"))
    return out


def typos(listed: list[tuple[str, str, str]], seed: int = 11) -> list[Case]:
    """One substituted letter in the longest word of each listed name: fuzzy positives."""
    rng = random.Random(seed)
    cases = []
    for entity_id, name, _ in listed:
        words = name.split()
        i = max(range(len(words)), key=lambda k: len(words[k]))
        if len(words[i]) < 6:
            continue
        k = rng.randrange(1, len(words[i]) - 1)
        letter = rng.choice([c for c in "aeiouy" if c != words[i][k]])
        words[i] = words[i][:k] + letter + words[i][k + 1 :]
        mention = " ".join(words)
        cases.append(Case(rng.choice(TEMPLATES).format(mention), ((entity_id, mention),), "typo"))
    return cases


def _core(name: str) -> tuple[str, ...]:
    return core(name_forms(name)[0])


def _split_suffix(name: str) -> tuple[str, str]:
    head, _, last = name.rpartition(" ")
    return (head, last) if head and last in SUFFIXES else (name, "")


def _strip(text: str) -> str:
    return text.translate(str.maketrans("áéöüíäÁÉÖÜÍÄ", "aeouiaAEOUIA"))


def _mutate(text: str, rng: random.Random) -> str:
    """Two letters of a word replaced, each by a different consonant."""
    letters = list(text)
    for k in rng.sample(range(1, len(letters)), min(2, len(letters) - 1)):
        letters[k] = rng.choice([c for c in "bdgkmptvz" if c != letters[k].lower()])
    return "".join(letters)
