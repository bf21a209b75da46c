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
        # (doc position, chunk offset, chunk text) for every non-blank chunk of every doc
        jobs: list[tuple[int, int, str]] = []
        for i, text in enumerate(texts):
            if text is None or not text.strip():
                continue
            for a, b in chunk_spans(text, self.cfg.chunk_chars):
                jobs.append((i, a, text[a:b]))
        out: dict[str, list] = {c: [] for c in self.output_columns}
        counters = [0] * len(texts)
        cap = self.cfg.max_sentences
        for (i, offset, _), doc in zip(jobs, self.nlp.pipe(j[2] for j in jobs), strict=True):
            for sent in doc.sents:
                raw = sent.text
                stripped = raw.strip()
                if not stripped:
                    continue
                counters[i] += 1
                if counters[i] > cap:  # refused below: count on, keep no more rows
                    continue
                start = offset + sent.start_char + (len(raw) - len(raw.lstrip()))
                out[DOC_ID].append(doc_ids[i])
                out[SENT_INDEX].append(counters[i] - 1)
                out[START_CHAR].append(start)
                out[END_CHAR].append(start + len(stripped))
                out[TEXT].append(stripped)
        result = pa.Table.from_pydict(out, schema=SENTENCES_SCHEMA)
        over = {doc_ids[i]: n for i, n in enumerate(counters) if n > cap}
        if over:
            raise DocumentsRejected(
                {doc: ("TooManySentences", _too_many(doc, n, cap)) for doc, n in over.items()},
                result.filter(pc.invert(pc.is_in(result[DOC_ID], pa.array(list(over))))),
            )
        return result

    def teardown(self) -> None:
        self.nlp = None
