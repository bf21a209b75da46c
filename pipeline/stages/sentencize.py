"""Sentence splitting with spaCy, keeping character offsets into the original text."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from docintel.pipeline.errors import DocumentsRejected, ModelError
from docintel.pipeline.schema import (
    DOC_ID,
    END_CHAR,
    SENT_INDEX,
    SPACY,
    START_CHAR,
    TEXT,
    backend_label,
)
from docintel.pipeline.settings import Settings
from docintel.pipeline.stages.base import Placement, Stage, cuda_available

# spaCy's rule-based sentencizer on a blank English pipeline: no model download needed.
DEFAULT_SPACY_MODEL = "blank:en"
# spaCy refuses texts longer than nlp.max_length (1,000,000) and its memory grows with
# text length; longer documents are cut at whitespace into chunks of at most this many
# characters and sentencized chunk by chunk, offsets kept relative to the whole document.
DEFAULT_CHUNK_CHARS = 100_000
# A document that splits into more sentences than this becomes an error row (stage
# sentencize, TooManySentences) instead of flooding one batch: 20,000 sentences is a
# 500-page book; a 300,000-"sentence" document is a log dump or a table, not prose.
DEFAULT_MAX_SENTENCES = 20_000


class SentencizeConfig(Settings):
    """The ``[sentencize]`` config section (the stage's registry declaration names it)."""

    spacy_model: str = DEFAULT_SPACY_MODEL
    chunk_chars: int = Field(DEFAULT_CHUNK_CHARS, ge=1_000)
    max_sentences: int = Field(DEFAULT_MAX_SENTENCES, ge=1)  # per document; more: error row


_SENT_COMPONENTS = ("parser", "senter", "sentencizer")
_LAST_SPACE = re.compile(r"\s(?=\S*\Z)")
# A blank line (two line breaks with only spaces or tabs between) ends a paragraph, and no
# sentence spans one: a headline and the first sentence, two paragraphs, a heading and its
# text (the parse stage writes a blank line after each) are never one sentence.
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")
# Inside a sentence, a line break and the blanks around it (wrapped text, PDF lines) are
# one space in the stored text; start_char/end_char still index the document's text.
_LINE_BREAK = re.compile(r"[^\S\n]*\r?\n\s*")
# spaCy's rule-based sentencizer ends a sentence after its final punctuation and the
# opening quote of the next one ('... fell. "We'); a quote after a blank at a sentence's
# end opens the next sentence, and one before a blank at a sentence's start closes the
# previous one ('"' and curly quotes; straight single quotes are apostrophes too).
_OPENING_AT_END = re.compile(r"\s([\"\u201c\u2018\u00ab]+)\Z")  # ", curly, guillemet
_CLOSING_AT_START = re.compile(r"\A([\"\u201d\u2019\u00bb]+)(?=\s|\Z)")  # their closing forms

SENTENCES_SCHEMA = pa.schema(
    [
        pa.field(DOC_ID, pa.string(), nullable=False),
        pa.field(SENT_INDEX, pa.int32(), nullable=False),
        pa.field(START_CHAR, pa.int64(), nullable=False),
        pa.field(END_CHAR, pa.int64(), nullable=False),
        pa.field(TEXT, pa.string(), nullable=False),
    ]
)


def chunk_spans(text: str, limit: int) -> list[tuple[int, int]]:
    """Cut ``text`` into spans of at most ``limit`` chars, at the last whitespace if any."""
    spans = []
    start = 0
    while len(text) - start > limit:
        window = text[start : start + limit]
        m = _LAST_SPACE.search(window)
        cut = start + (m.start() + 1 if m and m.start() > limit // 2 else limit)
        spans.append((start, cut))
        start = cut
    spans.append((start, len(text)))
    return spans


def paragraph_spans(text: str) -> list[tuple[int, int]]:
    """The paragraphs of ``text`` (cut at blank lines), blank ones left out."""
    spans, start = [], 0
    for m in _PARAGRAPH_BREAK.finditer(text):
        spans.append((start, m.start()))
        start = m.end()
    spans.append((start, len(text)))
    return [(a, b) for a, b in spans if text[a:b].strip()]


def joined(text: str) -> str:
    """A sentence as stored: its line breaks (and the blanks around them) one space."""
    return _LINE_BREAK.sub(" ", text) if "\n" in text else text


def mend_quotes(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sentence spans of one paragraph with each quote where it belongs: an opening quote
    that ended a sentence starts the next one, a closing quote that started one ends the
    previous one. Spans stay stripped, ordered and non-empty."""
    out = list(spans)
    for k in range(len(out) - 1):
        (a, b), (c, d) = out[k], out[k + 1]
        m = _OPENING_AT_END.search(text, a, b)
        if m and m.start(1) > a:
            out[k], out[k + 1] = (a, len(text[a : m.start(1)].rstrip()) + a), (m.start(1), d)
            continue
        m = _CLOSING_AT_START.match(text, c, d)
        if m and m.end(1) < d:
            rest = c + len(text[c:d]) - len(text[m.end(1) : d].lstrip())
            out[k], out[k + 1] = (a, m.end(1)), (rest, d)
    return [(a, b) for a, b in out if b > a]


def load_spacy(name: str) -> Any:
    """``blank:<lang>`` = blank pipeline + rule-based sentencizer; else an installed pipeline."""
    import spacy

    if name.startswith("blank:"):
        nlp = spacy.blank(name.split(":", 1)[1])
    else:
        try:
            nlp = spacy.load(name)
        except OSError as e:
            raise ModelError(
                f"spaCy pipeline {name!r} is not installed (spaCy said: {e}); install its "
                'package, or set [sentencize] spacy_model = "blank:en" for the rule-based '
                "sentencizer"
            ) from e
    if not any(nlp.has_pipe(c) for c in _SENT_COMPONENTS):
        nlp.add_pipe("sentencizer")
    return nlp


def check_spacy_model(name: str) -> None:
    """On the driver, before any work: a named spaCy pipeline is installed (or a folder)."""
    if name.startswith("blank:"):
        return
    import spacy.util

    if not (spacy.util.is_package(name) or Path(name).is_dir()):
        raise ModelError(
            f"spaCy pipeline {name!r} is not installed; install its package "
            'or use [sentencize] spacy_model = "blank:en"'
        )


def _too_many(doc: str, n: int, cap: int) -> str:
    return (
        f"document {doc!r} splits into {n:,} sentences, over the limit of {cap:,} "
        "([sentencize] max_sentences); split the document, or raise the limit"
    )


def _import_spacy(without_torch: bool) -> Any:
    """spaCy; for a rule-based blank pipeline, without letting thinc import torch.

    thinc imports torch when it is installed, for wrappers a rule-based pipeline never uses:
    about 2 s of start-up and a few hundred MB per sentencize replica. Blocking the import
    while spaCy loads makes thinc see no torch in this process; trained pipelines (which
    may need it) and GPU replicas import spaCy normally.
    """
    if not without_torch or "spacy" in sys.modules or "torch" in sys.modules:
        import spacy

        return spacy
    sys.modules["torch"] = None  # type: ignore[assignment]  # import torch -> ImportError
    try:
        import spacy
    finally:
        del sys.modules["torch"]
    return spacy


class Sentencizer(Stage):
    name: ClassVar[str] = "sentencize"
    input_columns: ClassVar[tuple[str, ...]] = (DOC_ID, TEXT)
    output_columns: ClassVar[tuple[str, ...]] = (DOC_ID, SENT_INDEX, START_CHAR, END_CHAR, TEXT)
    keeps_input: ClassVar[bool] = False  # one row per sentence replaces one row per document

    def __init__(self, cfg: SentencizeConfig, placement: Placement | None = None) -> None:
        self.cfg = cfg
        self.placement = placement or Placement()
        self.nlp: Any = None

    def setup(self) -> None:
        blank = self.cfg.spacy_model.startswith("blank:") and not self.placement.wants_gpu
        spacy = _import_spacy(without_torch=blank)
        self.backend = backend_label(SPACY)
        if self.placement.wants_gpu:  # the rule-based sentencizer stays on the CPU anyway
            if not cuda_available():
                self.backend = backend_label(SPACY, gpu=True)
            elif spacy.prefer_gpu():  # needs cupy; a trained pipeline then runs on the GPU
                self.backend = backend_label(SPACY, gpu=True, cuda=True)
        self.nlp = load_spacy(self.cfg.spacy_model)
        self.nlp.max_length = self.cfg.chunk_chars + 1
        meta = self.nlp.meta
        pipe = f"{meta['lang']}_{meta['name']}-{meta['version']}"
        self.version = f"spacy-{spacy.__version__}:{pipe}"

    def __call__(self, table: pa.Table) -> pa.Table:
        doc_ids = table[DOC_ID].to_pylist()
        texts = table[TEXT].to_pylist()
        jobs = self._jobs(texts)
        out: dict[str, list] = {c: [] for c in self.output_columns}
        counters = [0] * len(texts)
        cap = self.cfg.max_sentences
        for (i, offset, chunk), doc in zip(jobs, self.nlp.pipe(j[2] for j in jobs), strict=True):
            for start, end in self._spans(texts[i], offset, chunk, doc):
                counters[i] += 1
                if counters[i] > cap:  # refused below: count on, keep no more rows
                    continue
                out[DOC_ID].append(doc_ids[i])
                out[SENT_INDEX].append(counters[i] - 1)
                out[START_CHAR].append(start)
                out[END_CHAR].append(end)
                out[TEXT].append(joined(texts[i][start:end]))
        result = pa.Table.from_pydict(out, schema=SENTENCES_SCHEMA)
        over = {doc_ids[i]: n for i, n in enumerate(counters) if n > cap}
        if over:
            raise DocumentsRejected(
                {doc: ("TooManySentences", _too_many(doc, n, cap)) for doc, n in over.items()},
                result.filter(pc.invert(pc.is_in(result[DOC_ID], pa.array(list(over))))),
            )
        return result

    def _jobs(self, texts: list[str | None]) -> list[tuple[int, int, str]]:
        """(doc position, chunk offset, chunk text) for every chunk of every paragraph of
        every document that has text: a chunk never crosses a paragraph break."""
        jobs: list[tuple[int, int, str]] = []
        for i, text in enumerate(texts):
            if text is None or not text.strip():
                continue
            for p, q in paragraph_spans(text):
                for a, b in chunk_spans(text[p:q], self.cfg.chunk_chars):
                    jobs.append((i, p + a, text[p + a : p + b]))
        return jobs

    @staticmethod
    def _spans(text: str, offset: int, chunk: str, doc: Any) -> list[tuple[int, int]]:
        """The sentences spaCy found in one chunk, as stripped spans of the document's
        text, with their quotes mended."""
        spans = []
        for sent in doc.sents:
            raw = sent.text
            stripped = raw.strip()
            if stripped:
                start = offset + sent.start_char + (len(raw) - len(raw.lstrip()))
                spans.append((start, start + len(stripped)))
        del chunk  # the spans index ``text``; the chunk was spaCy's input
        return mend_quotes(text, spans)

    def teardown(self) -> None:
        self.nlp = None
