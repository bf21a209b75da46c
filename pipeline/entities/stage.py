"""The ``entities`` stage: which watch-listed names each sentence names (issue 34).

An optional built-in stage, after sentencize, on CPU replicas, in a run's chain only when
``[entities] lists`` (``docintel run --watch-list FILE``) names at least one list.

**On the driver, before any work.** Every list is read and checked (:func:`check_lists`:
a bad list is a ``ConfigError``, exit 2, naming the file and the line) and summarised by
its content: name (the file's stem), SHA-256, entities, names and aliases. That summary is
the run's ``watch_lists`` plan key (a resume with a changed list is refused; the manifest
records it) and gives the stage's version, ``lists@<12 hex>``, written on every row
(``entities_model``). The lists are then **compiled once per run** into a derived
artefact (the registry's ``Artefact`` mechanism, pipeline/artefacts/derived.py): one
pickled :class:`~docintel.pipeline.entities.compiled.CompiledLists` in the cache folder,
``<cache>/entities/<key>.lists``, keyed by the lists' contents and the matching code, with
its checksum beside it. A second run of the same lists finds it built.

**In a replica.** ``setup()`` loads that file (nothing is compiled per replica); each
replica holds the automaton and word table in its own memory: about 25 MB for 10^5 names,
200 MB per 10^6 (BENCHMARKS.md, "Watch-list matching"). On a cluster the cache folder
must be one every node sees, as for the other derived artefacts.

**Columns.** ``sentences.entities``: a list of structs (``entity_id``, ``name``, ``list``,
``type``, ``match``, ``start``, ``end``, ``similarity``) per sentence, empty when it names
none; ``start``/``end`` index the sentence's stored ``text`` (``match ==
text[start:end]``). ``documents.entity_ids``: the sorted distinct ids of a document's
sentences, an empty list when there are none (and for a document that failed: see its
``status``). Both columns exist only in runs with the stage.
"""

from __future__ import annotations

import hashlib
import pickle
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from docintel.pipeline.artefacts.paths import TEMP_PREFIX, cache_dir, install
from docintel.pipeline.artefacts.versions import file_digest
from docintel.pipeline.entities.compiled import CompiledLists, compile_watch_lists
from docintel.pipeline.entities.lists import WatchList, load_list
from docintel.pipeline.entities.matcher import Match, Matcher
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.schema import (
    ENTITIES,
    ENTITIES_TYPE,
    ENTITY_IDS_FIELD,
    ENTITY_MATCH,
    TEXT,
    backend_label,
)
from docintel.pipeline.settings import Settings
from docintel.pipeline.stages.base import Stage
from docintel.pipeline.stages.spec import Artefact, Backend, PoolDefaults, StageFacts, StageSpec

if TYPE_CHECKING:
    from docintel.pipeline.config import Config

STAGE = ENTITIES  # the stage's name, and the sentences column it adds
AUTOMATON = "automaton"  # the backend key: pyahocorasick over word codes; rows say cpu-fp32
# Matching costs ~30 us a sentence (BENCHMARKS.md), about 1% of a CPU run's 3 ms: a tenth
# of a logical CPU per replica, so that on 2 cores the chain's pools still leave the I/O
# tasks their share (0.25 + 0.1 + 1.0 + 0.25 of the 1.75 CPUs the pools may take).
ENTITIES_CPUS = 0.1
COMPILED_SUBDIR = "entities"  # <cache>/entities/<key>.lists
COMPILED_SUFFIX = ".lists"
# The modules whose code decides what a compiled file holds and means: part of its key, so
# a docintel with other matching rules never loads an old compilation.
_CODE = ("compiled.py", "lists.py", "normalise.py")


class EntitiesConfig(Settings):
    """The ``[entities]`` config section: watch-list screening (docs/entities.md)."""

    # CSV or Parquet files of entity_id, name, optional aliases ('|'-separated) and type;
    # each list is named by its file's stem. Empty: no entities stage.
    lists: list[str] = Field(default_factory=list)
    # 1.0 (the default): exact matching after normalisation; below 1: fuzzy matching too
    # (typos, transliterations), down to this similarity.
    min_similarity: float = Field(1.0, gt=0, le=1)


# --- the lists on the driver ---------------------------------------------------------------


@dataclass(frozen=True)
class ListSummary:
    """One checked list as the plan key and the manifest record it (no name in it)."""

    list: str  # the file's stem
    sha256: str
    entities: int
    names: int  # names and aliases

    def record(self) -> dict[str, Any]:
        return {"list": self.list, "sha256": self.sha256, "entities": self.entities,
                "names": self.names}  # fmt: skip


_SUMMARIES: dict[str, ListSummary] = {}  # by (stem, content hash): each list read once
# The lists check_lists read, kept for the compile that may follow (so a run that compiles
# reads each list once) and dropped by it, or once the stage's replicas are built.
_LOADED: dict[str, WatchList] = {}


def _key(path: Path) -> str:
    return f"{path.stem}:{file_digest(path)}"


def list_paths(cfg: Config) -> list[Path]:
    """The lists ``[entities] lists`` names, in order (relative paths: to the current
    folder, as every path of the config)."""
    return [Path(p).expanduser() for p in cfg.entities.lists]


def check_lists(paths: Sequence[Path]) -> list[ListSummary]:
    """Read and check every list (``ConfigError`` naming the file and line of the first
    problem); each list's summary. A list whose bytes were read before is not read again."""
    out, seen = [], {}
    for path in paths:
        try:
            key = _key(path)
        except OSError as e:
            raise ConfigError(f"watch list {path}: unreadable file: {e.strerror or e}") from e
        if key not in _SUMMARIES:
            wl = _LOADED[key] = load_list(path)
            names = sum(1 + len(a) for a in wl.aliases)
            _SUMMARIES[key] = ListSummary(path.stem, key.split(":", 1)[1], len(wl), names)
        if path.stem in seen:
            raise ConfigError(
                f"watch lists {seen[path.stem]} and {path} have the same name {path.stem!r} "
                "(a list is named by its file's stem): rename one"
            )
        seen[path.stem] = path
        out.append(_SUMMARIES[key])
    return out


def lists_digest(summaries: Sequence[ListSummary]) -> str:
    """The lists' contents, in order, as one hex digest (names and bytes)."""
    h = hashlib.sha256()
    for s in summaries:
        h.update(f"{s.list}\0{s.sha256}\0".encode())
    return h.hexdigest()


def plan_record(cfg: Config) -> dict[str, Any]:
    """The run's ``watch_lists`` plan key: each list's summary and the similarity asked."""
    lists = [s.record() for s in check_lists(list_paths(cfg))]
    return {"lists": lists, "min_similarity": cfg.entities.min_similarity}


def lists_version(cfg: Config) -> str:
    """``lists@<12 hex of the lists' contents>``, and ``~<min similarity>`` when fuzzy."""
    version = f"lists@{lists_digest(check_lists(list_paths(cfg)))[:12]}"
    fuzzy = cfg.entities.min_similarity
    return version if fuzzy >= 1 else f"{version}~{fuzzy:g}"


def compiled_path(cfg: Config) -> Path:
    """Where the run's compiled lists are cached: keyed by the lists and the code."""
    h = hashlib.sha256(lists_digest(check_lists(list_paths(cfg))).encode())
    here = Path(__file__).parent
    for name in _CODE:
        h.update(file_digest(here / name).encode())
    return cache_dir() / COMPILED_SUBDIR / f"{h.hexdigest()[:32]}{COMPILED_SUFFIX}"


def build_compiled(paths: Sequence[Path], target: Path) -> Path:
    """Compile the lists into ``target``: staged under a hidden name, renamed into place
    whole, its checksum beside it (pipeline/artefacts/paths.py, ``install``)."""
    kept = [_LOADED.pop(_key(p), None) for p in paths]
    lists = [wl if wl is not None else load_list(p) for wl, p in zip(kept, paths, strict=True)]
    compiled = compile_watch_lists(lists)
    _LOADED.clear()
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex[:12]}-{target.name}")
    with staged.open("wb") as f:
        pickle.dump(compiled, f, protocol=5)
    return install(staged, target)


def _artefacts(cfg: Config) -> list[Artefact]:
    path = compiled_path(cfg)
    build = partial(build_compiled, list_paths(cfg), path)
    return [Artefact("compiled watch lists", path, build, exported=False)]


def _matcher(cfg: Config) -> EntityMatcher:
    """The stage one replica holds (config only); the lists read on the driver are dropped."""
    _LOADED.clear()
    return EntityMatcher(cfg.entities, compiled_path(cfg), lists_version(cfg))


def _check(cfg: Config) -> StageFacts:
    return StageFacts(version=lists_version(cfg))


# --- the stage -----------------------------------------------------------------------------


class EntityMatcher(Stage):
    """Adds ``entities`` to every sentence row: the listed names it names."""

    name = STAGE
    input_columns = (TEXT,)
    output_columns = (ENTITIES,)

    def __init__(self, settings: EntitiesConfig, compiled: Path, version: str) -> None:
        self.settings = settings
        self.compiled = Path(compiled)
        self.lists_version = version
        self.matcher: Matcher | None = None

    def setup(self) -> None:
        data = self.compiled.read_bytes()  # built on the driver; never compiled here
        self.matcher = Matcher(CompiledLists.from_bytes(data), self.settings.min_similarity)
        self.backend = backend_label(AUTOMATON)
        self.version = self.lists_version

    def teardown(self) -> None:
        self.matcher = None

    def __call__(self, table: pa.Table) -> pa.Table:
        assert self.matcher is not None, "setup() first"
        found = [self.matcher.find(t) for t in table[TEXT].to_pylist()]
        return table.append_column(pa.field(ENTITIES, ENTITIES_TYPE), entities_column(found))


def entities_column(found: Sequence[Sequence[Match]]) -> pa.Array:
    """Each sentence's matches as one ``list<struct>`` array (built column by column)."""
    offsets = np.zeros(len(found) + 1, np.int32)
    np.cumsum([len(f) for f in found], out=offsets[1:])
    flat = [m for f in found for m in f]
    fields = {
        "entity_id": pa.array([m.entity_id for m in flat], pa.string()),
        "name": pa.array([m.name for m in flat], pa.string()),
        "list": pa.array([m.list for m in flat], pa.string()),
        "type": pa.array([m.type for m in flat], pa.string()),
        "match": pa.array([m.match for m in flat], pa.string()),
        "start": pa.array([m.start for m in flat], pa.int32()),
        "end": pa.array([m.end for m in flat], pa.int32()),
        "similarity": pa.array([m.similarity for m in flat], pa.float32()),
    }
    structs = pa.StructArray.from_arrays(list(fields.values()), fields=list(ENTITY_MATCH))
    return pa.ListArray.from_arrays(pa.array(offsets), structs, type=ENTITIES_TYPE)


def document_entity_ids(sentences: pa.Table, doc_index: np.ndarray, n_docs: int) -> pa.Array:
    """``documents.entity_ids``: per document (``doc_index``: each sentence row's document),
    the sorted distinct entity ids of its sentences' ``entities``; [] for none."""
    lists = sentences[ENTITIES].combine_chunks()
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(lists)
    ids = pc.struct_field(flat, "entity_id").to_numpy(zero_copy_only=False)
    per_doc: list[set[str]] = [set() for _ in range(n_docs)]
    for doc, entity in zip(doc_index[parents], ids, strict=True):
        per_doc[doc].add(entity)
    return pa.array([sorted(s) for s in per_doc], ENTITY_IDS_FIELD.type)


ENTITIES_SPEC = StageSpec(
    name=STAGE,
    cls=EntityMatcher,
    backends={
        AUTOMATON: Backend(
            lambda cfg, _pool: _matcher(cfg),
            _artefacts,
        )
    },
    choose=lambda _cfg, _pool: AUTOMATON,
    pool=PoolDefaults(ENTITIES_CPUS),
    section=EntitiesConfig,
    check=_check,
    has_weights=False,
    wanted=lambda cfg: bool(cfg.entities.lists),
    wanted_by="[entities] lists (docintel run --watch-list FILE)",
)
