"""Test and benchmark stand-ins (config ``[faults]``), applied by one wrap of a stage.

:func:`wrap` is the only place a ``[faults]`` setting reaches a run: the layout wraps the
stage object a pool's replicas hold, and nothing else (actors, executor, sink) knows
about faults. With ``[faults]`` empty (production) the stage is returned unwrapped.

* :class:`FaultyStage` raises for chosen documents (``poison_doc_ids``), so tests exercise
  the real isolation, error-row and retry paths end to end, with real models, on a real
  cluster; sleeps before each call of a GPU replica (``gpu_delay_s``, to saturate GPU
  pools on purpose) and before loading the model (``load_delay_s``, a slow model load).
* :class:`ModelledStage` (benchmarks only, ``gpu_model_s_per_sentence``) stands in for a
  GPU replica of a model stage: it loads no model, sleeps a modelled service time per
  call and returns placeholder results with the real stage's columns and types (the
  stage's registry entry says which), so a simulated cluster of many stand-in GPU nodes
  measures the driver and the dispatcher, not this machine's cores (bench/scaleout.py).

One setting is not a stage's: ``sink_commit_lost`` (a table commit that raises after it
landed, a lost answer from the catalog) is applied by the Iceberg sink itself
(pipeline/sink_iceberg.py), where the commit happens.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from docintel.pipeline.config import Config, FaultsConfig
from docintel.pipeline.schema import BACKEND_CPU_MODEL, BACKEND_GPU_MODEL, DOC_ID
from docintel.pipeline.stages.base import Stage

MODELLED_VERSION = "modelled"  # the model version a modelled replica reports and writes
# Builds, in the replica, the columns a modelled call appends to its input table.
Placeholder = Callable[[Config], Callable[[pa.Table], dict[str, pa.Array]]]


class InjectedFault(RuntimeError):
    """Raised on purpose by a poisoned stage."""


class _Standin(Stage):
    """A wrapper that stands in for ``inner``: its name and columns."""

    def __init__(self, inner: Stage) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]  # the wrapper stands in for the stage
        self.input_columns = inner.input_columns  # type: ignore[misc]
        self.output_columns = inner.output_columns  # type: ignore[misc]
        self.keeps_input = inner.keeps_input  # type: ignore[misc]

    def teardown(self) -> None:
        self.inner.teardown()


class FaultyStage(_Standin):
    """The real stage, with injected faults: poisoned documents and delays."""

    def __init__(
        self,
        inner: Stage,
        doc_ids: tuple[str, ...] = (),
        call_delay_s: float = 0.0,
        load_delay_s: float = 0.0,
    ) -> None:
        super().__init__(inner)
        self.doc_ids = pa.array(sorted(doc_ids), pa.string())
        self.call_delay_s = call_delay_s
        self.load_delay_s = load_delay_s

    def setup(self) -> None:
        time.sleep(self.load_delay_s)
        self.inner.setup()
        self.backend = self.inner.backend
        self.version = self.inner.version

    def __call__(self, table: pa.Table) -> pa.Table:
        if self.call_delay_s:
            time.sleep(self.call_delay_s)
        if len(self.doc_ids):
            hit = pc.filter(table[DOC_ID], pc.is_in(table[DOC_ID], value_set=self.doc_ids))
            if len(hit):
                raise InjectedFault(
                    f"injected fault in {self.name} for document {hit[0].as_py()!r}"
                )
        return self.inner(table)


class ModelledStage(_Standin):
    """A GPU replica of a model stage that computes nothing (benchmarks only).

    ``setup()`` builds the placeholder columns from the model's shape only (the encoder's
    hidden size from its config.json, the classifier's labels.json); torch and TensorFlow
    are never imported. A call sleeps ``rows x seconds_per_sentence`` (each row is one
    sentence; for the sentencizer, one document) and appends the real stage's output
    columns with the same Arrow types (the sentencizer's: each document one sentence).
    Rows say ``gpu-model`` (``cpu-model``: a modelled CPU replica) and ``modelled``.
    """

    def __init__(
        self,
        inner: Stage,
        seconds_per_sentence: float,
        placeholder: Placeholder,
        cfg: Config,
        backend: str = BACKEND_GPU_MODEL,
    ) -> None:
        super().__init__(inner)  # lends its name and columns only: its setup() never runs
        self.seconds_per_sentence = seconds_per_sentence
        self.modelled_backend = backend
        self.placeholder = placeholder
        self.cfg = cfg
        self.columns: Callable[[pa.Table], dict[str, pa.Array]] | None = None

    def setup(self) -> None:
        self.columns = self.placeholder(self.cfg)
        self.backend = self.modelled_backend
        self.version = MODELLED_VERSION

    def __call__(self, table: pa.Table) -> pa.Table:
        assert self.columns is not None, "setup() first"
        time.sleep(table.num_rows * self.seconds_per_sentence)
        for name, column in self.columns(table).items():
            table = table.append_column(name, column)
        return table if self.keeps_input else table.select(list(self.output_columns))

    def teardown(self) -> None:
        self.columns = None


def wrap(stage: Stage, cfg: Config, pool_kind: str, placeholder: Placeholder | None) -> Stage:
    """``stage`` with the ``[faults]`` that apply to its pool; unchanged when none do."""
    faults: FaultsConfig = cfg.faults
    gpu = pool_kind == "gpu"
    modelled = faults.gpu_model_s_per_sentence if gpu else faults.cpu_model_s_per_sentence
    if modelled > 0 and placeholder is not None:
        backend = BACKEND_GPU_MODEL if gpu else BACKEND_CPU_MODEL
        stage = ModelledStage(stage, modelled, placeholder, cfg, backend)
    poison = faults.poison_doc_ids if faults.poison_stage == stage.name else ()
    call_delay = faults.gpu_delay_s if gpu else 0.0
    load_delay = faults.load_delay_s if faults.load_delay_stage == stage.name else 0.0
    if poison or call_delay or load_delay:
        stage = FaultyStage(stage, poison, call_delay, load_delay)
    return stage
