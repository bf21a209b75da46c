"""Test-only fault injection (config ``[faults]``): a stage that raises for chosen documents.

It wraps the real stage, so tests exercise the real isolation, error-row and retry paths
end to end, with real models, on a real cluster.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from docintel.pipeline.schema import DOC_ID
from docintel.pipeline.stages.base import Stage


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
