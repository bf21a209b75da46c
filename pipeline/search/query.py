"""`docintel search`: the sentences of a committed run that best answer a query, ranked by
``mode``: semantic (cosine), keyword (BM25) or hybrid (both fused by relative score
fusion, the default; docintel.pipeline.search.keyword).

The query is embedded by the embed stage's own code (:class:`~docintel.pipeline.stages.
embed.Embedder`: the same tokenizer, truncation, runtime, mean pooling and L2
normalisation as every sentence of the run), with the encoder the config names, and only
if its version is the one the run's manifest recorded (else ModelError, exit 2, naming
both). A query longer than the encoder's ``max_length`` tokens is truncated and flagged,
as a sentence is.

Two ways to find the hits, the same answer up to the index's recall:

* **exact** (:func:`exact_search`): the sentences table streamed in record batches
  (:meth:`SentencesSource.batches`), each batch's cosines against every query, and a
  running top-K per query (argpartition of the batch, merged with the best so far). Memory
  is one record batch plus K rows per query, never the embedding matrix. A keyword ranking
  first reads the text column once for its terms' statistics (two passes); hybrid keeps
  each ranking's pool (keyword.pool_size) and fuses them.
* **indexed** (docintel.pipeline.search.index): the Lance IVF-PQ and full-text indexes
  `docintel index` built, when they exist and were built from the output as it is now;
  otherwise exact, and :class:`SearchResult` says why (``note``).

Either way the similarity reported is the exact cosine of the stored embedding with the
query vector (the index only chooses the candidates), and ``bm25`` the keyword score of a
hit the keyword ranking chose.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.config import Config, EmbedConfig, load_config
from docintel.pipeline.errors import InputError, ModelError, UsageError
from docintel.pipeline.labels import resolve_label, run_heads
from docintel.pipeline.schema import EMBEDDING, ENTITIES, LABEL, TEXT, TORCH
from docintel.pipeline.search import index as ann_index
from docintel.pipeline.search.keyword import (
    HYBRID,
    KEYWORD,
    MODES,
    SEMANTIC,
    Bm25,
    combine,
    needs_dense,
    needs_keyword,
    pool_size,
    query_terms,
)
from docintel.pipeline.search.source import (
    HIT_COLUMNS,
    READ_BATCH_ROWS,
    SIMILARITY,
    Filters,
    SentencesSource,
    cosine,
    embedding_matrix,
    to_hits,
    unit_rows,
)

# --top is bounded: each query keeps its top rows (text included) in memory while the
# table streams, and prints them; 1,000 rows per query is a page of results, not a dump.
MAX_TOP = 1000
# --queries FILE: at most this many queries per invocation (each one's top-K is held at
# once, and the scan computes one column of cosines per query).
MAX_QUERIES = 1000


# --- the query encoder ---------------------------------------------------------------------


def recorded_encoder(manifest: dict[str, Any]) -> str | None:
    """The encoder version the run recorded: the driver's fingerprint of the model folder
    (``plan.models.embed``), else what the replicas reported, less its runtime suffix."""
    from docintel.pipeline.stages.embed import Embedder

    plan_models = (manifest.get("plan") or {}).get("models") or {}
    if plan_models.get(Embedder.name):
        return str(plan_models[Embedder.name])
    reported = (manifest.get("models") or {}).get(Embedder.name)
    return str(reported).split("+", 1)[0] if reported else None


@dataclass(frozen=True)
class _QueryPool:
    """Where queries are embedded: one fp32 CPU replica of the embed stage, here."""

    stage: str
    kind: str = "cpu"
    replicas: int = 1
    gpu_fraction: float = 0.0
    precision: str = "fp32"


def query_embedder(embed: EmbedConfig, key: str | None = None) -> tuple[str, Any]:
    """The embed stage as queries are embedded (config only), and its backend key: what a
    run's fp32 CPU replicas run with these settings, as the stage's registry declaration
    chooses it (``[embed] cpu_runtime``), or the backend ``key``."""
    from docintel.pipeline.registry import EMBED

    cfg, pool = Config(embed=embed), _QueryPool(EMBED.name)
    key = key or EMBED.choose(cfg, pool)
    return key, EMBED.backends[key].build(cfg, pool)


class QueryEncoder:
    """The run's encoder, loaded as the embed stage loads it, for queries."""

    def __init__(self, cfg: EmbedConfig) -> None:
        self.cfg = cfg
        self.path = cfg.resolved_model_path()
        self._stage: Any = None

    @property
    def version(self) -> str:
        return fingerprint(self.path)

    def check(self, manifest: dict[str, Any], where: str) -> str:
        """The installed encoder's version; ModelError unless the run recorded it."""
        recorded = recorded_encoder(manifest)
        if recorded is None:
            raise ModelError(
                f"{where}: its manifest records no encoder version (no embed stage ran), "
                "so a query cannot be embedded as its sentences were"
            )
        installed = self.version
        if installed != recorded:
            raise ModelError(
                f"{where} was embedded with encoder {recorded}, but the installed encoder "
                f"({self.path}) is {installed}: their vectors are not comparable. Search "
                "with the config the run used (--config, [embed] model_path), or rerun "
                "the corpus with this encoder"
            )
        return installed

    def _load(self) -> Any:
        if self._stage is None:
            # what the run's fp32 CPU replicas run, as the registry chooses it ([embed]
            # cpu_runtime: the fused fp32 ONNX graph, exact to PyTorch, by default) when
            # that artefact is built from this very encoder; else the encoder on PyTorch
            key, stage = query_embedder(self.cfg)
            if key == TORCH or not self._derived_from_this(stage):
                _, stage = query_embedder(self.cfg, TORCH)
                stage.setup()
            self._stage = stage
        return self._stage

    def _derived_from_this(self, stage: Any) -> bool:
        """``stage`` runs an artefact that exists and was built from this encoder (then it
        is set up; else torn down)."""
        if stage.path is None or not stage.path.is_file():
            return False
        stage.setup()
        if stage.version.startswith(f"{self.version}+"):
            return True
        stage.teardown()
        return False

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(unit vectors float32 [n, dim], truncated flags) exactly as the embed stage
        computes a sentence's (its front end's chunked encode, its truncation)."""
        from docintel.pipeline.stages.embed import ENCODE_CHUNK

        stage = self._load()
        vectors, _, truncated = stage.frontend.encode_chunked(texts, stage.encode, ENCODE_CHUNK)
        return vectors, truncated

    @property
    def max_length(self) -> int:
        stage = self._load()
        return int(stage.frontend.max_length)

    def close(self) -> None:
        if self._stage is not None:
            self._stage.teardown()
            self._stage = None


# --- exact search ----------------------------------------------------------------------------


@dataclass
class TopK:
    """One query's best ``k`` rows so far by one ranking's scores (cosine, or BM25 with a
    ``similarity`` column beside the hit columns); a non-finite score never enters."""

    k: int
    sims: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    rows: pa.Table | None = None

    def offer(self, sims: np.ndarray, batch: pa.RecordBatch) -> None:
        """Keep the best of what is held and ``batch``'s rows (scores ``sims``)."""
        idx = np.flatnonzero(np.isfinite(sims))
        if len(self.sims) >= self.k:  # only rows that beat the worst kept one can enter
            idx = idx[sims[idx] > self.sims.min()]
        if len(idx) > self.k:
            idx = idx[np.argpartition(-sims[idx], self.k - 1)[: self.k]]
        if not len(idx):
            return
        taken = pa.Table.from_batches([batch.take(pa.array(idx))])
        both = taken if self.rows is None else pa.concat_tables([self.rows, taken])
        sims_all = np.concatenate([self.sims, sims[idx]])
        if len(sims_all) > self.k:
            keep = np.argpartition(-sims_all, self.k - 1)[: self.k]
            both, sims_all = both.take(pa.array(keep)), sims_all[keep]
        self.rows, self.sims = both, sims_all

    def hits(self) -> list[dict[str, Any]]:
        """Best first by cosine (the scores are similarities)."""
        return [] if self.rows is None else to_hits(self.rows, self.sims)

    def keyword_hits(self) -> list[dict[str, Any]]:
        """Best first by BM25 (the scores), with each row's ``similarity`` column."""
        if self.rows is None:
            return []
        return to_hits(self.rows, self.rows[SIMILARITY].to_numpy(), self.sims)


def keyword_statistics(
    source: SentencesSource, texts: list[str], batch_rows: int = READ_BATCH_ROWS
) -> Bm25:
    """Pass 1 of a keyword ranking: the BM25 statistics of the queries' terms over the
    whole sentences table (its text column only, streamed)."""
    bm25 = Bm25([query_terms(t) for t in texts])
    if bm25.terms:
        for batch in source.batches([TEXT], batch_rows):
            bm25.gather(batch[TEXT].to_pylist())
    return bm25


def _scan(source: SentencesSource, filters: Filters, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The sentences that pass ``filters`` and have an embedding, in record batches."""
    for read in source.batches([*HIT_COLUMNS, EMBEDDING, *filters.columns], batch_rows):
        mask = filters.mask(read)
        batch = read if mask is None else read.filter(mask)
        if batch[EMBEDDING].null_count:
            batch = batch.filter(batch[EMBEDDING].is_valid())
        if batch.num_rows:
            yield batch


def exact_search(
    source: SentencesSource,
    vectors: np.ndarray,
    top: int,
    filters: Filters,
    batch_rows: int = READ_BATCH_ROWS,
    *,
    texts: list[str] | None = None,
    mode: str = SEMANTIC,
) -> list[list[dict[str, Any]]]:
    """Each query's ``top`` hits over the sentences table, streamed in record batches of at
    most ``batch_rows``: by exact cosine (``mode`` semantic), BM25 of ``texts`` (keyword),
    or both fused (hybrid: :func:`fuse_relative` of each ranking's ``top`` best). A
    keyword ranking reads the table twice (pass 1: :func:`keyword_statistics`)."""
    queries = unit_rows(np.asarray(vectors, np.float32))
    bm25 = keyword_statistics(source, texts or [], batch_rows) if needs_keyword(mode) else None
    pool = top if mode == SEMANTIC else pool_size(top)  # ties: the nearer
    dense = [TopK(pool) for _ in queries] if needs_dense(mode) else []
    keyword = [TopK(pool) for _ in queries] if bm25 is not None else []
    for batch in _scan(source, filters, batch_rows):
        sims = cosine(embedding_matrix(batch[EMBEDDING]), queries)
        rows = batch.select(list(HIT_COLUMNS))
        for j, t in enumerate(dense):
            t.offer(sims[:, j], rows)
        if bm25 is None:
            continue
        scores = bm25.score(batch[TEXT].to_pylist())
        scores[scores <= 0] = -np.inf  # a sentence without the query's terms is no hit
        for j, t in enumerate(keyword):
            t.offer(scores[:, j], rows.append_column(SIMILARITY, pa.array(sims[:, j])))
    return [
        combine(
            dense[j].hits() if dense else [],
            keyword[j].keyword_hits() if keyword else [],
            top,
            mode,
        )
        for j in range(len(queries))
    ]


# --- search: checks, encoder, index or exact -------------------------------------------------


@dataclass
class SearchResult:
    queries: list[str]
    hits: list[list[dict[str, Any]]]  # per query, best first (keys HIT_KEYS)
    truncated: list[bool]  # per query: longer than the encoder's limit, truncated
    used_index: bool  # the hits came from the index
    note: str  # which path answered, and why (for stderr)
    max_length: int = 0  # the encoder's token limit
    mode: str = HYBRID  # the ranking: semantic, keyword or hybrid (keyword.MODES)


def check_queries(queries: list[str], top: int) -> list[str]:
    """The queries, refused (UsageError, exit 2) when empty, too many or ``top`` is out of
    bounds."""
    if not queries:
        raise UsageError("no query given: pass QUERY or --queries FILE (one query per line)")
    for i, q in enumerate(queries, 1):
        if not q.strip():
            raise UsageError(f"query {i} is empty: give the text to search for")
    if len(queries) > MAX_QUERIES:
        raise UsageError(f"{len(queries):,} queries: at most {MAX_QUERIES:,} per invocation")
    if not 1 <= top <= MAX_TOP:
        raise UsageError(f"--top {top}: give 1 to {MAX_TOP:,} (hits per query)")
    return queries


def read_queries(path: Path) -> list[str]:
    """One query per line of ``path``; blank lines are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--queries {path}: cannot be read as UTF-8 text ({e})") from e
    queries = [line.strip() for line in lines if line.strip()]
    if not queries:
        raise InputError(f"--queries {path} holds no query (one per line)")
    return queries


def check_label(source: SentencesSource, filters: Filters) -> Filters:
    """``--label`` as a label of the run's heads (``NAME.label``: the extra head NAME's),
    matched case-insensitively; UsageError naming the labels there are."""
    if filters.label is None or not source.manifest.get("labels"):
        return filters
    ref = resolve_label(filters.label, run_heads(source.manifest), "--label")
    return replace(filters, label=ref.label, label_column=ref.label_column)


def check_entity(source: SentencesSource, entity_id: str | None) -> None:
    """``--entity`` asks a run that screened its sentences (the entities stage ran)."""
    if entity_id is not None and ENTITIES not in (source.manifest.get("stages") or []):
        raise UsageError(
            f"--entity: {source.uri} was made without watch lists (no entities stage), so "
            "no sentence names an entity; run it with --watch-list FILE"
        )


def check_mode(mode: str, queries: list[str]) -> str:
    """``mode`` (UsageError, exit 2, unless one of MODES); keyword mode refuses a query
    with no term to match (only stop words or punctuation)."""
    if mode not in MODES:
        raise UsageError(f"--mode {mode!r}: give one of {', '.join(MODES)}")
    if mode == KEYWORD:
        for i, q in enumerate(queries, 1):
            if not query_terms(q):
                raise UsageError(
                    f"query {i} has no word to match by keyword (only stop words or "
                    "punctuation): use --mode semantic or hybrid, or other words"
                )
    return mode


def search(
    output_uri: str,
    queries: list[str],
    top: int = 10,
    filters: Filters | None = None,
    cfg: Config | None = None,
    *,
    exact: bool = False,
    encoder: QueryEncoder | None = None,
    mode: str = HYBRID,
) -> SearchResult:
    """Each query's ``top`` hits in the committed run at ``output_uri``, ranked by
    ``mode`` (see the module docstring); ``exact`` skips the index."""
    cfg = cfg or load_config()
    filters = filters or Filters()
    check_queries(queries, top)
    check_mode(mode, queries)
    source = SentencesSource.open(output_uri, cfg.storage, cfg)
    dim = source.require_embeddings()
    filters = check_label(source, filters)
    check_entity(source, filters.entity_id)
    encoder = encoder or QueryEncoder(cfg.embed)
    encoder.check(source.manifest, source.uri)
    vectors, truncated = encoder.encode(queries)
    if dim and vectors.shape[1] != dim:
        raise ModelError(f"the encoder makes {vectors.shape[1]}-d vectors, {source.uri} {dim}-d")
    index, note = (None, "exact scan (--exact)") if exact else ann_index.find(source, mode)
    if index is not None and filters.entity_id is not None:  # the index has no entities
        index, note = None, "exact scan (--entity: the index holds no entities column)"
    if index is not None and filters.label_column != LABEL:  # nor the extra heads' labels
        index, note = None, "exact scan (--label of an extra head: not in the index)"
    if index is not None and filters.doc_ids is None:
        hits = ann_index.query(index, vectors, top, filters, texts=queries, mode=mode)
        used = True
    else:
        hits = exact_search(source, vectors, top, filters, texts=queries, mode=mode)
        used = False
    cut = list(map(bool, truncated))
    return SearchResult(
        queries, hits, cut, used, f"{mode} ranking, {note}", encoder.max_length, mode
    )


def watch_hits(
    output: str | SentencesSource,
    queries: list[str],
    doc_ids: set[str] | None,
    top: int,
    cfg: Config | None = None,
    mode: str = HYBRID,
) -> dict[str, list[dict[str, Any]]]:
    """For the nightly report: each saved query's ``top`` hits (keys HIT_KEYS) among the
    sentences of ``doc_ids`` (None: every document of the output), ranked as `docintel
    search` ranks them (``mode``, hybrid by default), by an exact scan (a night's output
    is small, and a doc id set is no index filter). ModelError when the installed encoder
    is not the run's."""
    if not queries:
        return {}
    cfg = cfg or load_config()
    source = output if isinstance(output, SentencesSource) else None
    source = source or SentencesSource.open(str(output), cfg.storage, cfg)
    check_queries(queries, top)
    check_mode(mode, queries)
    if not source.require_embeddings():
        return {q: [] for q in queries}
    encoder = QueryEncoder(cfg.embed)
    encoder.check(source.manifest, source.uri)
    vectors, _ = encoder.encode(queries)
    wanted = Filters(doc_ids=frozenset(doc_ids) if doc_ids is not None else None)
    hits = exact_search(source, vectors, top, wanted, texts=queries, mode=mode)
    return dict(zip(queries, hits, strict=True))
