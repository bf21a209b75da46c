"""Guessing the encoding of text that is not UTF-8 (``docintel ingest`` and the parse
stage's text path): charset-normalizer, with a rule for Western European text that it
mistakes for another script. A leaf module: nothing of docintel below it."""

from __future__ import annotations

import codecs
import string
import unicodedata

# Byte-order marks and the codec each names (a file with one is decoded by it, the mark
# dropped; utf-8-sig is what ingest's encoding column records for UTF-8 with a mark).
BOMS = (  # longest first: the UTF-32-LE mark starts with the UTF-16-LE one
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)

# Ties between encodings that charset-normalizer finds equally plausible (short texts:
# Latin-1 French reads as cp1250 or cp775 as well as cp1252) go to the most used one.
PREFERRED_ENCODINGS = (
    "cp1252",
    "latin_1",
    "iso8859_15",
    "cp1250",
    "iso8859_2",
    "cp1251",
    "shift_jis",
    "euc_jp",
    "gb18030",
    "big5",
    "euc_kr",
)
CHAOS_TIE = 0.01  # matches within this much "chaos" (mess ratio) of the best are a tie
# Codecs of Latin-script languages whose guess stands. Any other guess (CJK, Cyrillic,
# Greek, ... and old DOS/Mac code pages such as cp775, cp850, mac_latin2) gives way to
# cp1252 when the bytes read as Western European text there (``_reads_as_western``):
# charset-normalizer finds no mess in "｣" (shift_jis for a Latin-1 "£") or "Ć" (cp775 for a
# cp1252 "€"), but real text in those scripts never has that shape in cp1252.
LATIN_CODECS = frozenset(
    {
        "cp1252",
        "latin_1",
        "iso8859_15",
        "cp1250",
        "iso8859_2",
        "cp1254",
        "iso8859_9",
        "cp1257",
        "iso8859_4",
        "iso8859_13",
        "cp1258",
        "iso8859_3",
        "iso8859_10",
        "iso8859_14",
        "iso8859_16",
    }
)
WESTERN = "cp1252"
# The shape of Western European text read as cp1252: its non-ASCII characters are Latin
# letters or common symbols (_WESTERN_SYMBOLS: no-break space, £ € ¥ ¢ © ® ™ ° ± § ¶ · •,
# quotes, dashes, ellipsis, times, divide, ² ½ ¼ ¾ µ ¿ ¡ ª º, acute accent, ‰); at most
# WESTERN_SHARE of them per ASCII letter; at most WESTERN_RUN_SHARE of them in runs of
# WESTERN_RUN or more non-ASCII bytes in a row (words of another script: koi8-r Russian
# reads as "Ãåíåðàëüíûé").
_WESTERN_SYMBOLS = bytes.fromhex(
    "a0 a3 80 a5 a2 a9 ae 99 b0 b1 a7 b6 b7 95 ab bb 8b 9b 96 97 91 92 82 93 94 84 85"
    " d7 f7 b2 bd bc be b5 bf a1 aa ba b4 89"
).decode(WESTERN)
WESTERN_SHARE = 0.5
WESTERN_RUN = 3
WESTERN_RUN_SHARE = 0.10
_HIGH_MARKS = bytes(0x20 if b < 0x80 else 0x80 for b in range(256))  # non-ASCII: 0x80
_ASCII = bytes(range(128))
_ASCII_LETTERS = string.ascii_letters.encode()


def detect_encoding(raw: bytes) -> str | None:
    """The encoding of text that is not UTF-8, as charset-normalizer detects it (ties go to
    ``PREFERRED_ENCODINGS``, in order), or None when it finds no plausible one (binary).

    A guess outside ``LATIN_CODECS`` becomes cp1252 when the bytes read as Western European
    text in cp1252 (``_reads_as_western``): a Latin-1 or cp1252 news text with "£" or "€"
    is not shift_jis or cp775, whatever the detector's mess ratio says."""
    from charset_normalizer import from_bytes

    matches = list(from_bytes(raw))
    if not matches:
        return None
    least = min(m.chaos for m in matches)
    close = [m for m in matches if m.chaos <= least + CHAOS_TIE]
    guess = str(close[0].encoding)
    for preferred in PREFERRED_ENCODINGS:
        if any(preferred in m.could_be_from_charset for m in close):
            guess = preferred
            break
    if guess not in LATIN_CODECS and _reads_as_western(raw):
        return WESTERN
    return guess


def _reads_as_western(raw: bytes) -> bool:
    """Whether ``raw`` decodes as cp1252 into the shape of Western European text: every
    non-ASCII character a Latin letter or a common symbol (``_WESTERN_SYMBOLS``), few of
    them per ASCII letter (``WESTERN_SHARE``) and nearly all in runs shorter than
    ``WESTERN_RUN`` (words of other scripts are runs of non-ASCII bytes). Byte-level
    counts: a 64 MiB file takes about a second."""
    high = raw.translate(None, _ASCII)
    letters = len(raw) - len(raw.translate(None, _ASCII_LETTERS))
    if not high or len(high) > WESTERN_SHARE * max(letters, 4):
        return False
    marks = raw.translate(_HIGH_MARKS)  # counted in runs: 3 bytes per 3, 4 or 5 in a row
    in_runs = WESTERN_RUN * marks.count(b"\x80" * WESTERN_RUN)
    return in_runs <= WESTERN_RUN_SHARE * len(high) and set(high) <= _WESTERN_BYTES


def _western_byte(b: int) -> bool:
    try:
        c = bytes([b]).decode(WESTERN)
    except UnicodeDecodeError:  # 0x81, 0x8D, 0x8F, 0x90, 0x9D: not cp1252 text
        return False
    latin = c.isalpha() and unicodedata.name(c, "").startswith("LATIN ")
    return latin or c in _WESTERN_SYMBOLS


_WESTERN_BYTES = frozenset(b for b in range(128, 256) if _western_byte(b))
