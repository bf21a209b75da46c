"""The stage protocol, the driver-side chain check, and per-document failure isolation."""

from __future__ import annotations

import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from docintel.pipeline.batch import Batch
from docintel.pipeline.errors import ChainError, DocumentsRejected
from docintel.pipeline.schema import DOC_ID, DOCUMENT_META_SCHEMA, FOUND, error_table

MAX_MESSAGE_CHARS = 2_000  # error messages are for people; a traceback-sized cap is plenty


@dataclass(frozen=True)
class Placement:
    """Where a stage runs: a CPU replica, or a GPU replica holding ``gpu_fraction``."""

    device: str = "cpu"  # "cpu" or "gpu"
    gpu_fraction: float = 0.0

    @property
    def wants_gpu(self) -> bool:
        return self.device == "gpu"


CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max ..."


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """Cores this process may really use: its CPU affinity, capped by a cgroup v2 CPU quota.

    ``os.cpu_count()`` counts the host's cores; in a container with a CPU limit (a
    Kubernetes pod with 4 CPUs on a 64-core node) sizing thread pools by it would start
    16x too many threads.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cores = cores or os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    try:
        limit = math.ceil(int(quota) / int(period))
    except (ValueError, ZeroDivisionError):
        return cores
    return max(1, min(cores, limit))


def cuda_available() -> bool:
    """Whether this process sees a CUDA device (imports torch: call inside ``setup()``)."""
    import torch

    return bool(torch.cuda.is_available())


class Stage(ABC):
    """A model stage.

    ``__init__`` stores config only (cheap, picklable); ``setup()`` loads the model once per
    actor from local files; ``__call__`` maps a table to a table; ``teardown()`` frees it.
    After ``setup()``, ``backend`` names how it runs (``cpu-fp32``…) and ``version`` names
    the model it runs.
    """

    name: ClassVar[str]
    input_columns: ClassVar[tuple[str, ...]]
    output_columns: ClassVar[tuple[str, ...]]
    # Columns of the input that the output carries along unchanged.
    keeps_input: ClassVar[bool] = True
    # Document-level columns of this stage's rows (schema.DOCUMENT_COLUMNS, the parse
    # stage): run_stage moves them out of the rows into Batch.documents, and documents
    # this stage finds inside others (e-mail attachments) join the batch's doc_ids.
    document_columns: ClassVar[tuple[str, ...]] = ()

    backend: str = "unset"
    version: str = "unset"

    @abstractmethod
    def setup(self) -> None: ...

    @abstractmethod
    def __call__(self, table: pa.Table) -> pa.Table: ...

    def teardown(self) -> None:  # noqa: B027 - optional hook, most stages free nothing
        """Free model memory; the default has nothing to free."""


def check_chain(source_columns: Sequence[str], stages: Sequence[Stage | type[Stage]]) -> list[str]:
    """Check, before any cluster work, that every stage's inputs exist; return final columns.

    Reads only the declarations (``name``, ``input_columns``, ``output_columns``,
    ``keeps_input``): stage classes will do, so nothing is constructed or loaded."""
    columns = list(source_columns)
    for stage in stages:
        missing = [c for c in stage.input_columns if c not in columns]
        if missing:
            raise ChainError(
                f"stage {stage.name!r} needs column(s) {missing}, but the stages before it "
                f"only produce {columns}; reorder the stages or add the missing one"
            )
        kept = columns if stage.keeps_input else []
        columns = kept + [c for c in stage.output_columns if c not in kept]
    return columns


def _describe(exc: BaseException) -> str:
    msg = str(exc) or repr(exc)
    return msg if len(msg) <= MAX_MESSAGE_CHARS else msg[: MAX_MESSAGE_CHARS - 1] + "…"


def _isolate(stage: Stage, table: pa.Table, batch_id: str) -> tuple[list[pa.Table], list[dict]]:
    """Run ``stage`` on ``table``; when it raises, bisect by document down to one document.

    A document that still fails alone becomes an error row; every other document of the
    batch gets its results. Costs ~2·log2(n) extra calls per poison document.
    """
    try:
        return [stage(table)], []
    except DocumentsRejected as r:  # refused by a limit, the others' output is ready
        rows = [
            {DOC_ID: doc, "stage": stage.name, "error_type": kind, "message": _describe(msg),
             "batch_id": batch_id}
            for doc, (kind, msg) in r.reasons.items()
        ]  # fmt: skip
        return [r.output], rows
    except Exception as exc:  # per-document failures must become error rows, not a crash
        ids = pc.unique(table[DOC_ID])
        if len(ids) <= 1:
            doc = ids[0].as_py() if len(ids) else "<empty>"
            row = {
                DOC_ID: doc,
                "stage": stage.name,
                "error_type": type(exc).__name__,
                "message": _describe(exc),
                "batch_id": batch_id,
            }
            return [], [row]
        half = len(ids) // 2
        outs: list[pa.Table] = []
        errs: list[dict] = []
        for part in (ids[:half], ids[half:]):
            sub = table.filter(pc.is_in(table[DOC_ID], value_set=part))
            o, e = _isolate(stage, sub, batch_id)
            outs += o
            errs += e
        return outs, errs


def run_stage(stage: Stage, batch: Batch) -> Batch:
    """Apply ``stage`` to ``batch.table`` with failure isolation; record time and backend."""
    t0 = time.perf_counter()
    outs, errs = _isolate(stage, batch.table, batch.batch_id)
    if not outs:  # every document failed: an empty table with the stage's output schema
        outs = [stage(batch.table.slice(0, 0))]
    table = pa.concat_tables(outs) if len(outs) > 1 else outs[0]
    errors = batch.errors
    if errs:
        errors = pa.concat_tables([errors, error_table(errs)])
    doc_ids, documents = batch.doc_ids, batch.documents
    if stage.document_columns:
        table, doc_ids, documents = _documents_out(stage, table, errs, batch)
    return Batch(
        batch_id=batch.batch_id,
        doc_ids=doc_ids,
        table=table,
        errors=errors,
        seconds={**batch.seconds, stage.name: time.perf_counter() - t0},
        backends={**batch.backends, stage.name: stage.backend},
        versions={**batch.versions, stage.name: stage.version},
        documents=documents,
    )


def _documents_out(
    stage: Stage, table: pa.Table, errs: list[dict], batch: Batch
) -> tuple[pa.Table, pa.Array, pa.Table | None]:
    """A document-making stage's rows without their document columns; the batch's
    doc_ids with the documents it found inside others (rows or error rows) appended in
    order; its documents table with the stage's values replacing the read task's."""
    known = set(batch.doc_ids.to_pylist())
    found = [*table[DOC_ID].to_pylist(), *(e[DOC_ID] for e in errs)]
    new = list(dict.fromkeys(d for d in found if d not in known))
    meta = table.select([DOC_ID, *stage.document_columns])
    failed = [d for d in new if d not in set(meta[DOC_ID].to_pylist())]
    meta = pa.concat_tables([meta, pa.table({DOC_ID: pa.array(failed, pa.string())})],
                            promote_options="permissive")  # fmt: skip
    flags = pc.is_in(meta[DOC_ID], value_set=pa.array(new, pa.string()))
    meta = meta.append_column(FOUND, flags).cast(DOCUMENT_META_SCHEMA)
    table = table.drop_columns(list(stage.document_columns))
    doc_ids = batch.doc_ids
    if new:
        if isinstance(doc_ids, pa.ChunkedArray):
            doc_ids = doc_ids.combine_chunks()
        doc_ids = pa.concat_arrays([doc_ids, pa.array(new, pa.string())])
    old = batch.documents
    if old is not None:
        kept = old.filter(pc.invert(pc.is_in(old[DOC_ID], value_set=meta[DOC_ID])))
        meta = pa.concat_tables([kept, meta])
    return table, doc_ids, meta
