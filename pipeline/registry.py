"""Every stage of the pipeline, declared once: the one place that knows the built-in stages.

A :class:`StageSpec` says everything the rest of docintel needs to know about a stage:

* its class (a :class:`~docintel.pipeline.stages.Stage`: name, input and output columns;
  the chain check reads them before any model loads);
* a built-in stage's config section ``[<name>]`` (``section``: its settings model, declared
  next to its code);
* its pool defaults (``pool``: CPUs per replica, its share of a GPU among the chain's GPU
  stages, and how its auto-sized CPU pool grows: ``heavy``, one replica per round, the
  encoder; light stages one every ``EMBED_REPLICAS_PER_LIGHT_REPLICA`` rounds) and whether
  its CPU replicas can run an int8 copy when they are a spill pool;
* its **backends**: named builders of the stage object a pool's replicas hold, each with
  the derived artefacts it loads (fused fp32 ONNX graphs, int8 copies) and how to build
  them; ``choose`` picks the backend for a pool;
* ``check``: the driver-side check of its model (before any work) and what the run learns
  from it (the model version, the classifier's labels);
* ``placeholder``: the columns a modelled GPU replica writes (benchmarks only).

The config tree (pipeline/config.py) is assembled from :data:`BUILTIN`: each built-in
stage's section and its ``[resources.<name>]`` pool with the declared defaults (GPU
shares normalised over the built-in GPU stages: 0.25 + 0.5 + 0.25 of a card). User-defined
stages' settings are ``[stages.<name>]`` (keyword arguments of the class). A run resolves
its chain once (:func:`chain`, in the plan) and everything downstream (layout, actors,
executor, sink, metrics) reads that :class:`Chain`: no other module spells a stage's name.

User-defined stages join the chain through ``[pipeline] stages``: a ``module:Class`` path
or the name of an entry point in the group ``docintel.stages``. Their class subclasses
``docintel.pipeline.stages.Stage`` and is constructed with the ``[stages.<name>]`` table
as keyword arguments; they run as their own pool, CPU replicas unless
``[resources.<name>]`` asks for GPU ones.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from docintel.pipeline.artefacts.paths import (
    FP32_MODEL_FILE,
    INT8_MODEL_FILE,
    classifier_fp32_path,
    classifier_int8_path,
)
from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.entities.stage import ENTITIES_SPEC as ENTITIES
from docintel.pipeline.errors import ConfigError, ModelError
from docintel.pipeline.privacy.stage import PRIVACY, check_place
from docintel.pipeline.schema import (
    CONTENT,
    DOC_ID,
    EMBEDDING,
    END_CHAR,
    KERAS,
    LABEL,
    N_TOKENS,
    ONNX_FP32,
    ONNX_INT8,
    PROBS,
    SCORE,
    SENT_INDEX,
    SPACY,
    START_CHAR,
    TEXT,
    TORCH,
    TRUNCATED,
    USER,
    backend_label,
    head_columns,
    head_probs_field,
)
from docintel.pipeline.stages.base import Stage, cuda_available
from docintel.pipeline.stages.classify import (
    Classifier,
    ClassifyConfig,
    Int8Classifier,
    OnnxClassifier,
    check_head_encoder,
    check_head_names,
    head_languages,
    label_columns,
    read_classifier_meta,
    unlabelled_mask,
)
from docintel.pipeline.stages.embed import Embedder, check_encoder_dir, embedding_dim
from docintel.pipeline.stages.embed_int8 import Int8Embedder, OnnxEmbedder
from docintel.pipeline.stages.embed_settings import EmbedConfig
from docintel.pipeline.stages.language import LANGUAGE_SPEC as LANGUAGE
from docintel.pipeline.stages.parse import PARSE
from docintel.pipeline.stages.sentencize import SentencizeConfig, Sentencizer, check_spacy_model
from docintel.pipeline.stages.spec import (  # re-exported: the declaration's words
    Artefact,
    Backend,
    Pool,
    PoolDefaults,
    StageFacts,
    StageSpec,
    placement,
)

if TYPE_CHECKING:  # the config is assembled from the declarations below
    from docintel.pipeline.config import Config


ENTRY_POINT_GROUP = "docintel.stages"
# A small MLP gains nothing from intra-op parallelism; one thread (TF, or ORT for the ONNX
# copies) leaves cores to the encoder running beside it.
CLASSIFY_THREADS = 1
# Stage names become column names (<name>_backend) and actor names: keep them plain.
STAGE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
# Columns the sink needs at the end of the chain (the output contract's sentences table).
SINK_COLUMNS = (DOC_ID, SENT_INDEX, START_CHAR, END_CHAR, TEXT, EMBEDDING, N_TOKENS, TRUNCATED)
SINK_COLUMNS += (LABEL, SCORE, PROBS)


# CPUs are logical Ray resources. Actors never take every CPU: read and write tasks need
# a share or the run hangs (ray#44687). On 2 CPUs: 0.25 + 1.0 + 0.25 = 1.5 for actors,
# 0.5 left for two concurrent I/O tasks.
SENTENCIZE_CPUS = 0.25  # rule-based spaCy is ~100x cheaper than the encoder
EMBED_CPUS = 1.0  # the encoder does almost all the arithmetic
CLASSIFY_CPUS = 0.25  # one small MLP call per batch
# Shares of one card: the built-in GPU stages share it in these proportions (normalised
# over them: 0.25 + 0.5 + 0.25 = 1); the encoder gets half, it holds the most activations.
SENTENCIZE_GPU = 0.25
EMBED_GPU = 0.5
CLASSIFY_GPU = 0.25


# --- the built-in stages -----------------------------------------------------------------


def _choose_model_backend(
    framework: str, runtime: Callable[[Config], str]
) -> Callable[[Config, Pool], str]:
    """GPU pools run the ``framework`` itself; CPU pools int8 or fp32, fp32 on the backend
    ``runtime`` names (``[embed|classify] cpu_runtime``, a backend key: ONNX by default)."""

    def choose(cfg: Config, pool: Pool) -> str:
        if pool.kind == "gpu":
            return framework
        if pool.precision == "int8":
            return ONNX_INT8
        return runtime(cfg)

    return choose


def _quantize(kind: str, cfg: Config, head: Path | None = None) -> object:
    """Build one derived artefact; ``head``: the classifier folder of a head's (default:
    the default head)."""
    from docintel.pipeline.offline import quantize

    folder = cfg.embed.resolved_int8_dir()
    head = head or cfg.classify.resolved_model_dir()
    builders = {
        "fp32": lambda: quantize.build_fp32(cfg.embed.resolved_model_path(), folder),
        "int8": lambda: quantize.build_int8(cfg.embed.resolved_model_path(), folder),
        "fp32-head": lambda: quantize.build_fp32_classifier(head, folder),
        "int8-head": lambda: quantize.build_int8_classifier(head, folder),
    }
    return builders[kind]()


def _encoder_artefact(what: str, file: str, kind: str) -> Callable[[Config], list[Artefact]]:
    def artefacts(cfg: Config) -> list[Artefact]:
        path = cfg.embed.resolved_int8_dir() / file
        return [Artefact(what, path, partial(_quantize, kind, cfg), int8=kind == "int8")]

    return artefacts


def _head_artefact(what: str, int8: bool) -> Callable[[Config], list[Artefact]]:
    """The default head's ONNX copy and each extra head's ([classify.heads]), each keyed
    by its head's version (two folders of one head share one copy)."""

    def artefacts(cfg: Config) -> list[Artefact]:
        where = classifier_int8_path if int8 else classifier_fp32_path
        kind = "int8-head" if int8 else "fp32-head"
        folders = {"": cfg.classify.resolved_model_dir(), **cfg.classify.head_dirs()}
        return [
            Artefact(
                f"{what} of head {name}" if name else what,
                where(cfg.embed.resolved_int8_dir(), folder),
                partial(_quantize, kind, cfg, folder),
                int8=int8,
            )
            for name, folder in folders.items()
        ]

    return artefacts


def _check_sentencize(cfg: Config) -> StageFacts:
    check_spacy_model(cfg.sentencize.spacy_model)
    return StageFacts(version=cfg.sentencize.spacy_model)


def _check_embed(cfg: Config) -> StageFacts:
    path = cfg.embed.resolved_model_path()
    check_encoder_dir(path)
    return StageFacts(version=fingerprint(path), embedding_dim=embedding_dim(path))


def _check_classify(cfg: Config) -> StageFacts:
    """The head's labels and the extra heads' records (name, folder, version, labels);
    refused when any head was trained on another encoder or dimension, an extra head's
    folder is missing or incomplete, or its columns clash with another stage's."""
    embed_path = cfg.embed.resolved_model_path()
    dim = embedding_dim(embed_path)
    clf_dir = cfg.classify.resolved_model_dir()
    labels = _check_head(clf_dir, embed_path, dim, "[classify] model_dir")
    others = frozenset(c for s in BUILTIN if s.name != CLASSIFY.name for c in s.output_columns)
    check_head_names(list(cfg.classify.heads), "[classify.heads]", others)
    heads = []
    for name, folder in cfg.classify.head_dirs().items():
        if not folder.is_dir():
            raise ModelError(
                f"[classify.heads] {name}: the head folder {folder} does not exist; give a "
                "folder written by `docintel train`"
            )
        head_labels = _check_head(folder, embed_path, dim, f"[classify.heads] {name}")
        heads.append(
            {"name": name, "dir": str(folder), "version": fingerprint(folder),
             "labels": head_labels}
        )  # fmt: skip
    return StageFacts(version=fingerprint(clf_dir), labels=labels, heads=heads)


def _check_head(clf_dir: Path, embed_path: Path, dim: int, setting: str) -> list[str]:
    """One head folder's labels; refused (ModelError) when incomplete, or trained on
    another encoder or embedding size."""
    labels, training = read_classifier_meta(clf_dir)
    head_languages(training, f"{clf_dir}/training.json")  # a bad record: refused here
    if training.get("embedding_dim") != dim:
        raise ModelError(
            f"classifier {clf_dir} was trained on {training.get('embedding_dim')}-d embeddings "
            f"but the embedder {embed_path} makes {dim}-d ones; train a matching head with "
            f"`docintel train DATA --out DIR` and set {setting}"
        )
    check_head_encoder(clf_dir, embed_path)  # another encoder's head: refused, not warned
    return labels


def _fixed_size_rows(row: np.ndarray, n: int) -> pa.FixedSizeListArray:
    """``n`` copies of ``row`` as a fixed-size list<float32> column."""
    flat = pa.array(np.tile(row, n), pa.float32())
    return pa.FixedSizeListArray.from_arrays(flat, len(row))


def _sentencize_placeholder(_cfg: Config) -> Callable[[pa.Table], dict[str, pa.Array]]:
    """Each document is one sentence, its whole text (no spaCy)."""

    def columns(table: pa.Table) -> dict[str, pa.Array]:
        n = table.num_rows
        ends = pc.utf8_length(table[TEXT]).cast(pa.int64())
        return {
            SENT_INDEX: pa.array(np.zeros(n, np.int32)),
            START_CHAR: pa.array(np.zeros(n, np.int64)),
            END_CHAR: pc.fill_null(ends, 0),
        }

    return columns


def _embed_placeholder(cfg: Config) -> Callable[[pa.Table], dict[str, pa.Array]]:
    """A fixed unit vector of the encoder's size, 0 tokens, not truncated (no torch)."""
    dim = embedding_dim(cfg.embed.resolved_model_path())
    unit = np.full(dim, 1.0 / math.sqrt(dim), np.float32)

    def columns(table: pa.Table) -> dict[str, pa.Array]:
        n = table.num_rows
        return {
            EMBEDDING: _fixed_size_rows(unit, n),
            N_TOKENS: pa.array(np.zeros(n, np.int32)),
            TRUNCATED: pa.array(np.zeros(n, bool)),
        }

    return columns


def _classify_placeholder(cfg: Config) -> Callable[[pa.Table], dict[str, pa.Array]]:
    """The first label with uniform probabilities (no TensorFlow); null where the head's
    languages do not hold the row's ``language``, as the real stage."""
    heads = {"": cfg.classify.resolved_model_dir(), **cfg.classify.head_dirs()}
    metas = {name: read_classifier_meta(folder) for name, folder in heads.items()}

    def columns(table: pa.Table) -> dict[str, pa.Array]:
        n = table.num_rows
        out: dict[str, pa.Array] = {}
        for name, (labels, training) in metas.items():
            k = len(labels)
            probs = np.full((n, k), 1.0 / k, np.float32)
            mask = unlabelled_mask(table, head_languages(training))
            label, score = label_columns(probs, labels, mask)
            names = head_columns(name) if name else (LABEL, SCORE)
            # an extra head's probabilities: keyed by their field (its labels ride in it)
            key: Any = head_probs_field(name, labels) if name else PROBS
            out |= {names[0]: label, names[1]: score, key: _fixed_size_rows(probs[0], n)}
        return out

    return columns


SENTENCIZE = StageSpec(
    name=Sentencizer.name,
    cls=Sentencizer,
    backends={SPACY: Backend(lambda cfg, pool: Sentencizer(cfg.sentencize, placement(pool)))},
    choose=lambda _cfg, _pool: SPACY,
    pool=PoolDefaults(SENTENCIZE_CPUS, SENTENCIZE_GPU),
    section=SentencizeConfig,
    check=_check_sentencize,
    placeholder=_sentencize_placeholder,
    has_weights=False,
)

EMBED = StageSpec(
    name=Embedder.name,
    cls=Embedder,
    backends={
        TORCH: Backend(lambda cfg, p: Embedder(cfg.embed, p.replicas, placement(p))),
        ONNX_FP32: Backend(
            lambda cfg, p: OnnxEmbedder(cfg.embed, cfg.embed.resolved_int8_dir(), p.replicas),
            _encoder_artefact("fused fp32 ONNX encoder", FP32_MODEL_FILE, "fp32"),
        ),
        ONNX_INT8: Backend(
            lambda cfg, p: Int8Embedder(cfg.embed, cfg.embed.resolved_int8_dir(), p.replicas),
            _encoder_artefact("int8 encoder", INT8_MODEL_FILE, "int8"),
        ),
    },
    choose=_choose_model_backend(TORCH, lambda cfg: cfg.embed.cpu_runtime),
    pool=PoolDefaults(EMBED_CPUS, EMBED_GPU, heavy=True),
    section=EmbedConfig,
    int8=True,
    check=_check_embed,
    placeholder=_embed_placeholder,
)

CLASSIFY = StageSpec(
    name=Classifier.name,
    cls=Classifier,
    backends={
        KERAS: Backend(lambda cfg, p: Classifier(cfg.classify, CLASSIFY_THREADS, placement(p))),
        ONNX_FP32: Backend(
            lambda cfg, _p: OnnxClassifier(
                cfg.classify, cfg.embed.resolved_int8_dir(), CLASSIFY_THREADS
            ),
            _head_artefact("fp32 ONNX classifier", int8=False),
        ),
        ONNX_INT8: Backend(
            lambda cfg, _p: Int8Classifier(
                cfg.classify, cfg.embed.resolved_int8_dir(), CLASSIFY_THREADS
            ),
            _head_artefact("int8 classifier", int8=True),
        ),
    },
    choose=_choose_model_backend(KERAS, lambda cfg: cfg.classify.cpu_runtime),
    pool=PoolDefaults(CLASSIFY_CPUS, CLASSIFY_GPU),
    section=ClassifyConfig,
    int8=True,
    check=_check_classify,
    placeholder=_classify_placeholder,
)

# The built-in stages, in chain order. A new one is its module (its Stage class, its
# settings model and its StageSpec) plus one entry here: its config section [<name>], its
# [resources.<name>] pool with the declared defaults, its share of a card and its
# <name>_backend / <name>_model columns all follow from the declaration.
BUILTIN: tuple[StageSpec, ...] = (PARSE, SENTENCIZE, PRIVACY, ENTITIES, LANGUAGE, EMBED, CLASSIFY)
BUILTIN_NAMES: tuple[str, ...] = tuple(s.name for s in BUILTIN)


# --- user-defined stages -------------------------------------------------------------------


class UserStage(Stage):
    """A user-defined stage as its replicas hold it: the user's object, with the backend
    and version the rows record filled in where the stage names none (its pool: cpu-fp32,
    gpu-fp32, or gpu-sim without CUDA; the class's ``module:Class`` path)."""

    def __init__(self, inner: Stage, kind: str) -> None:
        self.inner = inner
        self.kind = kind
        self.name = inner.name  # type: ignore[misc]  # the wrapper stands in for the stage
        self.input_columns = tuple(inner.input_columns)  # type: ignore[misc]
        self.output_columns = tuple(inner.output_columns)  # type: ignore[misc]
        self.keeps_input = inner.keeps_input  # type: ignore[misc]

    def setup(self) -> None:
        self.inner.setup()
        backend = self.inner.backend
        if backend == Stage.backend:  # not set by the stage: say where it ran
            gpu = self.kind == "gpu"
            backend = backend_label(USER, gpu, gpu and cuda_available())
        self.backend = backend
        version = self.inner.version
        cls = type(self.inner)
        self.version = version if version != Stage.version else f"{cls.__module__}:{cls.__name__}"

    def __call__(self, table: pa.Table) -> pa.Table:
        return self.inner(table)

    def teardown(self) -> None:
        self.inner.teardown()


def _stage_folders(cfg: Config) -> dict[Path, str]:
    """Where a ``module:Class`` stage is looked for besides Python's path, each folder
    with what it is: the current folder (as ``python -m`` does), the config file's."""
    folders = {Path.cwd(): "the current folder"}
    if cfg.folder is not None:
        folders.setdefault(cfg.folder, "the config file's folder")
    return folders


def _import_stage_module(module_name: str, cfg: Config, where: str) -> ModuleType:
    """The module of a ``module:Class`` stage. The folders of :func:`_stage_folders` are
    searched after Python's path (an installed module of the same name wins, and none of
    the user's files shadows one), for this import only: the driver imports the module
    once, and the workers get it by value with the stage (actors/cluster.py)."""
    folders = _stage_folders(cfg)
    added = [str(f) for f in folders if str(f) not in sys.path]
    sys.path.extend(added)
    importlib.invalidate_caches()  # a folder or file made since the last import is seen
    failed = f"{where}: cannot import module {module_name!r}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name + ".").startswith(e.name + "."):
            raise ConfigError(f"{failed}: {e}") from e  # a module it imports is missing
        searched = ", ".join(f"{what} ({folder})" for folder, what in folders.items())
        raise ConfigError(
            f"{failed}: no module {e.name!r} in {searched} or Python's path (installed "
            "packages, PYTHONPATH)"
        ) from e
    except Exception as e:  # the module's own code ran: any error in it is the user's
        raise ConfigError(f"{failed}: {e!r}") from e
    finally:
        for folder in added:
            sys.path.remove(folder)


def _load_class(entry: str, cfg: Config) -> type:
    """The class an entry names: ``module:Class`` (its module imported by
    :func:`_import_stage_module`), or an entry point of the group ``docintel.stages``."""
    where = f"[pipeline] stages entry {entry!r}"
    if ":" in entry:
        module_name, _, attr = entry.partition(":")
        module = _import_stage_module(module_name, cfg, where)
        try:
            return getattr(module, attr)
        except AttributeError as e:
            raise ConfigError(f"{where}: module {module_name!r} has no {attr!r}") from e
    points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=entry)
    if not points:
        known = ", ".join(BUILTIN_NAMES)
        raise ConfigError(
            f"{where} is neither a built-in stage ({known}), a `module:Class` path, nor an "
            f"installed entry point of the group {ENTRY_POINT_GROUP!r}"
        )
    try:
        return next(iter(points)).load()
    except Exception as e:  # an entry point's import runs user code: any error is theirs
        raise ConfigError(f"{where}: loading its entry point failed: {e!r}") from e


def _user_spec(entry: str, cfg: Config) -> StageSpec:
    cls = _load_class(entry, cfg)
    where = f"[pipeline] stages entry {entry!r}"
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise ConfigError(f"{where} is not a subclass of docintel.pipeline.stages.Stage")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not STAGE_NAME.match(name):
        raise ConfigError(
            f"{where}: its class attribute `name` must be a lower-case identifier "
            f"(letters, digits, _), got {name!r}"
        )
    for attr in ("input_columns", "output_columns"):
        value = getattr(cls, attr, None)
        if not isinstance(value, tuple | list) or not all(isinstance(c, str) for c in value):
            raise ConfigError(f"{where}: `{attr}` must be a tuple of column names")
    settings = dict(cfg.stages.get(name, {}))

    def build(_cfg: Config, pool: Pool) -> Stage:
        return UserStage(cls(**settings), pool.kind)

    return StageSpec(
        name=name,
        cls=cls,
        backends={USER: Backend(build)},
        choose=lambda _cfg, _pool: USER,
        builtin=False,
        settings=settings,
    )


@dataclass(frozen=True)
class Chain:
    """The run's stages, resolved once from its config (:func:`chain`) and carried by the
    plan: each stage's spec in order (its columns, backends, pool growth), and what a run
    asks of them: the backend a pool runs, the stage object a replica holds, the derived
    artefacts a pool loads, the stage after which batches split. Nothing downstream of
    the plan resolves the chain again (a user stage's module is imported once)."""

    cfg: Config
    specs: tuple[StageSpec, ...]

    def __iter__(self) -> Iterator[StageSpec]:
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def spec(self, name: str) -> StageSpec:
        """The stage called ``name``."""
        for s in self.specs:
            if s.name == name:
                return s
        raise KeyError(name)

    def with_config(self, cfg: Config) -> Chain:
        """The same stages under ``cfg`` (the plan's, with its batch size resolved)."""
        return replace(self, cfg=cfg)

    def backend(self, pool: Pool) -> str:
        """The backend key the replicas of ``pool`` run."""
        return self.spec(pool.stage).choose(self.cfg, pool)

    def build(self, pool: Pool) -> Stage:
        """The stage object one replica of ``pool`` holds (config only), unwrapped."""
        return self.spec(pool.stage).backends[self.backend(pool)].build(self.cfg, pool)

    def artefacts(self, pool: Pool) -> list[Artefact]:
        """The derived models the replicas of ``pool`` load."""
        found = self.spec(pool.stage).backends[self.backend(pool)].artefacts(self.cfg)
        return [replace(a, stage=pool.stage) for a in found]

    @property
    def split_stage(self) -> str | None:
        """The stage after which a batch over ``[run] max_batch_sentences`` sentence rows
        is split into pieces (pipeline/run/pieces.py): the first that makes sentence rows."""
        return next((s.name for s in self.specs if SENT_INDEX in s.output_columns), None)

    def split_cap(self, stage: str) -> int:
        """The row bound a replica of ``stage`` splits its results at (0: never)."""
        return self.cfg.run.max_batch_sentences if stage == self.split_stage else 0


def chain(cfg: Config) -> Chain:
    """The run's stages in order (``[pipeline] stages``; empty: the built-in chain). The
    built-in stages a run has are the always-on ones and the optional ones its config asks
    for (:attr:`StageSpec.wanted`); a ``[pipeline] stages`` list that leaves out a wanted
    optional stage gets it after the built-in stage that precedes it in :data:`BUILTIN`."""
    wanted = [s.name for s in BUILTIN if s.wanted_in(cfg)]
    entries = _with_optional(list(cfg.pipeline.stages), wanted) if cfg.pipeline.stages else wanted
    by_name = {s.name: s for s in BUILTIN}
    specs = [by_name[e] if e in by_name else _user_spec(e, cfg) for e in entries]
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"[pipeline] stages names the stage(s) {dupes} more than once")
    for s in specs:
        if s.builtin and not s.wanted_in(cfg):
            raise ConfigError(
                f"[pipeline] stages names the optional stage {s.name!r}, which only runs "
                f"with {s.wanted_by}; set that instead"
            )
    builtin = [n for n in names if n in by_name]
    if builtin != wanted:
        raise ConfigError(
            f"[pipeline] stages must hold the built-in stages {wanted} in this order (user "
            f"stages may go between or after them); it has {builtin}"
        )
    check_place(specs)  # with redaction on, no user stage sees the raw text
    return Chain(cfg, tuple(specs))


def _with_optional(entries: list[str], wanted: list[str]) -> list[str]:
    """``entries`` with each wanted built-in stage it leaves out inserted right after the
    wanted built-in stage before it (the first one: at the start)."""
    out = list(entries)
    for i, name in enumerate(wanted):
        if name in out:
            continue
        before = wanted[i - 1] if i else None
        out.insert(out.index(before) + 1 if before in out else 0, name)
    return out


def resolve(cfg: Config, stages: Chain | None = None) -> Chain:
    """``stages`` where the caller has them (a run: the plan's); else ``cfg``'s chain,
    resolved now, for callers outside a run (`docintel quantize`, the audit's model
    checks, tests and benchmarks)."""
    return stages if stages is not None else chain(cfg)


def _unknown(kind: str, name: str, names: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(
        f"{kind} names {name!r}, which is not a stage of this pipeline{hint}; its stages "
        f"are {', '.join(names)}"
    )


def check_config(cfg: Config) -> Chain:
    """The chain, with every stage-keyed setting checked against it: ``[resources.<x>]``,
    ``[stages.<x>]``, ``[faults]`` stage names; user stages constructed (config only) so a
    wrong keyword fails here, naming the entry; the columns checked end to end."""
    specs = chain(cfg)
    names = [s.name for s in specs]
    for name in cfg.resources.extra_pools():
        if name not in names:
            raise _unknown("a [resources.<stage>] table", name, names)
    for name in cfg.stages:
        if name not in names or name in BUILTIN_NAMES:
            raise _unknown("a [stages.<stage>] table (user stages only)", name, names)
    for key in ("poison_stage", "load_delay_stage"):
        value = getattr(cfg.faults, key)
        if value and value not in names:
            raise _unknown(f"[faults] {key}", value, names)
    for s in specs:
        if not s.builtin:
            try:
                s.cls(**s.settings)
            except Exception as e:  # the user's constructor: any error is a config error
                raise ConfigError(
                    f"stage {s.name!r} cannot be constructed with its [stages.{s.name}] "
                    f"settings {dict(s.settings)}: {e!r}"
                ) from e
    check_columns(specs)
    return specs


def check_columns(specs: Sequence[StageSpec]) -> list[str]:
    """Before any model loads, from the classes' declarations: every stage's inputs
    exist, user stages add new columns that reach the output, and the chain ends with
    what the sink writes. Returns the final columns."""
    from docintel.pipeline.stages.base import check_chain

    # a read task's rows: files' bytes for a chain that parses them, else documents' text
    first = next(iter(specs), None)
    source = [DOC_ID, CONTENT] if first and CONTENT in first.input_columns else [DOC_ID, TEXT]
    final = check_chain(source, [s.cls for s in specs])
    missing = [c for c in SINK_COLUMNS if c not in final]
    if missing:
        raise ConfigError(f"the stage chain drops the output column(s) {missing}")
    seen: set[str] = set(source)
    for s in specs:
        if not s.builtin:
            taken = [c for c in s.output_columns if c in seen or c in SINK_COLUMNS]
            if taken:
                raise ConfigError(
                    f"stage {s.name!r} outputs column(s) {taken} that another stage or the "
                    "output contract already has; give them new names"
                )
            lost = [c for c in s.output_columns if c not in final]
            if lost:
                raise ConfigError(
                    f"stage {s.name!r} outputs {lost}, but a later stage drops them (the "
                    "sentencizer replaces document rows with sentence rows): place it "
                    "after sentencize"
                )
        seen |= set(s.output_columns)
    return final
