"""From positioned lines to text: paragraphs, running headers and footers, hyphenation.

Works on :class:`Line` objects from any source with page geometry (pdfium's text layer,
Tesseract's OCR boxes), in PDF coordinates (points, y grows upwards). Reading order is
the order the lines come in (the content stream's: columns one after another, as the
producer wrote them), never re-sorted by position, which would interleave columns.

- Running headers and footers: a line in the top or bottom MARGIN_ZONE of its page whose
  text, digits masked, recurs there on several pages (see :func:`repeats_needed`) is
  dropped, so are page numbers ("3", "Page 3 of 9", "- iv -").
- Paragraphs: a new one starts where the gap to the previous line exceeds the page's
  usual gap by PARAGRAPH_GAP line heights, where the text jumps up or sideways (a new
  column or block), and after a short line ending a sentence (paragraphs set without
  spacing).
- Lines of a paragraph are joined with a space; a word hyphenated at a line end is
  rejoined ("finan-" + "cial" -> "financial") unless the document writes it hyphenated
  elsewhere ("well-known" stays). Paragraphs are separated by a blank line.
- Pages are joined with a blank line, or a space where a sentence runs on to the next
  page (no terminal punctuation, next page starting lower-case).
"""

from __future__ import annotations

import itertools
import re
import statistics
from dataclasses import dataclass

# Top and bottom share of a page where running headers, footers and page numbers live.
MARGIN_ZONE = 0.12
# A vertical gap above a line wider than the page's usual gap between lines (the median:
# most lines follow a line of their own paragraph) by more than this many line heights
# starts a new paragraph. Paragraph spacing is 0.5-1 line or more (Word's 6-8 pt after an
# 11 pt line, a browser's 1em margin); with none, the short-line rule below applies.
PARAGRAPH_GAP = 0.35
# A line shorter than this share of the page's usual line width that ends a sentence
# ends its paragraph (for paragraphs set with no space between them).
SHORT_LINE = 0.75
SOFT_HYPHEN_MARKERS = "\ufffe\x02"  # how pdfium marks a hyphen it broke a line at
# A line ending in one of these after a letter may be a word hyphenated at the line end:
# ASCII hyphen-minus, U+2010 HYPHEN (what Chromium draws at a soft hyphen), U+00AD.
HYPHENS = "-\u2010\u00ad"
_TERMINAL = re.compile(r"[.!?:;\"'\u201d\u2019)\]]$")
_ROMAN = re.compile(r"^[ivxlcdm]+$")
_HYPHENATED = re.compile(r"\b(\w+)[-\u2010](\w+)\b")
_WORD_END = re.compile(r"(\w+)$")
_WORD_START = re.compile(r"^(\w+)")


@dataclass(frozen=True)
class Line:
    """One line of text on a page and its box (points, y upwards)."""

    text: str
    left: float
    bottom: float
    right: float
    top: float
    hyphen: bool = False  # it ended with a hyphen the line was broken at

    @property
    def height(self) -> float:
        return self.top - self.bottom


@dataclass(frozen=True)
class Page:
    lines: list[Line]
    height: float


def running_key(text: str) -> str:
    """A line's identity as a running header or footer: case, spacing and numbers masked
    (so "Page 3 of 9" and "Page 4 of 9" are the same line)."""
    words = re.sub(r"\d+", "#", text.lower()).split()
    return " ".join("#" if _ROMAN.match(w.strip("-.()[]")) else w for w in words)


def repeats_needed(n_pages: int) -> int:
    """On how many pages a margin line must recur to be a running header or footer.

    Two of up to four pages; three of longer documents, so chapter-level running heads
    (on the pages of one chapter only) go as well as document-wide ones. One page: none.
    """
    return n_pages + 1 if n_pages < 2 else (2 if n_pages <= 4 else 3)


def _in_margin(line: Line, page: Page) -> bool:
    zone = MARGIN_ZONE * page.height
    return line.bottom >= page.height - zone or line.top <= zone


def drop_running(pages: list[Page]) -> list[Page]:
    """The pages without their running headers, footers and page numbers."""
    seen: dict[str, set[int]] = {}
    for number, page in enumerate(pages):
        for line in page.lines:
            if _in_margin(line, page):
                seen.setdefault(running_key(line.text), set()).add(number)
    needed = repeats_needed(len(pages))
    running = {key for key, where in seen.items() if len(where) >= needed}
    return [
        Page(
            [ln for ln in p.lines if not (_in_margin(ln, p) and running_key(ln.text) in running)],
            p.height,
        )
        for p in pages
    ]


def paragraphs(page: Page) -> list[list[Line]]:
    """The page's lines grouped into paragraphs (see the module docstring)."""
    lines = page.lines
    if not lines:
        return []
    height = statistics.median(ln.height for ln in lines) or 1.0
    gaps = [a.bottom - b.top for a, b in itertools.pairwise(lines) if b.top <= a.top]
    usual_gap = statistics.median(gaps) if gaps else 0.0
    widths = sorted(ln.right - ln.left for ln in lines)
    usual_width = widths[int(0.9 * (len(widths) - 1))]
    out = [[lines[0]]]
    for prev, cur in itertools.pairwise(lines):
        if _starts_paragraph(prev, cur, (height, usual_gap + PARAGRAPH_GAP * height, usual_width)):
            out.append([cur])
        else:
            out[-1].append(cur)
    return out


def _starts_paragraph(prev: Line, cur: Line, usual: tuple[float, float, float]) -> bool:
    height, max_gap, usual_width = usual
    if abs(cur.bottom - prev.bottom) < 0.5 * height and cur.left >= prev.right - 1:
        return False  # the same visual line, cut in two by a wide space
    if cur.top > prev.top + 0.5 * height:  # the text jumps up: a new column or block,
        return not _runs_on(prev.text, cur.text)  # unless a sentence runs on into it
    if prev.bottom - cur.top > max_gap:
        return True
    short = prev.right - prev.left < SHORT_LINE * usual_width
    return short and not prev.hyphen and bool(_TERMINAL.search(prev.text))


def _runs_on(before: str, after: str) -> bool:
    """Whether a sentence runs on from ``before`` into ``after`` (no terminal punctuation,
    ``after`` starting lower-case): a column or page break inside a paragraph."""
    return not _TERMINAL.search(before) and after[:1].islower()


def hyphenated_words(pages: list[Page]) -> set[str]:
    """Every hyphenated compound the document writes within a line, lower-cased."""
    return {
        m.group().lower().replace("\u2010", "-")
        for p in pages
        for ln in p.lines
        for m in _HYPHENATED.finditer(ln.text)
    }


def join_lines(lines: list[Line], keep: set[str]) -> str:
    """A paragraph's lines as one line of text, hyphenated line ends rejoined."""
    out = lines[0].text
    hyphen = lines[0].hyphen
    for line in lines[1:]:
        out = _join(out, line.text, hyphen, keep)
        hyphen = line.hyphen
    out += "-" if hyphen else ""
    return out.replace("\u00ad", "")  # soft hyphens left inside lines are invisible


def _ends_hyphenated(text: str) -> bool:
    return text[-1:] in HYPHENS and text[-2:-1].isalnum()


def _join(left: str, right: str, marked: bool, keep: set[str]) -> str:
    """``left`` and ``right`` joined: with a space, or, when ``left`` ends in a hyphen the
    line was broken at (``marked``, or a letter or digit then a hyphen), as one word: the
    hyphen dropped between a word and a lower-case rest not known as a compound, kept
    otherwise ("2023-2024", "Anglo-Saxon", "well-known" when the document writes it)."""
    if not marked and not _ends_hyphenated(left):
        return f"{left} {right}"
    stem, hyphen = (left, "-") if marked else (left[:-1], left[-1])
    head, tail = _WORD_END.search(stem), _WORD_START.search(right)
    if hyphen == "\u00ad" or (
        head
        and tail
        and right[:1].islower()
        and f"{head.group()}-{tail.group()}".lower() not in keep
    ):
        return stem + right
    return f"{stem}{hyphen}{right}"


def page_text(page: Page, keep: set[str]) -> str:
    """One page's text: its paragraphs separated by blank lines."""
    return "\n\n".join(join_lines(para, keep) for para in paragraphs(page))


def assemble(texts: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """The pages' texts as one text and its page map (each page's [start, end) range;
    a page without text gets an empty range where it falls)."""
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    last: int | None = None  # the index of the last page with text
    pos = 0
    for text in texts:
        if not text:
            spans.append((pos, pos))
            continue
        if last is not None:
            joiner, parts[-1] = _page_joiner(parts[-1], text)
            end = spans[last][0] + len(parts[-1])
            spans[last + 1 :] = [(end, end)] * (len(spans) - last - 1)
            spans[last] = (spans[last][0], end)
            parts.append(joiner)
            pos = end + len(joiner)
        spans.append((pos, pos + len(text)))
        parts.append(text)
        pos += len(text)
        last = len(spans) - 1
    return "".join(parts), spans


def _page_joiner(before: str, after: str) -> tuple[str, str]:
    """(what goes between two pages' texts, the earlier text): a sentence running on to
    the next page is not cut by a paragraph break."""
    if not _runs_on(before, after):
        return "\n\n", before
    if _ends_hyphenated(before) and before[-2].isalpha():
        return "", before[:-1]  # a word hyphenated across the page break
    return " ", before
