"""The ``privacy`` stage: personal values redacted before anything else sees a sentence.

An optional built-in stage, right after ``sentencize`` (the chain is
``sentencize -> privacy -> embed -> classify``), that runs only when ``[privacy] redact``
asks (or ``docintel run --redact``). On each sentence row it replaces ``text`` by the
redacted text (each value a ``<TYPE>`` placeholder, :class:`~docintel.pipeline.privacy.
Redactor`) and adds a ``pii`` column, ``list<struct<type, start, end>>``: the
placeholders' spans in the stored text, never the values. ``start_char``/``end_char`` are
left as the sentencizer wrote them: they index the original document. Every later stage,
the sink, search, the index and the audit report see only the redacted text.

Settings (``[privacy]``, checked when the config loads, exit 2 naming the culprit)::

    [privacy]
    redact = true                       # false (default); true = every built-in type;
                                        # or a list: ["EMAIL_ADDRESS", "PHONE_NUMBER"]
    [privacy.patterns]
    CUSTOMER_ID = 'CU-\\d{6}'           # your own types: NAME = "regex" -> <NAME>

What a run records (never a value, nor a user regex, which may spell one out): the
manifest's ``privacy`` (redacted or not, the types, the pattern names), the plan key's
``privacy`` (the same with a digest of each regex, so a resume cannot change the setting),
the config section with each regex replaced by its digest, and the ``privacy_model`` column
(the detection libraries' versions and the setting's digest).

A sentence whose redaction raises takes its document out of the batch as an error row
(``RedactionFailed``) whose message names the document and the exception type only: an
exception's own text may quote the sentence. The raw text never goes on.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.metadata
import itertools
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import pyarrow as pa
from pydantic import Field, StrictBool, model_validator

from docintel.pipeline.errors import ConfigError, DocumentsRejected
from docintel.pipeline.schema import (
    DOC_ID,
    END_CHAR,
    SENT_INDEX,
    START_CHAR,
    TEXT,
    backend_label,
)
from docintel.pipeline.settings import Settings
from docintel.pipeline.stages.base import Stage
from docintel.pipeline.stages.spec import (
    LIGHT_STAGE_CPUS,
    Backend,
    PoolDefaults,
    StageFacts,
    StageSpec,
)

if TYPE_CHECKING:
    from docintel.pipeline.config import Config
    from docintel.pipeline.privacy.redactor import Redactor

NAME = "privacy"  # the stage, its [privacy] section and the manifest's key
PII = "pii"  # the sentences column of the placeholders' spans
PII_TYPE = pa.list_(pa.struct([("type", pa.string()), ("start", pa.int32()), ("end", pa.int32())]))
RULES = "rules"  # the backend key: detection by regexes and validators, on the CPU
# The libraries whose rules decide what is found: their versions are the stage's "model".
DETECTION_LIBRARIES = ("phonenumbers", "python-stdnum")
DIGEST_CHARS = 16  # of a SHA-256 hex digest: a regex is recognised, never spelled out


class PrivacyConfig(Settings):
    """The ``[privacy]`` config section (the stage's declaration names it)."""

    # false = no redaction; true = every built-in type; a list = those built-in types
    # (with [privacy.patterns] alone: an empty list)
    redact: StrictBool | list[str] = False
    # your own types, NAME = "regex": each match becomes <NAME> (checked even when off)
    patterns: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _checked(self) -> PrivacyConfig:
        if isinstance(self.redact, list) or self.patterns:
            try:
                self.redactor()  # the types and every regex, as a run would build them
            except ConfigError as e:  # the library names the types' key "types"
                raise ValueError(str(e).replace("[privacy] types:", "[privacy] redact:")) from None
        if self.redact == [] and not self.patterns:
            raise ValueError(
                "[privacy] redact = [] names no type and [privacy.patterns] is empty: "
                "nothing would be redacted; name types, set redact = true (every type), "
                "or redact = false"
            )
        return self

    @property
    def on(self) -> bool:
        """Whether runs redact (the stage joins the chain)."""
        return self.redact is not False

    def redactor(self) -> Redactor:
        """The redactor of this setting (refused with ``ConfigError`` when bad)."""
        from docintel.pipeline.privacy.redactor import Redactor

        types = None if self.redact is True else list(self.redact or ())
        return Redactor(types, self.patterns)


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_CHARS]


def pattern_digests(cfg: PrivacyConfig) -> dict[str, str]:
    """Each user pattern's name and a digest of its regex (never the regex itself)."""
    return {name: _digest(regex) for name, regex in cfg.patterns.items()}


def manifest_record(cfg: Config) -> dict[str, Any]:
    """The manifest's ``privacy``: redacted or not, and with which types and pattern names."""
    section: PrivacyConfig = cfg.privacy
    if not section.on:
        return {"redacted": False}
    r = section.redactor()
    return {"redacted": True, "types": list(r.types), "patterns": list(r.patterns)}


def plan_setting(cfg: Config) -> dict[str, Any]:
    """The plan key's ``privacy``: the manifest's record with a digest of each regex, so a
    resume (or a completed run's no-op) with any other setting is refused."""
    record = manifest_record(cfg)
    if record["redacted"]:
        record["patterns"] = pattern_digests(cfg.privacy)
    return record


def recorded_section(cfg: Config) -> dict[str, Any]:
    """The ``[privacy]`` section as a manifest's config records it: regexes as digests."""
    section: PrivacyConfig = cfg.privacy
    return {"redact": section.redact, "patterns": pattern_digests(section)}


def version(section: PrivacyConfig) -> str:
    """The ``privacy_model`` value: the detection libraries' versions and the setting's
    digest (the types, the patterns' names and regexes)."""
    libs = "+".join(f"{n}-{importlib.metadata.version(n)}" for n in DETECTION_LIBRARIES)
    r = section.redactor()
    setting = json.dumps({"types": list(r.types), "patterns": r.patterns}, sort_keys=True)
    return f"redact:{libs}:{_digest(setting)}"


class Sentence(NamedTuple):
    """One output row of a document: the input row it stands for (its first, when
    sentences were merged), its redacted text, its span in the original document and its
    placeholders' spans in the text."""

    row: int
    text: str
    start_char: int
    end_char: int
    pii: list[dict[str, Any]]


def _document_text(texts: list[str], starts: list[int], ends: list[int]) -> tuple[str, list[int]]:
    """One document's sentences as one text (a space where the document had blanks between
    them, nothing where they touched), and where each sentence starts in it."""
    parts: list[str] = []
    at: list[int] = []
    pos = 0
    for k, text in enumerate(texts):
        if k and starts[k] > ends[k - 1]:
            parts.append(" ")
            pos += 1
        at.append(pos)
        parts.append(text)
        pos += len(text)
    return "".join(parts), at


def _groups(at: list[int], lengths: list[int], values: list[tuple[int, int]]) -> list[int]:
    """Per sentence, the first sentence of its group: a value that runs from one sentence
    into the next (the sentencizer cut ``j.smith@bank.`` from ``com``) joins them."""
    first = list(range(len(at)))
    for s, e in values:
        k0 = bisect.bisect_right(at, s) - 1
        k1 = bisect.bisect_right(at, e - 1) - 1
        if e - 1 >= at[k1] + lengths[k1] and k1 + 1 < len(at):  # it ends in the blank after
            k1 += 1
        for k in range(k0 + 1, k1 + 1):
            first[k] = first[k0]
    return first


def redact_document(
    redactor: Redactor, texts: list[str], starts: list[int], ends: list[int]
) -> list[Sentence]:
    """One document's sentences (in order) redacted as one text, so that a value the
    sentencizer cut in two is still found. Sentences that a value runs across become one
    (``start_char`` of the first, ``end_char`` of the last); every other sentence keeps its
    span, and its text is its own text redacted."""
    whole, at = _document_text(texts, starts, ends)
    red = redactor.redact_mapped(whole)
    if not red.spans:
        return [Sentence(k, t, starts[k], ends[k], []) for k, t in enumerate(texts)]
    pairs = red.offsets.pairs  # (red_start, red_end, orig_start, orig_end), in order
    first = _groups(at, [len(t) for t in texts], [(p[2], p[3]) for p in pairs])
    orig_ends = [p[3] for p in pairs]
    shift = list(itertools.accumulate((p[1] - p[0]) - (p[3] - p[2]) for p in pairs))
    span_starts = [sp["start"] for sp in red.spans]

    def mapped(pos: int) -> int:  # a position between values: where it is in red.text
        n = bisect.bisect_right(orig_ends, pos)
        return pos + (shift[n - 1] if n else 0)

    last = {k0: k for k, k0 in enumerate(first)}  # each group's last sentence (in order)
    out = []
    for k0, k1 in last.items():
        a, b = mapped(at[k0]), mapped(at[k1] + len(texts[k1]))
        lo, hi = bisect.bisect_left(span_starts, a), bisect.bisect_left(span_starts, b)
        pii = [{**sp, "start": sp["start"] - a, "end": sp["end"] - a} for sp in red.spans[lo:hi]]
        out.append(Sentence(k0, red.text[a:b], starts[k0], ends[k1], pii))
    return out


class RedactionFailed(Exception):
    """A sentence's redaction raised; the message names the document, never its text."""


class Redact(Stage):
    """Sentence rows in, the same rows out with ``text`` redacted and ``pii`` added (and,
    where a value ran across sentences, those sentences as one row: ``sent_index`` then
    counts the document's rows again from 0)."""

    name: ClassVar[str] = NAME
    input_columns: ClassVar[tuple[str, ...]] = (DOC_ID, SENT_INDEX, START_CHAR, END_CHAR, TEXT)
    output_columns: ClassVar[tuple[str, ...]] = (SENT_INDEX, START_CHAR, END_CHAR, TEXT, PII)
    keeps_input: ClassVar[bool] = True

    def __init__(self, cfg: PrivacyConfig) -> None:
        self.cfg = cfg
        self.redactor: Redactor | None = None

    def setup(self) -> None:
        self.redactor = self.cfg.redactor()
        self.backend = backend_label(RULES)
        self.version = version(self.cfg)

    def __call__(self, table: pa.Table) -> pa.Table:
        assert self.redactor is not None, "setup() first"
        cols = {c: table[c].to_pylist() for c in (DOC_ID, SENT_INDEX, START_CHAR, END_CHAR)}
        texts = [t or "" for t in table[TEXT].to_pylist()]
        rows: dict[str, list[int]] = {}
        for i, doc in enumerate(cols[DOC_ID]):
            rows.setdefault(doc, []).append(i)
        kept: list[tuple[int, Sentence, int]] = []  # (input row, its output, sent_index)
        failed: dict[str, tuple[str, str]] = {}
        for doc, idx in rows.items():
            idx.sort(key=cols[SENT_INDEX].__getitem__)
            starts = [cols[START_CHAR][i] for i in idx]
            ends = [cols[END_CHAR][i] for i in idx]
            try:
                found = redact_document(self.redactor, [texts[i] for i in idx], starts, ends)
            except Exception as e:  # its message may quote the text: withheld
                failed[doc] = ("RedactionFailed", _failure(doc, e))
                continue
            merged = len(found) < len(idx)
            for n, s in enumerate(found):
                kept.append((idx[s.row], s, n if merged else cols[SENT_INDEX][idx[s.row]]))
        kept.sort(key=lambda k: k[0])
        out = _rows(table, kept)
        if failed:  # the document's rows leave the batch: no raw sentence goes on
            raise DocumentsRejected(failed, out)
        return out


def _rows(table: pa.Table, kept: list[tuple[int, Sentence, int]]) -> pa.Table:
    """The input rows ``kept`` names, with their redacted text, span, index and ``pii``."""
    out = table.take(pa.array([k[0] for k in kept], pa.int64()))
    columns = {
        SENT_INDEX: pa.array([k[2] for k in kept], table.schema.field(SENT_INDEX).type),
        START_CHAR: pa.array([k[1].start_char for k in kept], table.schema.field(START_CHAR).type),
        END_CHAR: pa.array([k[1].end_char for k in kept], table.schema.field(END_CHAR).type),
        TEXT: pa.array([k[1].text for k in kept], pa.string()),
    }
    for name, column in columns.items():
        i = out.schema.get_field_index(name)
        out = out.set_column(i, out.schema.field(i), column)
    return out.append_column(pa.field(PII, PII_TYPE), pa.array([k[1].pii for k in kept], PII_TYPE))


def _failure(doc: str, e: Exception) -> str:
    return (
        f"redacting a sentence of document {doc!r} failed with {type(e).__name__}; its "
        "message is withheld, as it may quote the text. The document is left out of the "
        "output; report it with the exception type"
    )


def check_place(specs: Sequence[StageSpec]) -> None:
    """With redaction on, no user stage runs before it: one would see the raw text (a
    ``[pipeline] stages`` list may put user stages anywhere else). ConfigError, exit 2."""
    names = [s.name for s in specs]
    if NAME not in names:
        return
    before = [s.name for s in specs[: names.index(NAME)] if not s.builtin]
    if before:
        raise ConfigError(
            f"[pipeline] stages puts the user stage(s) {before} before {NAME!r}: with "
            "[privacy] redact on, no stage may see a sentence before it is redacted; list "
            f"them after {NAME!r}"
        )


def _check(cfg: Config) -> StageFacts:
    """On the driver, before any work: the setting builds (the config load checked it)."""
    return StageFacts(version=version(cfg.privacy))


def _placeholder(_cfg: Config) -> Callable[[pa.Table], dict[str, pa.Array]]:
    """A modelled replica (benchmarks only): no placeholder found, the text as it came."""

    def columns(table: pa.Table) -> dict[str, pa.Array]:
        return {PII: pa.array([[]] * table.num_rows, PII_TYPE)}

    return columns


PRIVACY = StageSpec(
    name=Redact.name,
    cls=Redact,
    backends={RULES: Backend(lambda cfg, _pool: Redact(cfg.privacy))},
    choose=lambda _cfg, _pool: RULES,
    # CPU replicas only (no share of a card: the GPU stages' shares stay as they are); a
    # [resources.privacy] table with gpu_fraction asks for GPU replicas, as a user stage's
    pool=PoolDefaults(LIGHT_STAGE_CPUS),
    section=PrivacyConfig,
    check=_check,
    placeholder=_placeholder,
    has_weights=False,
    wanted=lambda cfg: bool(cfg.privacy.on),
    wanted_by="[privacy] redact (or --redact)",
)
