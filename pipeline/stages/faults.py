"""Test and benchmark stand-ins (config ``[faults]``), both wrapping the real stage.

* :class:`PoisonedStage` raises for chosen documents, so tests exercise the real
  isolation, error-row and retry paths end to end, with real models, on a real cluster.
* :class:`ModelledStage` (benchmarks only, ``gpu_model_s_per_sentence``) stands in for a
  GPU replica of a model stage: it loads no model, sleeps a modelled service time per
  call and returns placeholder results with the real stage's columns and types, so a
  simulated cluster of many stand-in GPU nodes measures the driver and the dispatcher,
  not this machine's cores (bench/scaleout.py).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from docintel.pipeline.config import ClassifyConfig, EmbedConfig
from docintel.pipeline.schema import (
    BACKEND_GPU_MODEL,
    DOC_ID,
    EMBEDDING,
    LABEL,
    N_TOKENS,
    PROBS,
    SCORE,
    TRUNCATED,
)
from docintel.pipeline.stages.base import Stage
from docintel.pipeline.stages.classify import read_classifier_meta
from docintel.pipeline.stages.embed import embedding_dim

# The stages whose GPU replicas ModelledStage can stand in for (the sentencizer is
# rule-based and cheap: it keeps running for real).
MODELLED_STAGES = ("embed", "classify")
MODELLED_VERSION = "modelled"  # the model version a modelled replica reports and writes


class InjectedFault(RuntimeError):
    """Raised on purpose by a poisoned stage."""


class PoisonedStage(Stage):
    def __init__(self, inner: Stage, doc_ids: tuple[str, ...]) -> None:
        self.inner = inner
        self.doc_ids = pa.array(sorted(doc_ids), pa.string())
        self.name = inner.name  # type: ignore[misc]  # the wrapper stands in for the stage
        self.input_columns = inner.input_columns  # type: ignore[misc]
        self.output_columns = inner.output_columns  # type: ignore[misc]
        self.keeps_input = inner.keeps_input  # type: ignore[misc]

    def setup(self) -> None:
        self.inner.setup()
        self.backend = self.inner.backend
        self.version = self.inner.version

    def __call__(self, table: pa.Table) -> pa.Table:
        hit = pc.filter(table[DOC_ID], pc.is_in(table[DOC_ID], value_set=self.doc_ids))
        if len(hit):
            raise InjectedFault(f"injected fault in {self.name} for document {hit[0].as_py()!r}")
        return self.inner(table)

    def teardown(self) -> None:
        self.inner.teardown()


class ModelledStage(Stage):
    """A GPU replica of ``embed`` or ``classify`` that computes nothing (benchmarks only).

    ``setup()`` reads only the model's shape (the encoder's hidden size from its
    config.json, the classifier's labels.json); torch and TensorFlow are never imported.
    A call sleeps ``rows x seconds_per_sentence`` (each row is one sentence) and appends
    the real stage's output columns with the same Arrow types: embed a fixed unit vector
    (float32, the encoder's dimension), ``n_tokens`` 0 and ``truncated`` false; classify
    the first label with uniform probabilities. Rows say ``gpu-model`` and ``modelled``.
    """

    def __init__(
        self,
        inner: Stage,
        seconds_per_sentence: float,
        embed: EmbedConfig,
        classify: ClassifyConfig,
    ) -> None:
        if inner.name not in MODELLED_STAGES:
            raise ValueError(f"no modelled replica for stage {inner.name!r}")
        # the wrapped stage lends its name and columns only: its setup() never runs
        self.name = inner.name  # type: ignore[misc]  # the wrapper stands in for the stage
        self.input_columns = inner.input_columns  # type: ignore[misc]
        self.output_columns = inner.output_columns  # type: ignore[misc]
        self.keeps_input = inner.keeps_input  # type: ignore[misc]
        self.seconds_per_sentence = seconds_per_sentence
        self.embed_cfg = embed
        self.classify_cfg = classify
        self.dim = 0
        self.labels: list[str] = []

    def setup(self) -> None:
        if self.name == "embed":
            self.dim = embedding_dim(self.embed_cfg.resolved_model_path())
        else:
            self.labels, _ = read_classifier_meta(self.classify_cfg.resolved_model_dir())
        self.backend = BACKEND_GPU_MODEL
        self.version = MODELLED_VERSION

    def __call__(self, table: pa.Table) -> pa.Table:
        n = table.num_rows
        time.sleep(n * self.seconds_per_sentence)
        if self.name == "embed":
            unit = np.full(self.dim, 1.0 / math.sqrt(self.dim), np.float32)
            columns = {
                EMBEDDING: _fixed_size_rows(unit, n),
                N_TOKENS: pa.array(np.zeros(n, np.int32)),
                TRUNCATED: pa.array(np.zeros(n, bool)),
            }
        else:
            k = len(self.labels)
            columns = {
                LABEL: pa.array([self.labels[0]] * n, pa.string()),
                SCORE: pa.array(np.full(n, 1.0 / k, np.float32)),
                PROBS: _fixed_size_rows(np.full(k, 1.0 / k, np.float32), n),
            }
        for name, column in columns.items():
            table = table.append_column(name, column)
        return table


def _fixed_size_rows(row: np.ndarray, n: int) -> pa.FixedSizeListArray:
    """``n`` copies of ``row`` as a fixed-size list<float32> column."""
    flat = pa.array(np.tile(row, n), pa.float32())
    return pa.FixedSizeListArray.from_arrays(flat, len(row))
