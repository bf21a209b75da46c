"""The words a stage is declared in: :class:`StageSpec` and what it holds.

Below the stages and the registry: a stage's module declares its own ``StageSpec`` with
these (its class, settings model, pool defaults, backends with their derived artefacts,
model check), and docintel.pipeline.registry lists it (one line) without an import cycle.
Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from docintel.pipeline.settings import Settings
from docintel.pipeline.stages.base import Placement, Stage

if TYPE_CHECKING:  # the config is assembled from the declarations
    from docintel.pipeline.config import Config

# A light stage's CPUs per CPU replica (the rule-based ones; a user stage's default too).
LIGHT_STAGE_CPUS = 0.25


class Pool(Protocol):
    """What a backend builder reads of a pool (docintel.pipeline.run.layout.Pool): the
    registry sits below the layout, which sizes pools from it."""

    @property
    def stage(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def replicas(self) -> int: ...
    @property
    def gpu_fraction(self) -> float: ...
    @property
    def precision(self) -> str: ...


def placement(pool: Pool) -> Placement:
    """Where one replica of ``pool`` runs (what a backend builder passes its stage)."""
    return Placement(pool.kind, pool.gpu_fraction)


@dataclass(frozen=True)
class Artefact:
    """A model built from another one (a fused ONNX graph, an int8 copy) that a backend
    loads: cached by the source model's version, built once on the driver if missing."""

    what: str
    path: Path
    build: Callable[[], object]  # imports the frameworks it needs
    int8: bool = False
    stage: str = ""  # the stage whose replicas load it (set when a layout is read)
    # built by a model exporter (transformers, tf2onnx) whose progress bars and warnings
    # the build quiets; False (compiled watch lists): no exporter, nothing to import
    exported: bool = True


@dataclass(frozen=True)
class Backend:
    """One way to run a stage: the stage object a pool's replicas hold, and the derived
    artefacts it loads."""

    build: Callable[[Config, Pool], Stage]
    artefacts: Callable[[Config], list[Artefact]] = lambda _cfg: []


@dataclass(frozen=True)
class StageFacts:
    """What the driver learns when it checks a stage's model before any work."""

    version: str | None = None  # the model's version, where the driver can know it
    labels: list[str] | None = None  # the classifier's label names (documents columns)
    embedding_dim: int | None = None  # the size of the embeddings it writes, if any
    # the classifier's extra heads ([classify.heads]): name, dir, version, labels each
    heads: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class PoolDefaults:
    """A stage's pool defaults (``[resources.<name>]`` overrides each): CPUs per CPU
    replica, its share of one GPU, and how its auto-sized CPU pool grows."""

    cpus: float
    # Its share of one card among the chain's GPU stages: each GPU replica's default
    # gpu_fraction is this over the sum of theirs (0 = no GPU replicas unless its
    # [resources.<name>] table gives a gpu_fraction, as a user stage's).
    gpu_share: float = 0.0
    # CPU growth: one replica per round (the encoder), else one every
    # EMBED_REPLICAS_PER_LIGHT_REPLICA rounds.
    heavy: bool = False


@dataclass(frozen=True)
class StageSpec:
    """One stage, declared once (see docintel.pipeline.registry)."""

    name: str
    cls: type[Stage]
    backends: Mapping[str, Backend]
    choose: Callable[[Config, Pool], str]
    pool: PoolDefaults = PoolDefaults(LIGHT_STAGE_CPUS)
    # A built-in stage's config section ``[<name>]``: its settings model
    section: type[Settings] | None = None
    int8: bool = False  # its CPU replicas can run an int8 copy (a spill pool)
    check: Callable[[Config], StageFacts] = lambda _cfg: StageFacts()
    placeholder: Callable[[Config], Callable[[pa.Table], dict[str, pa.Array]]] | None = None
    # Runs model weights (a rule-based stage does not: its modelled replicas stand in only
    # with [faults] gpu_model_rule_based, to take its CPU cost out of a benchmark).
    has_weights: bool = True
    builtin: bool = True
    settings: Mapping[str, Any] = field(default_factory=dict)  # [stages.<name>]
    # An optional built-in stage (parse, redact, entities) joins a run's chain only when
    # ``wanted(cfg)`` says so; ``wanted_by`` names the setting that asks for it, for the
    # error when ``[pipeline] stages`` names it without. None: every run has it.
    wanted: Callable[[Config], bool] | None = None
    wanted_by: str = ""

    def wanted_in(self, cfg: Config) -> bool:
        """Whether a run under ``cfg`` has this stage in its chain (user stages: listed)."""
        return self.wanted is None or self.wanted(cfg)

    @property
    def input_columns(self) -> tuple[str, ...]:
        return tuple(self.cls.input_columns)

    @property
    def output_columns(self) -> tuple[str, ...]:
        return tuple(self.cls.output_columns)
