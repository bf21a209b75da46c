"""The ``language`` stage: each sentence's language (ISO 639-1), before the encoder.

A built-in, always-on stage right before ``embed`` (``sentencize -> [privacy] ->
[entities] -> language -> embed -> classify``). It writes the ``language`` column, and the
classify stage gives a sentence whose language the head was not trained on (its
training.json ``languages``, ``["en"]`` when absent) a null label and score instead of a
confident wrong one.

The detector is lingua (``lingua-language-detector``): its n-gram models ship inside the
wheel, nothing is downloaded. How a batch is decided (a batch holds whole documents: pieces
and slices are cut at document boundaries, so each document's sentences are all here):

1. Each sentence is cleaned of what says nothing about a language (URLs, ``$TICKER``,
   ``#tag``, ``@handle``, numbers). Under ``min_words`` letter words left, it is *short*.
2. A quick pass (lingua's low-accuracy mode, trigrams only) settles a sentence when it
   names one of ``fast_languages`` (the corpus' main language, ``["en"]``) with at least
   ``fast_confidence``; every other sentence goes through the full detector (1- to
   5-grams). The quick pass only ever confirms a fast language, so a sentence in any other
   language is always judged by the full detector (measured: the same labels kept, a
   third of the cost; BENCHMARKS.md).
3. A sentence is *decided* when it is not short and its top language has at least
   ``min_confidence``. Its document's language is the language of most decided characters;
   with no decided sentence, the full detector's reading of the document's joined text if
   that reaches ``min_confidence``, else ``default``.
4. A decided sentence keeps its own language; every other one (a headline, "Shares fell.",
   a line of tickers) takes its document's.

The candidates are ``languages`` (default: 20 languages of financial reporting, see
DEFAULT_LANGUAGES; ``["all"]`` for lingua's 75, about 4.5x the cost for no gain on the
measured English news). A sentence in a language outside the set is read as the nearest
one in it, which is never the head's language for text in another script.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, ValidationInfo, field_validator, model_validator

from docintel.pipeline.schema import BACKEND_CPU_FP32, DOC_ID, LANGUAGE, TEXT
from docintel.pipeline.settings import Settings
from docintel.pipeline.stages.base import Stage

NAME = "language"
LINGUA = "lingua"  # the backend key
# Languages of financial reporting and news: the EU's large ones, the Nordics, and the
# big non-Latin-script markets. Each Latin-script candidate costs detector time on every
# sentence (non-Latin ones are ruled out by their alphabet first).
DEFAULT_LANGUAGES = (
    "en de fr es it pt nl sv da nb fi pl cs ru tr zh ja ko ar hi".split()  # noqa: SIM905
)
ALL = "all"
# What tells nothing of a language: links, cashtags, hashtags, handles, figures.
_NOISE = re.compile(r"https?://\S+|www\.\S+|[$#@]\w+|\d[\d.,:/%-]*")
_WORD = re.compile(r"[^\W\d_]{2,}")
DOC_SAMPLE_CHARS = 1_000  # of a document's joined text, when no sentence decides it


def _known_codes() -> set[str]:
    from lingua import Language

    return {lang.iso_code_639_1.name.lower() for lang in Language.all()}


class LanguageConfig(Settings):
    """The ``[language]`` config section (the stage's declaration names it)."""

    # candidate languages, ISO 639-1 codes; ["all"]: every language lingua knows (75)
    languages: list[str] = Field(default_factory=lambda: list(DEFAULT_LANGUAGES))
    # a sentence's own detection counts at this confidence (0-1) and with this many words
    min_confidence: float = Field(0.5, ge=0, le=1)
    min_words: int = Field(3, ge=1)
    # the quick low-accuracy pass settles these languages at fast_confidence; [] = off
    fast_languages: list[str] = Field(default_factory=lambda: ["en"])
    fast_confidence: float = Field(0.9, gt=0, le=1)
    # a document in which nothing is confidently detected (tickers, a two-word line)
    default: str = "en"

    @field_validator("languages", "fast_languages", mode="after")
    @classmethod
    def _codes(cls, v: list[str], info: ValidationInfo) -> list[str]:
        codes = [c.strip().lower() for c in v]
        if codes == [ALL] and info.field_name == "languages":
            return codes
        unknown = sorted(set(codes) - _known_codes())
        if unknown:
            raise ValueError(
                f"[language]: {unknown} are not ISO 639-1 codes of a language lingua detects "
                '(two letters, such as "en", "de"; or ["all"])'
            )
        return codes

    @model_validator(mode="after")
    def _fast_among_candidates(self) -> LanguageConfig:
        if self.languages != [ALL]:
            outside = sorted(set(self.fast_languages) - set(self.languages))
            if outside:
                raise ValueError(
                    f"[language] fast_languages {outside} are not among [language] languages"
                )
        return self

    @field_validator("default", mode="after")
    @classmethod
    def _default(cls, v: str) -> str:
        code = v.strip().lower()
        if code not in _known_codes():
            raise ValueError(f"[language] default {v!r} is not an ISO 639-1 code lingua knows")
        return code


def lingua_version() -> str:
    try:
        return importlib.metadata.version("lingua-language-detector")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a broken install
        return "unknown"


def settings_digest(cfg: LanguageConfig) -> str:
    """12 hex of the settings: two runs with the same digest decide alike."""
    return hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()[:12]


def clean(text: str) -> str:
    """``text`` without links, cashtags, hashtags, handles and figures."""
    return _NOISE.sub(" ", text)


def n_words(text: str) -> int:
    return len(_WORD.findall(text))


class LanguageDetector(Stage):
    """Writes ``language`` on every sentence row (see the module's docstring)."""

    name: ClassVar[str] = NAME
    input_columns: ClassVar[tuple[str, ...]] = (DOC_ID, TEXT)
    output_columns: ClassVar[tuple[str, ...]] = (LANGUAGE,)

    def __init__(self, cfg: LanguageConfig) -> None:
        self.cfg = cfg
        self.full: Any = None
        self.quick: Any = None
        self.fast: set[Any] = set()

    def _builder(self) -> Any:
        from lingua import IsoCode639_1, LanguageDetectorBuilder

        if self.cfg.languages == [ALL]:
            return LanguageDetectorBuilder.from_all_languages()
        codes = [getattr(IsoCode639_1, c.upper()) for c in self.cfg.languages]
        return LanguageDetectorBuilder.from_iso_codes_639_1(*codes)

    def setup(self) -> None:
        # models load lazily on first use (only the languages a text's alphabet allows),
        # and are shared by both detectors: the quick one reads the trigram models only
        self.full = self._builder().build()
        self.quick = (
            self._builder().with_low_accuracy_mode().build() if self.cfg.fast_languages else None
        )
        self.fast = set(self.cfg.fast_languages)
        self.backend = BACKEND_CPU_FP32
        self.version = f"lingua-{lingua_version()}+{settings_digest(self.cfg)}"

    def _top(self, detector: Any, text: str) -> tuple[str | None, float]:
        values = detector.compute_language_confidence_values(text)
        if not values or values[0].value <= 0:
            return None, 0.0
        return values[0].language.iso_code_639_1.name.lower(), float(values[0].value)

    def sentence(self, text: str) -> tuple[str | None, float, bool]:
        """``(language, confidence, decided)`` of one sentence's text."""
        cleaned = clean(text)
        words = n_words(cleaned)
        if not words:
            return None, 0.0, False
        if self.quick is not None and words >= self.cfg.min_words:
            lang, conf = self._top(self.quick, cleaned)
            if lang in self.fast and conf >= self.cfg.fast_confidence:
                return lang, conf, True
        lang, conf = self._top(self.full, cleaned)
        decided = lang is not None and conf >= self.cfg.min_confidence
        return lang, conf, decided and words >= self.cfg.min_words

    def document(self, texts: Sequence[str]) -> list[str]:
        """Each sentence's language, one document's sentences in order."""
        found = [self.sentence(t) for t in texts]
        weight: dict[str, int] = {}
        for text, (lang, _conf, decided) in zip(texts, found, strict=True):
            if decided and lang is not None:
                weight[lang] = weight.get(lang, 0) + len(text)
        doc = max(weight, key=lambda k: weight[k]) if weight else self._fallback(texts)
        return [lang if decided and lang is not None else doc for lang, _conf, decided in found]

    def _fallback(self, texts: Sequence[str]) -> str:
        joined = clean(" ".join(texts))[:DOC_SAMPLE_CHARS]
        lang, conf = self._top(self.full, joined) if n_words(joined) else (None, 0.0)
        return lang if lang is not None and conf >= self.cfg.min_confidence else self.cfg.default

    def __call__(self, table: pa.Table) -> pa.Table:
        ids = table[DOC_ID].to_pylist()
        texts = table[TEXT].to_pylist()
        rows: dict[str, list[int]] = {}
        for i, doc in enumerate(ids):
            rows.setdefault(doc, []).append(i)
        out: list[str] = [""] * len(ids)
        for idx in rows.values():
            for i, lang in zip(idx, self.document([texts[i] or "" for i in idx]), strict=True):
                out[i] = lang
        return table.append_column(LANGUAGE, pa.array(out, pa.string()))

    def teardown(self) -> None:
        self.full = self.quick = None


def document_languages(sentences: pa.Table, doc_index: np.ndarray, n_docs: int) -> pa.Array:
    """``documents.language``: per document (``doc_index``: each sentence row's document),
    the language of most of its sentences (a tie: the one its earliest sentence has); null
    for a document without sentences, or sentences without a ``language`` column."""
    out: list[str | None] = [None] * n_docs
    if LANGUAGE not in sentences.column_names:
        return pa.array(out, pa.string())
    counts: list[dict[str, int]] = [{} for _ in range(n_docs)]
    for doc, lang in zip(doc_index, sentences[LANGUAGE].to_pylist(), strict=True):
        if lang is not None:
            counts[doc][lang] = counts[doc].get(lang, 0) + 1
    for i, c in enumerate(counts):
        if c:  # dicts keep first-seen order and max() the first of equals: earliest wins
            out[i] = max(c, key=lambda k, c=c: c[k])
    return pa.array(out, pa.string())


def _placeholder(cfg: Any) -> Any:
    """Every sentence in ``[language] default`` (modelled replicas: no lingua)."""
    default = cfg.language.default

    def columns(table: pa.Table) -> dict[str, pa.Array]:
        return {LANGUAGE: pc.cast(pa.array([default] * table.num_rows), pa.string())}

    return columns


def _spec() -> Any:
    from docintel.pipeline.stages.spec import LIGHT_STAGE_CPUS, Backend, PoolDefaults, StageSpec

    return StageSpec(
        name=LanguageDetector.name,
        cls=LanguageDetector,
        backends={LINGUA: Backend(lambda cfg, _pool: LanguageDetector(cfg.language))},
        choose=lambda _cfg, _pool: LINGUA,
        # CPU only: ~0.4 CPU-s per 1,000 news sentences (bench/language.py)
        pool=PoolDefaults(LIGHT_STAGE_CPUS),
        section=LanguageConfig,
        placeholder=_placeholder,
        has_weights=False,
    )


LANGUAGE_SPEC = _spec()
