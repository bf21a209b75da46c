"""Column names and Arrow schemas of the flowing batches and of the output tables.

The output contract lives in docs/design.md; this module is its single source in code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

import pyarrow as pa

# Flowing document batch (after read)
DOC_ID = "doc_id"
TEXT = "text"

# Sentence rows (after sentencize / embed / classify)
SENT_INDEX = "sent_index"
START_CHAR = "start_char"
END_CHAR = "end_char"
EMBEDDING = "embedding"
N_TOKENS = "n_tokens"
TRUNCATED = "truncated"
LABEL = "label"
SCORE = "score"
PROBS = "probs"  # internal: the full probability vector, aggregated per document
PAGE = "page"  # 1-based page of a sentence's start (paged formats: PDF), else null
# The language stage: each sentence's language (ISO 639-1); documents: the majority one.
# A sentence in a language its head was not trained on has a null label and score.
LANGUAGE = "language"
N_UNLABELLED = "n_unlabelled"  # documents: sentences with a null label (other languages)
UNLABELLED = "(unlabelled)"  # how the report, the audit and search name a null label

# Document input (a folder of PDF, HTML, DOCX, e-mail, text): the read task's rows carry
# the file's bytes; the parse stage turns them into text and these document columns,
# which travel beside the rows (Batch.documents) to the documents table.
CONTENT = "content"  # a file's bytes (read task -> parse)
SOURCE_FORMAT = "source_format"  # pdf, html, docx, eml, txt, md; "parquet" for Parquet input
N_PAGES = "n_pages"  # PDF only
TITLE = "title"
PAGE_STARTS = "page_starts"  # each page's first character in the document's text
PARQUET_SOURCE = "parquet"
FOUND = "found"
DOCUMENT_META_SCHEMA = pa.schema(
    [
        pa.field(DOC_ID, pa.string(), nullable=False),
        pa.field(SOURCE_FORMAT, pa.string()),
        pa.field(N_PAGES, pa.int32()),
        pa.field(TITLE, pa.string()),
        pa.field(PAGE_STARTS, pa.list_(pa.int64())),
        # internal: found inside an input file (an e-mail attachment), not one of the
        # input's files; the run's document count checks files + found
        pa.field(FOUND, pa.bool_()),
    ]
)
DOCUMENT_COLUMNS = tuple(DOCUMENT_META_SCHEMA.names[1:-1])  # what a parse stage's rows add

# Backend labels, written on every sentence row (``<stage>_backend``) and counted in the
# manifest: how a stage computed its result. Not the pool a replica belongs to ("gpu" or
# "cpu", docintel.pipeline.run.layout): a GPU-pool replica without CUDA writes gpu-sim.
BACKEND_GPU_FP16 = "gpu-fp16"
BACKEND_GPU_BF16 = "gpu-bf16"  # cards with bfloat16 (Ampere and newer)
BACKEND_GPU_FP32 = "gpu-fp32"  # GPU stages without a half-precision path (spaCy, the head)
BACKEND_GPU_SIM = "gpu-sim"  # a GPU replica without CUDA (logical GPUs, CI): fp32 on the CPU
# Benchmarks only ([faults] gpu_model_s_per_sentence): a GPU replica that computes nothing,
# sleeps a modelled service time and writes placeholder results (bench/scaleout.py).
BACKEND_GPU_MODEL = "gpu-model"
BACKEND_CPU_MODEL = "cpu-model"  # the same for a CPU replica ([faults] cpu_model_s_per_sentence)
BACKEND_CPU_FP32 = "cpu-fp32"  # the framework itself (PyTorch, Keras, spaCy) on the CPU
# The same fp32 weights as an ONNX graph on ONNX Runtime (the default CPU embed and classify
# path; built from the PyTorch / Keras model, which stays the source of truth).
BACKEND_CPU_FP32_ONNX = "cpu-fp32-onnx"
BACKEND_CPU_INT8 = "cpu-int8"

# Backend keys: how a stage runs, in one vocabulary for the config ([embed|classify]
# cpu_runtime), the stage registry's backends and the encoder runtimes (RUNTIMES). A
# framework key runs wherever its replica is placed; an ONNX key runs on the CPU.
TORCH = "torch"  # the encoder folder on PyTorch
KERAS = "keras"  # the classifier head on Keras (TensorFlow)
SPACY = "spacy"  # the sentencizer's spaCy pipeline
PARSERS = "parsers"  # the parse stage's document parsers (pypdfium2, trafilatura, ...)
USER = "user"  # a user-defined stage's own code
ONNX_FP32 = "onnx-fp32"  # the same fp32 weights as an ONNX graph on ONNX Runtime
ONNX_INT8 = "onnx-int8"  # the int8 copy on ONNX Runtime
_ONNX_LABELS = {ONNX_FP32: BACKEND_CPU_FP32_ONNX, ONNX_INT8: BACKEND_CPU_INT8}


def backend_label(key: str, gpu: bool = False, cuda: bool = False, dtype: str = "fp32") -> str:
    """The row label (``<stage>_backend``) of a result computed by backend ``key``: an ONNX
    key's own label; a framework's by where it computed: on the CPU (``cpu-fp32``), in a
    GPU replica without CUDA (``gpu-sim``), or on a card in ``dtype`` (``gpu-fp16``,
    ``gpu-bf16``, ``gpu-fp32``)."""
    if key in _ONNX_LABELS:
        return _ONNX_LABELS[key]
    if not gpu:
        return BACKEND_CPU_FP32
    return f"gpu-{dtype}" if cuda else BACKEND_GPU_SIM


# Watch-list screening (the optional ``entities`` stage, pipeline/entities/stage.py): each
# sentence's matches, and each document's distinct entity ids. Only in runs with the stage.
ENTITIES = "entities"  # sentences: list<struct> below, [] when a sentence names none
ENTITY_IDS = "entity_ids"  # documents: sorted distinct ids of its sentences' matches
ENTITY_MATCH = pa.struct(
    [
        pa.field("entity_id", pa.string(), nullable=False),
        pa.field("name", pa.string(), nullable=False),  # the entity's listed name
        pa.field("list", pa.string(), nullable=False),  # the list's name: its file's stem
        pa.field("type", pa.string(), nullable=False),
        pa.field("match", pa.string(), nullable=False),  # text[start:end]
        pa.field("start", pa.int32(), nullable=False),  # offsets into the sentence's text
        pa.field("end", pa.int32(), nullable=False),
        pa.field("similarity", pa.float32(), nullable=False),  # 1.0: exact
    ]
)
ENTITIES_TYPE = pa.list_(pa.field("item", ENTITY_MATCH, nullable=False))
ENTITY_IDS_FIELD = pa.field(ENTITY_IDS, pa.list_(pa.string()))


ERRORS_SCHEMA = pa.schema(
    [
        pa.field(DOC_ID, pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("error_type", pa.string(), nullable=False),
        pa.field("message", pa.string(), nullable=False),
        pa.field("batch_id", pa.string(), nullable=False),
    ]
)


def error_table(rows: Iterable[dict[str, str]]) -> pa.Table:
    """Error rows (doc_id, stage, error_type, message, batch_id) as a table."""
    return pa.Table.from_pylist(list(rows), schema=ERRORS_SCHEMA)


def empty_errors() -> pa.Table:
    return ERRORS_SCHEMA.empty_table()


def label_count_column(label: str) -> str:
    """Documents-table column counting sentences with ``label``: ``n_<label, snake_case>``."""
    slug = re.sub(r"[^0-9a-zA-Z]+", "_", label).strip("_").lower() or "label"
    return f"n_{slug}"


# Extra classifier heads ([classify.heads] NAME = "DIR"): each adds NAME_label (string)
# and NAME_score (float32) to sentences and documents; the default head's columns stay as
# they are. Its probabilities travel, internally, in a column ``probs:NAME`` whose field
# metadata names its labels (the documents table's aggregation reads them; no table
# writes the column).
HEAD_PROBS_PREFIX = f"{PROBS}:"
HEAD_LABELS_META = b"docintel.head_labels"


def head_columns(name: str) -> tuple[str, str]:
    """The label and score columns of the extra head ``name``."""
    return f"{name}_label", f"{name}_score"


def head_probs_field(name: str, labels: Sequence[str]) -> pa.Field:
    """The internal probabilities column of the extra head ``name`` (its labels in the
    field's metadata)."""
    meta = {HEAD_LABELS_META: json.dumps(list(labels)).encode()}
    return pa.field(
        f"{HEAD_PROBS_PREFIX}{name}", pa.list_(pa.float32(), len(labels)), metadata=meta
    )


def head_probs(schema: pa.Schema) -> dict[str, list[str]]:
    """The extra heads whose probabilities a batch's table carries: name -> labels, in
    column order."""
    return {
        f.name.removeprefix(HEAD_PROBS_PREFIX): json.loads(f.metadata[HEAD_LABELS_META])
        for f in schema
        if f.name.startswith(HEAD_PROBS_PREFIX) and f.metadata and HEAD_LABELS_META in f.metadata
    }


def head_fields(heads: Sequence[str]) -> list[pa.Field]:
    """The columns the extra heads ``heads`` add to sentences and documents, in order."""
    fields = []
    for name in heads:
        label, score = head_columns(name)
        fields += [pa.field(label, pa.string()), pa.field(score, pa.float32())]
    return fields


def documents_schema(
    labels: list[str], entities: bool = False, heads: Sequence[str] = ()
) -> pa.Schema:
    """The documents table; ``entities``: the run has the entities stage (``entity_ids``);
    ``heads``: the extra classifier heads' names (``NAME_label``, ``NAME_score``)."""
    fields = [
        pa.field(DOC_ID, pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field(SOURCE_FORMAT, pa.string()),  # nullable: runs written before it had none
        pa.field(N_PAGES, pa.int32()),
        pa.field(TITLE, pa.string()),
        pa.field(LANGUAGE, pa.string()),  # null: no sentences, or a run written before it
        pa.field("n_sentences", pa.int32(), nullable=False),
        pa.field("n_truncated", pa.int32(), nullable=False),
        pa.field(N_UNLABELLED, pa.int32()),  # nullable: runs written before it had none
    ]
    fields += [pa.field(label_count_column(lb), pa.int32(), nullable=False) for lb in labels]
    fields += [
        pa.field("top_label", pa.string()),
        pa.field("top_score", pa.float32()),
        pa.field("batch_id", pa.string(), nullable=False),
    ]
    if entities:
        fields.append(ENTITY_IDS_FIELD)
    return pa.schema(fields + head_fields(heads))  # last: a table of runs without them evolves


def sentences_schema(
    embedding_dim: int | None,
    stages: Sequence[str],
    extra: Sequence[pa.Field] = (),
) -> pa.Schema:
    """The sentences table: the contract's columns, then ``extra`` (columns that
    user-defined stages add, as they typed them), then ``<stage>_backend`` and
    ``<stage>_model`` for each stage of the chain, in chain order."""
    fields = [
        pa.field(DOC_ID, pa.string(), nullable=False),
        pa.field(SENT_INDEX, pa.int32(), nullable=False),
        pa.field(START_CHAR, pa.int64(), nullable=False),
        pa.field(END_CHAR, pa.int64(), nullable=False),
        pa.field(PAGE, pa.int32()),
        pa.field(TEXT, pa.string(), nullable=False),
        pa.field(LANGUAGE, pa.string()),
        pa.field(LABEL, pa.string()),  # null: a language the head was not trained on
        pa.field(SCORE, pa.float32()),
        pa.field(N_TOKENS, pa.int32(), nullable=False),
        pa.field(TRUNCATED, pa.bool_(), nullable=False),
    ]
    if embedding_dim is not None:
        fields.append(pa.field(EMBEDDING, pa.list_(pa.float32(), embedding_dim)))
    fields += list(extra)
    fields += [pa.field(backend_column(s), pa.string(), nullable=False) for s in stages]
    fields += [pa.field(model_column(s), pa.string(), nullable=False) for s in stages]
    return pa.schema(fields)


# Columns of the sentences table that are not a stage's output (the contract's own, the
# per-stage backend/model columns): what is left of a finished batch's table is the
# columns user-defined stages added.
CONTRACT_SENTENCE_COLUMNS = frozenset(sentences_schema(1, ()).names) | {PROBS}


def backend_column(stage: str) -> str:
    """The sentences column naming how ``stage`` computed a row (``<stage>_backend``)."""
    return f"{stage}_backend"


def model_column(stage: str) -> str:
    """The sentences column naming the model version ``stage`` ran (``<stage>_model``)."""
    return f"{stage}_model"
