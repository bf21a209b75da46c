"""One typed config tree, loaded from one commented TOML file; CLI options override keys.

See ``docintel.example.toml`` at the repository root for every key with its comment.
Every default is a named constant below, with the reason for its value.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from docintel.pipeline import registry
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.settings import DEFAULT_MODEL_NAME, Settings

# The built-in stages' sections, declared with each stage (its registry entry names its
# settings model); imported from here too.
from docintel.pipeline.stages.classify import ClassifyConfig
from docintel.pipeline.stages.embed_settings import EmbedConfig
from docintel.pipeline.stages.sentencize import SentencizeConfig

__all__ = ["DEFAULT_MODEL_NAME", "ClassifyConfig", "Config", "EmbedConfig", "SentencizeConfig"]

# --- input ---------------------------------------------------------------------------
DEFAULT_ID_COLUMN = "doc_id"  # the column name `docintel ingest` writes
DEFAULT_TEXT_COLUMN = "text"  # ditto
# Ids are copied into every sentence row: a 10 KB id on a document of 10,000 sentences is
# 100 MB of id column. 1 KiB holds any path, URL or UUID a corpus uses as an id.
DEFAULT_MAX_ID_BYTES = 1024
# A run id names a folder (OUTPUT/_runs/<id>/) and files: letters, digits, ".", "_", "-",
# starting with a letter or digit (no "/", no "..": it cannot leave OUTPUT); "" = a new id.
RUN_ID_PATTERN = r"^([A-Za-z0-9][A-Za-z0-9._-]{0,127})?$"

# --- run -----------------------------------------------------------------------------
# Documents per batch: large enough that per-call Ray overhead (~1 ms) and Parquet part
# files stay small relative to work, small enough that one batch of long documents fits
# comfortably in a 2-core/24 GiB node's object store and a progress bar moves.
DEFAULT_BATCH_SIZE = 128
# With GPU replicas ("auto" batch size on a run that can use GPUs): a batch holds about
# this much text, so that one GPU call carries enough work to keep a card busy. A card
# runs MiniLM at ~50,000 short sentences/s; ~60 bytes a sentence, 1 MiB is ~17,000
# sentences, ~0.35 s of work per stage call (the target is >= 0.25 s), and the driver's
# fixed cost per batch (~3 ms: five Ray calls) is then ~0.2 us per short document. Bounded
# by MAX_BATCH_DOCS documents (pipeline/input/source.py); a batch's sentences by
# max_batch_sentences below (~17,000 sentences and 26 MB of embeddings for news-like text).
DEFAULT_GPU_BATCH_BYTES = 1 << 20
# The hard bound on a batch's sentences (the memory bound): after the stage that makes
# sentence rows, a batch with more is split into pieces of at most this many sentences, at
# document boundaries (pipeline/run/pieces.py); each piece goes on, and is committed, alone.
# 65,536 sentences are 96 MiB of 384-d float32 embeddings plus their text; without it, 128
# documents of 20,000 sentences each would be ~3.9 GB of embeddings in one batch.
DEFAULT_MAX_BATCH_SENTENCES = 65_536
DEFAULT_PART_TARGET_MB = 64  # output files data lakes like: tens of MB, not thousands of KB
# Batches admitted into the pipeline at once (read..write). 0 = auto: two per stage
# replica slot, enough to keep every replica busy while bounding memory.
DEFAULT_MAX_BATCHES_IN_FLIGHT = 0

# --- resources -----------------------------------------------------------------------
# CPUs are logical Ray resources. Actors never take every CPU: read and write tasks need a
# share or the run hangs (ray#44687). Each stage declares its pool's CPUs and its share of
# a GPU in its registry entry (pipeline/registry.py: PoolDefaults).
IO_TASK_CPUS = 0.25  # Parquet read/decode and write tasks
# A user-defined stage: CPU replicas of a quarter CPU (a light stage), and, when its
# [resources.<name>] table asks for GPU replicas with no fraction of its own, a quarter card.
USER_STAGE_CPUS = 0.25
USER_STAGE_GPU = 0.25
# A GPU replica mostly waits on its device; a quarter CPU covers its Python and transfers.
GPU_REPLICA_CPUS = 0.25
AUTO = "auto"  # replica counts sized to the cluster when the run starts
# Auto-sized CPU pools: one sentencize and one classify replica per this many embed
# replicas (the encoder does almost all the arithmetic).
EMBED_REPLICAS_PER_LIGHT_REPLICA = 4
# Spill policy: auto = GPU replicas first, CPU replicas when every GPU slot is busy.
DEFAULT_SPILL = "auto"
# In-flight calls per replica: 2 lets the next batch's arguments arrive while the
# current one computes, without queueing work an idle replica elsewhere could take.
DEFAULT_MAX_IN_FLIGHT = 2

# --- one writer per output --------------------------------------------------------------
# A run's claim on its OUTPUT (and an audit's on its _audit/ state) lasts this long unless
# renewed; the holder renews it every third of that. A crashed holder on another machine
# blocks a new writer for at most this long (one on this machine: not at all).
DEFAULT_LEASE_TTL_S = 60.0
# How long a second writer waits for a held lease before giving up with exit code 2; 0 =
# refuse at once (a resubmitted job must not silently queue behind a live one).
DEFAULT_LEASE_WAIT_S = 0.0
# How long a stage may have no live replica (a node left, a new one not yet placed)
# before the run fails: long enough for an autoscaler to add a node (minutes).
DEFAULT_REPLICA_WAIT_S = 600.0

# --- errors and storage ----------------------------------------------------------------
# More than half the documents failing means something systemic (wrong column, broken
# model, unreadable data), not a few bad documents: the run fails instead of committing.
DEFAULT_MAX_ERROR_FRACTION = 0.5
# Errors are judged only after this many documents, so one early poison document in a
# small first batch does not fail the run.
ERROR_FRACTION_MIN_DOCS = 50
# Attempts per S3 request on transient errors (500, 503, throttling, dropped connections),
# with the AWS SDK's exponential backoff; permanent errors (403, no such bucket) fail fast.
DEFAULT_S3_ATTEMPTS = 6

# --- jobs and audits --------------------------------------------------------------------
# The label whose highest-scoring sentences the audit report lists first ("risk").
DEFAULT_RISK_LABEL = "Bearish"
DEFAULT_REPORT_TOP_N = 25  # sentences in the report's highest-risk table
DEFAULT_TREND_RUNS = 14  # previous audits in the report's trend chart (two weeks nightly)


# Tables keyed by stage name, where a user-defined stage adds its own: [resources.<name>]
# and [stages.<name>] (a dotted override may create them).
OPEN_TABLES = ("resources", "stages")


_Strict = Settings  # every section: frozen, unknown keys refused


class InputConfig(_Strict):
    id_column: str = DEFAULT_ID_COLUMN
    text_column: str = DEFAULT_TEXT_COLUMN
    max_id_bytes: int = Field(DEFAULT_MAX_ID_BYTES, ge=1)  # longer ids: exit 2 before work
    # What INPUT holds: "auto" = decided by the files' names when a run plans (Parquet
    # files, or document files read by the parse stage: .pdf .html .htm .docx .eml .txt
    # .md); the plan records the answer here, so the chain has the parse stage or not.
    kind: Literal["auto", "parquet", "documents"] = "auto"


class RunConfig(_Strict):
    @field_validator("batch_size")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError('a batch size is a whole number >= 1, or "auto"')
        return v

    def fixed_batch_size(self) -> int:
        """The batch size where it cannot depend on the input ("auto": the CPU default)."""
        return self.batch_size if isinstance(self.batch_size, int) else DEFAULT_BATCH_SIZE

    # Documents per batch (the commit unit: written once, exactly once). "auto": sized by
    # text bytes (gpu_batch_bytes) on a run that can use GPUs, else DEFAULT_BATCH_SIZE.
    batch_size: int | Literal["auto"] = AUTO
    gpu_batch_bytes: int = Field(DEFAULT_GPU_BATCH_BYTES, ge=1024)
    # at most this many sentences per batch: more are split into pieces, never refused
    max_batch_sentences: int = Field(DEFAULT_MAX_BATCH_SENTENCES, ge=1)
    max_batches_in_flight: int = Field(DEFAULT_MAX_BATCHES_IN_FLIGHT, ge=0)
    # A batch spilled to a stage's CPU replicas runs as slices sized for them (about one
    # GPU call's time each), joined before the next step (pipeline/run/slices.py); false =
    # the whole batch as one CPU call. Scheduling only: the output is the same.
    spill_slicing: bool = True
    # One pattern for every format: a run id names files and folders (OUTPUT/_runs/<id>/)
    run_id: str = ""
    # A warehouse format (Iceberg, Delta): a run with no run id whose input and plan match
    # a completed run of the warehouse is a no-op naming that run; true (--append) appends
    # the same input again as a new run.
    append: bool = False
    embeddings: bool = True
    # Parts of consecutive small batches are merged at the end of a run into files of
    # about this many MiB (all three tables' parts of a batch count); 0 = one file per
    # batch and table. See pipeline/formats/parquet.py (ParquetPartsSink) for the protocol
    # and its trade-off.
    part_target_mb: float = Field(DEFAULT_PART_TARGET_MB, ge=0)
    # "" = start an embedded local Ray in this process; "auto" or "ray://…" = connect.
    ray_address: str = ""
    # CPUs declared to the embedded local Ray; 0 = all cores.
    num_cpus: int = Field(0, ge=0)
    # GPUs declared to the embedded local Ray: "auto" = the GPUs Ray detects (NVML,
    # CUDA_VISIBLE_DEVICES); N = N logical GPUs (for tests without CUDA; on a CUDA machine
    # at most the number of cards).
    num_gpus: int | Literal["auto"] = "auto"
    # Ray object store for the embedded local Ray, in MiB (0 = Ray's default).
    object_store_mb: int = Field(0, ge=0)
    show_progress: bool = True
    # Show Ray's notices and the actors' framework log lines on the console (else they go
    # to Ray's log files; docintel's own progress, summary and errors always show).
    verbose: bool = False
    # auto: GPU first, spill to CPU replicas when GPU replicas are saturated; gpu-only /
    # cpu-only: only that pool is started; off: no spill (a stage with GPU replicas uses
    # only them, a stage without uses its CPU replicas).
    spill: Literal["auto", "gpu-only", "cpu-only", "off"] = DEFAULT_SPILL
    # Fraction of documents that may end as error rows before the run fails (exit 1).
    max_error_fraction: float = Field(DEFAULT_MAX_ERROR_FRACTION, ge=0, le=1)
    # One writer per output (pipeline/run/lease.py): claim lifetime, and how long to wait.
    lease_ttl_s: float = Field(DEFAULT_LEASE_TTL_S, ge=3)
    lease_wait_s: float = Field(DEFAULT_LEASE_WAIT_S, ge=0)
    # A stage left without any live replica (their nodes left, none can be placed) fails
    # the run after this long; pending replicas wait this long for an autoscaler's node.
    replica_wait_s: float = Field(DEFAULT_REPLICA_WAIT_S, gt=0)

    @field_validator("run_id")
    @classmethod
    def _plain_run_id(cls, v: str) -> str:
        if not re.fullmatch(RUN_ID_PATTERN, v):
            raise ValueError(
                f"run id {v[:140]!r} is refused: a run id names a folder under OUTPUT, so it "
                "is 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        return v


class PoolConfig(_Strict):
    """One stage's replicas: a CPU pool and a GPU pool, each replica with its resources.

    Replicas are "auto" by default, sized to the cluster when the run starts
    (pipeline/run/layout.py): one GPU replica per stage per GPU; CPU replicas from the CPUs
    left over. ``min_*`` must be placeable (else exit 2 before any work); ``max_*`` caps
    the auto size (0 = no cap). An integer fixes the count.
    """

    replicas: int | Literal["auto"] = AUTO  # CPU replicas
    min_replicas: int = Field(0, ge=0)
    max_replicas: int = Field(0, ge=0)
    cpus: float = Field(..., gt=0)  # CPUs held by each CPU replica
    max_in_flight: int = Field(DEFAULT_MAX_IN_FLIGHT, ge=1)  # calls queued per replica
    gpu_replicas: int | Literal["auto"] = AUTO
    min_gpu_replicas: int = Field(0, ge=0)
    max_gpu_replicas: int = Field(0, ge=0)
    gpu_fraction: float = Field(..., gt=0, le=1)  # of one GPU, per GPU replica
    gpu_cpus: float = Field(GPU_REPLICA_CPUS, ge=0)  # CPUs held by each GPU replica

    @field_validator("replicas", "gpu_replicas")
    @classmethod
    def _count(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError('a replica count is a whole number >= 0, or "auto"')
        return v


class StagePool(PoolConfig):
    """The pool of a user-defined stage (``[resources.<name>]``). Without the table: CPU
    replicas sized like the light built-in stages. A table that gives ``gpu_fraction``
    (and no ``gpu_replicas``) asks for GPU replicas too, sized as the built-in ones."""

    cpus: float = Field(USER_STAGE_CPUS, gt=0)
    gpu_fraction: float = Field(USER_STAGE_GPU, gt=0, le=1)
    gpu_replicas: int | Literal["auto"] = 0

    @model_validator(mode="before")
    @classmethod
    def _gpu_when_asked(cls, data: Any) -> Any:
        if isinstance(data, dict) and "gpu_fraction" in data and "gpu_replicas" not in data:
            return {**data, "gpu_replicas": AUTO}
        return data


def _stage_pool(spec: registry.StageSpec, shares: float) -> type[PoolConfig]:
    """The pool model of a built-in stage (``[resources.<name>]``), with the defaults its
    declaration gives: its CPUs, and its share of a card over ``shares`` (the sum of the
    GPU stages' shares). A stage with no share gets GPU replicas only when asked, as a
    user stage's."""
    d = spec.pool
    name = f"{spec.name.title().replace('_', '')}Pool"
    if not d.gpu_share:
        return create_model(name, __base__=StagePool, cpus=(float, Field(d.cpus, gt=0)))
    return create_model(
        name,
        __base__=PoolConfig,
        cpus=(float, Field(d.cpus, gt=0)),
        gpu_fraction=(float, Field(d.gpu_share / shares, gt=0, le=1)),
    )


class _Resources(BaseModel):
    """Per stage, its pools (``[resources.<stage>]``); ``io_cpus`` for read/write tasks.

    The built-in stages' tables are typed fields (their models from the declarations:
    :func:`_stage_pool`); any other ``[resources.<name>]`` table is the pool of a
    user-defined stage (:class:`StagePool`), checked against the pipeline's stages before
    any work (pipeline/registry.py)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    __pydantic_extra__: dict[str, StagePool] = Field(init=False)

    def pool(self, stage: str) -> PoolConfig:
        """The pool settings of ``stage``: its table, or a user stage's defaults."""
        if stage in type(self).model_fields and stage != "io_cpus":
            value = getattr(self, stage)
            assert isinstance(value, PoolConfig)
            return value
        return (self.__pydantic_extra__ or {}).get(stage) or StagePool()

    def extra_pools(self) -> list[str]:
        """Names of the ``[resources.<name>]`` tables that are not built-in stages."""
        return list(self.__pydantic_extra__ or {})


def _resources_model() -> type[_Resources]:
    """``[resources]``: a table per built-in stage (in chain order), then ``io_cpus``."""
    shares = sum(s.pool.gpu_share for s in registry.BUILTIN) or 1.0
    pools = {s.name: _stage_pool(s, shares) for s in registry.BUILTIN}
    globals().update({m.__name__: m for m in pools.values()})  # importable: pickled by name
    return create_model(
        "ResourcesConfig",
        __base__=_Resources,
        **{name: (model, model()) for name, model in pools.items()},
        io_cpus=(float, Field(IO_TASK_CPUS, gt=0)),
    )


ResourcesConfig = _resources_model()


class PipelineConfig(_Strict):
    """The chain of stages. Empty: the built-in chain (sentencize, embed, classify).
    Otherwise every stage in order: a built-in stage's name, a user stage as a
    ``module:Class`` path, or the name of an entry point in the group ``docintel.stages``.
    The built-in stages must all be there, in their order; user stages go anywhere the
    columns they need exist (checked before any work)."""

    stages: tuple[str, ...] = ()


class StorageConfig(_Strict):
    """S3 access. Credentials come from the standard AWS chain (environment, profile,
    instance role), never from this file, and are never logged or written."""

    # "" = AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL if set (as for every AWS SDK), else AWS
    # S3; an S3-compatible store: "http://127.0.0.1:9000" (the scheme sets TLS)
    s3_endpoint: str = ""
    s3_region: str = ""  # "" = the AWS chain's region (AWS_REGION, profile) or us-east-1
    s3_attempts: int = Field(DEFAULT_S3_ATTEMPTS, ge=1)
    # The one-writer lease on S3 needs a store that honours If-None-Match / If-Match PUTs.
    # "require" (default: a store that silently ignores them would let two writers share
    # an output): probe once per bucket, refuse a store that ignores them (exit 2).
    # "trust": no probe; on a store that ignores them the lease is advisory only, and
    # keeping one process per output is up to you.
    s3_conditional_writes: Literal["require", "trust"] = "require"

    @field_validator("s3_endpoint")
    @classmethod
    def _no_credentials(cls, v: str) -> str:
        return no_userinfo(v, "endpoint", "scheme, host and port", "the AWS chain")


def no_userinfo(v: str, what: str, give: str, chain: str) -> str:
    """Refuse credentials (userinfo) in a URL from the config (an S3 endpoint, a catalog
    URI). Any "@" is refused, with a scheme or without: "key:secret@host:9000" is userinfo
    too. The message never repeats the value: it holds a secret."""
    if "@" in v:
        raise ValueError(
            f"credentials (user:password@) in the {what} URL are refused; give only "
            f"{give}, and credentials through {chain}"
        )
    return v


# Iceberg output ([output] format = "iceberg"): the namespace of the three tables, and
# catalog properties that are credentials (refused: they would be written to the manifest;
# pyiceberg reads them from PYICEBERG_CATALOG__DOCINTEL__<KEY> or ~/.pyiceberg.yaml).
DEFAULT_NAMESPACE = "docintel"
SECRET_PROPERTY_WORDS = (
    "credential",
    "token",
    "secret",
    "password",
    "access-key",
    "key-id",
    "authorization",  # header.Authorization (REST catalogs)
    "account-key",  # adls.account-key
    "connection-string",  # adls.connection-string
    "private-key",
    "api-key",
    "apikey",
)
# pyiceberg imports the Python object a property ending in "impl" names (py-io-impl,
# py-catalog-impl, write.py-location-provider.impl, ...): never from data or a config.
_CODE_PROPERTY = re.compile(r"(^|[.\-_])impl$", re.IGNORECASE)


def code_properties(props: Mapping[str, str]) -> list[str]:
    """The keys of ``props`` that name a Python object for pyiceberg to import."""
    return sorted(k for k in props if _CODE_PROPERTY.search(k))


class OutputConfig(_Strict):
    """The table format of OUTPUT (one module each in pipeline/formats/). "parquet": one run
    per folder (Parquet parts and _manifest.json); "iceberg": OUTPUT is a warehouse of
    Iceberg tables that every run appends to (no catalog configured: an embedded SQL
    catalog in OUTPUT/_catalog.db, local outputs only); "delta": Delta Lake tables at
    OUTPUT/documents, sentences and errors that every run appends to (local outputs)."""

    format: Literal["parquet", "iceberg", "delta"] = "parquet"
    namespace: str = Field(DEFAULT_NAMESPACE, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    catalog_uri: str = ""  # "" = the embedded SQL catalog; else e.g. a REST catalog's URL
    catalog_type: str = ""  # "" = "rest" with a catalog_uri; any pyiceberg catalog type
    # more pyiceberg catalog properties (warehouse, s3.region, ...); never credentials
    catalog_properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("catalog_uri")
    @classmethod
    def _no_credentials(cls, v: str) -> str:
        return no_userinfo(
            v, "catalog", "scheme, host, port and path", "PYICEBERG_CATALOG__DOCINTEL__* variables"
        )

    @field_validator("catalog_uri")
    @classmethod
    def _no_query(cls, v: str) -> str:
        if "?" in v or "#" in v:  # tokens ride there (?token=...): never in a config
            raise ValueError(
                "a query string or fragment (?... or #...) in the catalog URI is refused: "
                "it may hold a token, and would be written to the manifest and to messages. "
                "Give scheme, host, port and path only, and credentials through the "
                "PYICEBERG_CATALOG__DOCINTEL__* variables"
            )
        return v

    @field_validator("catalog_properties")
    @classmethod
    def _no_secrets(cls, v: dict[str, str]) -> dict[str, str]:
        code = code_properties(v)
        if code:
            raise ValueError(
                f"catalog property {code[0]!r} names Python code for pyiceberg to import; "
                "docintel refuses such properties (it chooses its own FileIO)"
            )
        for key in v:
            if any(word in key.lower().replace("_", "-") for word in SECRET_PROPERTY_WORDS):
                env = key.upper().replace(".", "__").replace("-", "_")
                raise ValueError(
                    f"catalog property {key!r} is a credential; set it as the variable "
                    f"PYICEBERG_CATALOG__DOCINTEL__{env} (or in ~/.pyiceberg.yaml), never in "
                    "the config"
                )
        return v


class FaultsConfig(_Strict):
    """Test-only fault injection, so tests exercise real failure paths end to end. Empty
    by default; never set it in production configs."""

    # A stage raises for these document ids (their sentences, after sentencize). Stage
    # names are checked against the pipeline's stages before any work.
    poison_stage: str = ""
    poison_doc_ids: tuple[str, ...] = ()
    # Seconds every call to a GPU replica sleeps first, to saturate GPU pools on purpose.
    gpu_delay_s: float = Field(0.0, ge=0)
    # Benchmarks only (bench/scaleout.py): GPU-pool replicas of the model stages do not
    # compute; each call takes this modelled service time (seconds per sentence, sleeping)
    # and writes placeholder results labelled ``gpu-model``, so a simulated cluster of
    # many stand-in GPU nodes measures the dispatcher, not this machine's cores. 0 = off.
    gpu_model_s_per_sentence: float = Field(0.0, ge=0)
    # With the above: model the GPU replicas of rule-based stages too (the sentencizer:
    # each document one sentence), so their CPU cost on this machine leaves a benchmark.
    gpu_model_rule_based: bool = False
    # Benchmarks only (bench/spill_slices.py): the same for the CPU-pool replicas of the
    # model stages (rows say ``cpu-model``), so a pool of many CPU replicas is modelled
    # without taking this machine's cores. 0 = off.
    cpu_model_s_per_sentence: float = Field(0.0, ge=0)
    # Seconds the replicas of this stage sleep before loading their model (a slow model
    # load, to test that the run starts without waiting for every replica).
    load_delay_stage: str = ""
    load_delay_s: float = Field(0.0, ge=0)
    # Iceberg output: the N-th table commit of a run raises after it succeeded (a lost
    # answer from the catalog), once; 0 = off.
    sink_commit_lost: int = Field(0, ge=0)
    # Iceberg output: from the N-th table commit attempt of a run on, the catalog cannot
    # be reached (every append raises before anything lands); 0 = off.
    sink_catalog_down: int = Field(0, ge=0)


class JobConfig(_Strict):
    """Input and output of a Ray batch job (`python -m docintel.jobs.batch`, `docintel submit`).
    Paths are read on the cluster: use s3:// URIs or paths every node sees."""

    input: str = ""
    output: str = ""
    # `docintel submit --working-dir` ships at most this many MB (10^6 bytes) of files;
    # more is refused (exit 2) before anything is copied or uploaded.
    max_working_dir_mb: float = Field(100.0, gt=0)


class AuditConfig(_Strict):
    """The nightly audit (`docintel audit`, `python -m docintel.jobs.nightly_audit`)."""

    source: str = ""  # Parquet file, folder, glob or s3:// prefix, re-read each night
    output: str = ""  # audit root: state, run_date=YYYY-MM-DD/ partitions, reports
    risk_label: str = DEFAULT_RISK_LABEL
    # The labels the review ranks documents by, of any head: "Bearish" (the default
    # head's) or "topic.layoffs" (the extra head topic's, [classify.heads]); matched
    # case-insensitively. [] = [risk_label].
    risk_labels: list[str] = Field(default_factory=list, max_length=50)
    top_n: int = Field(DEFAULT_REPORT_TOP_N, ge=1)
    trend_runs: int = Field(DEFAULT_TREND_RUNS, ge=1)
    # Saved queries (`docintel search` over each night's new and changed documents): the
    # report's "Watch list" shows each one's watch_top most similar sentences of the night.
    watch: list[str] = Field(default_factory=list, max_length=100)
    watch_top: int = Field(5, ge=1, le=100)

    def risk(self) -> list[str]:
        """The risk labels as written: ``risk_labels``, else ``[risk_label]``."""
        return list(self.risk_labels) or [self.risk_label]


class _ConfigBase(_Strict):
    """The config tree's checks and overrides; its sections: :data:`Config`."""

    # The folder of the TOML file this config was read from (load_config), kept through
    # overrides; None for defaults. A `module:Class` stage is also looked for there.
    _folder: Path | None = PrivateAttr(default=None)

    @property
    def folder(self) -> Path | None:
        """The folder of the config file, None when no file was read."""
        return self._folder

    def __eq__(self, other: object) -> bool:
        """The same settings (where they were read from, ``folder``, is not one)."""
        if not isinstance(other, _ConfigBase):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = _Strict.__hash__

    @field_validator("input", check_fields=False)
    @classmethod
    def _distinct_columns(cls, v: InputConfig) -> InputConfig:
        if v.id_column == v.text_column:
            raise ValueError(f"id_column and text_column are both {v.id_column!r}")
        return v

    @model_validator(mode="after")
    def _watch_needs_embeddings(self) -> Config:
        if self.audit.watch and not self.run.embeddings:
            raise ValueError(
                "[audit] watch searches the night's embeddings, but [run] embeddings is "
                "false: turn embeddings on, or empty the watch list"
            )
        if any(not q.strip() for q in self.audit.watch):
            raise ValueError("[audit] watch holds an empty query")
        return self

    @model_validator(mode="after")
    def _document_fits_a_piece(self) -> Config:
        # a batch is split at document boundaries (pipeline/run/pieces.py): one document's
        # sentences must fit the bound, or the bound would not hold
        if self.sentencize.max_sentences > self.run.max_batch_sentences:
            raise ValueError(
                f"[sentencize] max_sentences ({self.sentencize.max_sentences:,}) is over "
                f"[run] max_batch_sentences ({self.run.max_batch_sentences:,}): a batch is "
                "split at document boundaries, so one document's sentences must fit in it; "
                "lower max_sentences or raise max_batch_sentences"
            )
        return self

    def with_overrides(self, overrides: dict[str, Any]) -> Config:
        """Return a copy with dotted keys (``"run.batch_size"``) replaced; None = keep."""
        data = self.model_dump()
        for dotted, value in overrides.items():
            if value is None:
                continue
            node = data
            *parents, leaf = dotted.split(".")
            for depth, key in enumerate(parents):
                if depth == 1 and parents[0] in OPEN_TABLES and isinstance(node, dict):
                    node.setdefault(key, {})  # a user stage's table, checked by its model
                if not isinstance(node, dict) or key not in node:
                    raise ConfigError(f"unknown config key {dotted!r}")
                node = node[key]
            open_table = len(parents) == 2 and parents[0] in OPEN_TABLES
            if not isinstance(node, dict) or (leaf not in node and not open_table):
                raise ConfigError(f"unknown config key {dotted!r}")
            node[leaf] = value  # in an open table, an unknown key fails its validation
        cfg = _validate(data, source="command-line options")
        cfg._folder = self._folder
        return cfg


def _config_model() -> type[_ConfigBase]:
    """The config tree: the run's sections, then each built-in stage's own section (the
    settings model its registry declaration names, in chain order), then the others."""
    sections = {s.name: (s.section, s.section()) for s in registry.BUILTIN if s.section}
    plain = (StorageConfig, OutputConfig, JobConfig, AuditConfig, FaultsConfig)
    return create_model(
        "Config",
        __base__=_ConfigBase,
        input=(InputConfig, InputConfig()),
        run=(RunConfig, RunConfig()),
        pipeline=(PipelineConfig, PipelineConfig()),
        **sections,
        resources=(ResourcesConfig, ResourcesConfig()),
        **{m.__name__.removesuffix("Config").lower(): (m, m()) for m in plain},
        # Settings of user-defined stages: ``[stages.<name>]`` tables, passed to the
        # stage's constructor as keyword arguments (checked against the pipeline's stages).
        stages=(dict[str, dict[str, Any]], Field(default_factory=dict)),
    )


Config = _config_model()


def _validate(data: dict[str, Any], source: str) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            _unknown_key(err["loc"]) if err["type"] == "extra_forbidden" else _problem(err)
            for err in e.errors()
        )
        raise ConfigError(f"invalid configuration in {source}: {problems}") from e


def _problem(err: Any) -> str:
    """One pydantic error as a line: the key, then the message (a check over several keys
    has no single key: its message names them)."""
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {msg}" if loc else msg


def _unknown_key(loc: tuple[int | str, ...]) -> str:
    """An unknown key, named with its section, and the nearest valid key of that section
    (difflib) or, when none is near, the section's keys."""
    import difflib

    model: type[BaseModel] | None = Config
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if model is not None else None
        ann = field.annotation if field is not None else None
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    key, section = str(loc[-1]), ".".join(str(p) for p in loc[:-1])
    text = f"unknown key {key!r} in " + (f"[{section}]" if section else "the top level")
    if model is None:
        return text
    valid = list(model.model_fields)
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if near:
        return f"{text}; did you mean {near[0]!r}?"
    return f"{text}; valid keys: {', '.join(valid)}"


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Load the TOML file at ``path`` (or the defaults), then apply dotted overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ConfigError(f"config file {path} does not exist") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from e
    cfg = _validate(data, source=str(path) if path else "defaults")
    cfg._folder = Path(path).resolve().parent if path is not None else None
    return cfg.with_overrides(overrides or {})
