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

import hashlib
import importlib.metadata
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, StrictBool, model_validator

from docintel.pipeline.errors import ConfigError, DocumentsRejected
from docintel.pipeline.schema import DOC_ID, TEXT, backend_label
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


class RedactionFailed(Exception):
    """A sentence's redaction raised; the message names the document, never its text."""


class Redact(Stage):
    """Sentence rows in, the same rows out with ``text`` redacted and ``pii`` added."""

    name: ClassVar[str] = NAME
    input_columns: ClassVar[tuple[str, ...]] = (DOC_ID, TEXT)
    output_columns: ClassVar[tuple[str, ...]] = (TEXT, PII)
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
        redact = self.redactor.redact
        texts: list[str] = []
        spans: list[list[dict[str, Any]]] = []
        failed: dict[str, tuple[str, str]] = {}
        ids = table[DOC_ID].to_pylist()
        for doc, text in zip(ids, table[TEXT].to_pylist(), strict=True):
            try:
                red, found = redact(text) if text else (text, [])
            except Exception as e:  # its message may quote the text: withheld
                failed.setdefault(doc, ("RedactionFailed", _failure(doc, e)))
                red, found = "", []
            texts.append(red)
            spans.append(found)
        i = table.schema.get_field_index(TEXT)
        out = table.set_column(i, table.schema.field(i), pa.array(texts, pa.string()))
        out = out.append_column(pa.field(PII, PII_TYPE), pa.array(spans, PII_TYPE))
        if failed:  # the document's rows leave the batch: no raw sentence goes on
            kept = pc.invert(pc.is_in(out[DOC_ID], pa.array(list(failed), pa.string())))
            raise DocumentsRejected(failed, out.filter(kept))
        return out


def _failure(doc: str, e: Exception) -> str:
    return (
        f"redacting a sentence of document {doc!r} failed with {type(e).__name__}; its "
        "message is withheld, as it may quote the text. The document is left out of the "
        "output; report it with the exception type"
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
