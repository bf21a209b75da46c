"""A label as users write it, of the default head or of an extra one (``NAME.label``).

Where a label is asked for (``[audit] risk_label`` / ``risk_labels``, ``docintel search
--label``), ``Bearish`` is a label of the default head (the ``label`` / ``score``
columns) and ``topic.layoffs`` the label ``layoffs`` of the extra head ``topic``
(``[classify.heads]``: the ``topic_label`` / ``topic_score`` columns). Head and label
names are matched case-insensitively and resolved to the names the head writes; a label
no head has is refused (UsageError, exit 2) naming the labels there are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from docintel.pipeline.errors import UsageError
from docintel.pipeline.schema import LABEL, SCORE, head_columns


@dataclass(frozen=True)
class LabelRef:
    """One label of one head: ``head`` "" is the default head."""

    head: str
    label: str

    @property
    def label_column(self) -> str:
        return head_columns(self.head)[0] if self.head else LABEL

    @property
    def score_column(self) -> str:
        return head_columns(self.head)[1] if self.head else SCORE

    def __str__(self) -> str:
        return f"{self.head}.{self.label}" if self.head else self.label


def run_heads(manifest: Mapping[str, Any]) -> dict[str, list[str]]:
    """Every head of a committed run by name ("" = the default), with its labels."""
    heads = {"": list(manifest.get("labels") or [])}
    heads.update({h["name"]: list(h["labels"]) for h in manifest.get("heads") or []})
    return heads


def _match(name: str, names: Sequence[str]) -> str | None:
    """``name`` among ``names``: exactly, else case-insensitively (None: not there)."""
    if name in names:
        return name
    folded = [n for n in names if n.casefold() == name.casefold()]
    return folded[0] if folded else None


def resolve_label(text: str, heads: Mapping[str, Sequence[str]], setting: str) -> LabelRef:
    """``text`` (``label`` or ``NAME.label``) as the label of a head of ``heads`` (name ->
    labels, "" = the default head). A default label may hold a dot: ``NAME.`` is a head
    only when a head has that name."""
    name, dot, rest = text.partition(".")
    head = _match(name, [h for h in heads if h]) if dot else None
    head_name, label = (head, rest) if head is not None else ("", text)
    found = _match(label.strip(), heads.get(head_name, []))
    if found is None:
        raise UsageError(f"{setting} {text!r} is not a label of the run's heads: {_known(heads)}")
    return LabelRef(head_name, found)


def _known(heads: Mapping[str, Sequence[str]]) -> str:
    parts = [", ".join(heads.get("", [])) + " (the default head)"]
    parts += [", ".join(f"{h}.{lb}" for lb in labels) for h, labels in heads.items() if h]
    return "; ".join(parts)


def resolve_labels(
    texts: Sequence[str], heads: Mapping[str, Sequence[str]], setting: str
) -> list[LabelRef]:
    """Each of ``texts`` resolved (:func:`resolve_label`), each once, in order."""
    return list(dict.fromkeys(resolve_label(t, heads, setting) for t in texts))


def label_columns(refs: Sequence[LabelRef]) -> list[str]:
    """The sentence columns ``refs`` read, each once, default head's first."""
    cols = [LABEL, SCORE]
    for ref in refs:
        cols += [c for c in (ref.label_column, ref.score_column) if c not in cols]
    return cols


def risk_of(
    batch: pa.RecordBatch | pa.Table, refs: Sequence[LabelRef]
) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``batch``: whether one of ``refs`` is its label (its head's), and
    the summed probability of the ``refs`` it has (0 where none; a null label: none)."""
    n = batch.num_rows
    risky = np.zeros(n, dtype=bool)
    mass = np.zeros(n, dtype=np.float64)
    for ref in refs:
        hit = pc.fill_null(pc.equal(batch[ref.label_column], ref.label), False)
        hit_np = np.asarray(hit.to_numpy(zero_copy_only=False), dtype=bool)
        score = pc.fill_null(batch[ref.score_column].cast(pa.float64()), 0.0)
        mass += np.where(hit_np, score.to_numpy(zero_copy_only=False), 0.0)
        risky |= hit_np
    return risky, mass
