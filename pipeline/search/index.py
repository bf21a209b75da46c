"""`docintel index`: an approximate nearest-neighbour index over a run's embeddings, and a
full-text index over its sentences' words.

The index is a Lance dataset (pylance) holding the hit columns and the embeddings of the
sentences table, with an IVF-PQ vector index (cosine) on the embeddings, and a full-text
(inverted, BM25) index on ``terms``: each sentence's text as docintel's tokenizer splits
it (docintel.pipeline.search.keyword), so that keyword scores are the exact scan's. It
lives inside the output, beside the tables it was built from (local folder or the same
s3:// prefix):

    OUTPUT/_index/<build id>.lance   one build (Lance's own files)
    OUTPUT/_index/current.json       the pointer: which build, and the source it was made
                                     from; written last, atomically

A build writes a new ``<build id>.lance`` that nothing reads, then commits it by writing
the pointer (one atomic PUT on S3, a rename locally); only then are older builds deleted.
A crash at any point leaves the previous pointer (or none) intact: a half-built index is
never used, and the next build deletes the leftovers. The pointer records the source's
key (:meth:`SentencesSource.key`: the run's id and commit time, and the sentences files'
names, sizes and modification times); :func:`find` uses the index only while the output
still has that key, so an index of an output that has changed since is ignored (search
falls back to the exact scan and says so).

The build runs where it is called: `docintel index` on the driver, or, with
``--ray-address``, :func:`build_index` as one Ray task on a cluster node
(docintel.jobs.cli_search.build_on_ray), which then reads and writes the output there
(use s3:// or a path every node sees). Lance trains
IVF-PQ with its own native threads on one machine; the index of 10^6 sentences is built
in about a minute (BENCHMARKS.md), and a failed build is redone from scratch, so it is not
split into resumable pieces.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import re
import stat
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from docintel.pipeline.config import Config, StorageConfig
from docintel.pipeline.errors import InputError, RunFailed
from docintel.pipeline.output.sink import atomic_write, read_json
from docintel.pipeline.schema import EMBEDDING, TEXT
from docintel.pipeline.search.keyword import (
    SEMANTIC,
    combine,
    needs_dense,
    needs_keyword,
    pool_size,
    query_terms,
    tokenize,
)
from docintel.pipeline.search.source import (
    HIT_COLUMNS,
    Filters,
    SentencesSource,
    cosine,
    embedding_matrix,
    to_hits,
    unit_rows,
)
from docintel.pipeline.storage import display_uri, effective_endpoint, is_local

INDEX_FOLDER = "_index"
POINTER = "current.json"
INDEX_FORMAT = "lance-ivf-pq+fts/2"  # IVF-PQ on the embeddings, full-text on TERMS
SEMANTIC_ONLY_FORMAT = "lance-ivf-pq/1"  # an older build: no keyword index
FORMATS = (INDEX_FORMAT, SEMANTIC_ONLY_FORMAT)
INDEX_COLUMNS = [*HIT_COLUMNS, EMBEDDING]
# the text's terms (keyword.tokenize), space-separated: what the full-text index indexes,
# with Lance's whitespace tokenizer and no processing of its own (so that its BM25 is the
# exact scan's, term for term)
TERMS = "terms"
FTS_PARAMS: dict[str, Any] = {
    "base_tokenizer": "whitespace",
    "lower_case": False,
    "stem": False,
    "remove_stop_words": False,
    "ascii_folding": False,
    "with_position": False,
    "max_token_length": None,
}
MIN_ROWS_PER_PARTITION = 256  # what Lance trains a partition's centroid on at least
ROWS_PER_FILE = 1 << 20
# Partitions a query probes by default: recall@10 on the bench's synthetic 10^6 sentences
# (500 partitions) is 0.72 at 4 %, 0.89 at 16 %, 0.96 at 32 % and 0.99 at 50 %, at 9-17 ms
# p50 (BENCHMARKS.md, "Search"); refining more candidates changed nothing there.
PROBE_FRACTION = 0.4


@dataclass(frozen=True)
class IndexParams:
    """How the index is built and searched (recorded in the pointer).

    ``partitions`` 0 = auto: sqrt(rows) / 2, at most rows / 256 (10^6 rows: 500);
    ``sub_vectors`` 0 = auto: dim / 8 (8 dimensions per PQ code byte); ``nprobes`` 0 =
    auto: 40 % of the partitions, at least 8; ``refine_factor``: the PQ candidates
    re-ranked by their exact vectors (k x refine_factor of them)."""

    partitions: int = 0
    sub_vectors: int = 0
    nprobes: int = 0
    refine_factor: int = 10

    def resolved(self, rows: int, dim: int) -> IndexParams:
        parts = self.partitions or max(
            1, min(round(math.sqrt(rows) / 2), rows // MIN_ROWS_PER_PARTITION)
        )
        subs = self.sub_vectors or (dim // 8 if dim % 8 == 0 else 1)
        probes = self.nprobes or min(parts, max(8, math.ceil(parts * PROBE_FRACTION)))
        return IndexParams(parts, subs, probes, self.refine_factor)


def _lance() -> Any:
    os.environ.setdefault("LANCE_LOG", "error")  # Lance's training notices: not the user's
    import lance

    return lance


def _folder(source: SentencesSource) -> str:
    return f"{source.home}/{INDEX_FOLDER}"


def _lance_uri(source: SentencesSource, path: str) -> str:
    return path if is_local(source.fs) else f"s3://{path}"


def _storage_options(source: SentencesSource) -> dict[str, str] | None:
    """Lance's object store settings for an s3:// output: the endpoint and region the
    config (or the AWS variables) name; credentials come from the AWS environment."""
    if is_local(source.fs):
        return None
    opts: dict[str, str] = {}
    endpoint, _ = effective_endpoint(source.storage)
    if endpoint:
        opts["aws_endpoint"] = endpoint
        opts["allow_http"] = str(endpoint.startswith("http://")).lower()
    if source.storage.s3_region:
        opts["aws_region"] = source.storage.s3_region
    return opts


# What a build is called: <16 hex digits>.lance, inside _index (the pointer may name only
# that, and only such folders are ever deleted)
BUILD_NAME = re.compile(r"^[0-9a-f]{16}\.lance$")


def _index_where(source: SentencesSource) -> str:
    """The index folder as messages name it (a warehouse run's: under _runs/<run id>/)."""
    return display_uri(source.fs, _folder(source))


def _damaged(source: SentencesSource, why: str) -> InputError:
    return InputError(
        f"the index at {_index_where(source)} is damaged ({why}): rebuild it with "
        "`docintel index`, which replaces it"
    )


def _check_folder(source: SentencesSource) -> None:
    """``_index`` must be a real folder of OUTPUT: a symlink there would make the index
    write and delete elsewhere (lstat: the link itself, not where it points)."""
    folder = _folder(source)
    if not is_local(source.fs):
        return  # an object store has no links
    try:
        st = Path(folder).lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise InputError(
            f"{folder} is {'a symlink' if stat.S_ISLNK(st.st_mode) else 'not a folder'}: "
            "docintel keeps its index in a real folder of the output and deletes nothing "
            "through a link. Remove it, then run `docintel index` again"
        )


def read_pointer(source: SentencesSource) -> dict[str, Any] | None:
    """The pointer record, checked: a plain build name inside _index, known parameters."""
    _check_folder(source)
    record = read_json(source.fs, f"{_folder(source)}/{POINTER}")
    if record is None or record.get("format") not in FORMATS:
        return record
    if not BUILD_NAME.match(str(record.get("path", ""))):
        raise _damaged(source, f"{POINTER} names {str(record.get('path'))[:80]!r}, not a build")
    try:
        IndexParams(**record["params"])
    except (TypeError, KeyError) as e:
        raise _damaged(source, f"{POINTER} has unknown index parameters: {e}") from e
    return record


# --- build -----------------------------------------------------------------------------------


def _with_terms(batch: pa.RecordBatch) -> pa.RecordBatch:
    terms = [" ".join(tokenize(t)) for t in batch[TEXT].to_pylist()]
    return batch.append_column(TERMS, pa.array(terms, pa.string()))


def _write_rows(source: SentencesSource, path: str) -> Any:
    """The hit columns, embeddings and terms as a Lance dataset at ``path`` (streamed)."""
    batches = map(_with_terms, source.batches(INDEX_COLUMNS))
    first = next(batches, None)
    if first is None:
        raise InputError(f"{source.uri} has no sentences: there is nothing to index")

    def rows() -> Any:
        yield first
        yield from batches

    reader = pa.RecordBatchReader.from_batches(first.schema, rows())
    return _lance().write_dataset(
        reader,
        _lance_uri(source, path),
        max_rows_per_file=ROWS_PER_FILE,
        storage_options=_storage_options(source),
    )


def _commit(source: SentencesSource, record: dict[str, Any], build: str) -> None:
    """Write the pointer (the commit), then delete every other build (best effort)."""
    folder = _folder(source)
    _check_folder(source)
    atomic_write(source.fs, f"{folder}/{POINTER}", json.dumps(record, indent=2).encode())
    sel = pafs.FileSelector(folder, allow_not_found=True)
    for info in source.fs.get_file_info(sel):
        # only the builds this index wrote: <hex>.lance folders, never a link
        if info.base_name == build or not BUILD_NAME.match(info.base_name):
            continue
        if is_local(source.fs) and Path(info.path).is_symlink():
            continue
        with contextlib.suppress(OSError):
            if info.type == pafs.FileType.Directory:
                source.fs.delete_dir(info.path)


def build_index(
    output_uri: str,
    storage: StorageConfig | None = None,
    params: IndexParams | None = None,
    cfg: Config | None = None,
) -> dict[str, Any]:
    """Build the index of the committed run at ``output_uri`` and commit it (see the
    module docstring; ``cfg``'s ``[output]`` names an Iceberg warehouse's catalog);
    returns the pointer record."""
    source = SentencesSource.open(output_uri, storage, cfg)
    _check_folder(source)  # before anything is written there
    dim = source.require_embeddings()
    key = source.key()
    build = f"{uuid.uuid4().hex[:16]}.lance"
    path = f"{_folder(source)}/{build}"
    started = dt.datetime.now(dt.UTC)
    ds = _write_rows(source, path)
    rows = ds.count_rows()
    p = (params or IndexParams()).resolved(rows, dim)
    ds.create_index(
        EMBEDDING,
        "IVF_PQ",
        metric="cosine",
        num_partitions=p.partitions,
        num_sub_vectors=p.sub_vectors,
    )
    ds.create_scalar_index(TERMS, index_type="INVERTED", **FTS_PARAMS)
    if source.key() != key:
        raise RunFailed(
            f"{source.uri} changed while its index was built; nothing was committed. Run "
            "`docintel index` again once the output is settled"
        )
    record = {
        "format": INDEX_FORMAT,
        "path": build,
        "source": key,
        "run_id": source.manifest.get("run_id"),
        "rows": rows,
        "dim": dim,
        "params": asdict(p),
        "built": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "build_seconds": round((dt.datetime.now(dt.UTC) - started).total_seconds(), 3),
    }
    _commit(source, record, build)
    return {**record, "where": display_uri(source.fs, path)}  # for the command's message


# --- use -------------------------------------------------------------------------------------


@dataclass
class OpenIndex:
    dataset: Any  # lance.LanceDataset
    record: dict[str, Any]  # the pointer

    @property
    def params(self) -> IndexParams:
        return IndexParams(**self.record["params"])


def find(source: SentencesSource, mode: str = SEMANTIC) -> tuple[OpenIndex | None, str]:
    """The output's index if it exists, was built from the output as it is now and can
    rank by ``mode`` (an older build has no keyword index), and a line saying which path
    a search takes, and why."""
    where = _index_where(source)
    record = read_pointer(source)
    if record is None:
        return None, f"no index at {where}: exact scan (build one with `docintel index`)"
    if record.get("format") not in FORMATS:
        return None, f"the index at {where} is of another format: exact scan"
    if record.get("source") != source.key():
        return None, (
            f"the index at {where} was built before the output last changed: exact scan "
            "(rebuild it with `docintel index`)"
        )
    if needs_keyword(mode) and record["format"] != INDEX_FORMAT:
        return None, (
            f"the index at {where} has no keyword index (an older build): exact scan "
            "(rebuild it with `docintel index`, or search with --mode semantic)"
        )
    path = f"{_folder(source)}/{record['path']}"
    ds = _lance().dataset(_lance_uri(source, path), storage_options=_storage_options(source))
    p = IndexParams(**record["params"])  # checked by read_pointer
    full_text = " and full-text (BM25)" if needs_keyword(mode) else ""
    note = (
        f"searched the index {where}/{record['path']} (IVF-PQ, {p.partitions} partitions, "
        f"nprobes {p.nprobes}, refine x{p.refine_factor}{full_text})"
    )
    return OpenIndex(ds, record), note


def _nearest(
    index: OpenIndex, q: np.ndarray, k: int, filters: Filters, p: IndexParams
) -> list[dict[str, Any]]:
    """The dense ranking: the ``k`` nearest through IVF-PQ, with exact cosines."""
    nearest = {"column": EMBEDDING, "q": q, "k": k, "nprobes": p.nprobes}
    if p.refine_factor:
        nearest["refine_factor"] = p.refine_factor
    rows = index.dataset.to_table(
        columns=INDEX_COLUMNS,
        nearest=nearest,
        filter=filters.sql(),
        prefilter=True,
        disable_scoring_autoprojection=True,
    )
    if not rows.num_rows:
        return []
    sims = cosine(embedding_matrix(rows[EMBEDDING]), q[None, :])[:, 0]
    return to_hits(rows.select(list(HIT_COLUMNS)), sims)


def _full_text(
    index: OpenIndex, q: np.ndarray, text: str, k: int, filters: Filters
) -> list[dict[str, Any]]:
    """The keyword ranking: the ``k`` best by BM25 through the full-text index (the
    scores are Lance's, the exact scan's formula), with exact cosines."""
    from lance.query import MatchQuery

    terms = query_terms(text)
    if not terms:
        return []
    rows = index.dataset.to_table(
        columns=[*INDEX_COLUMNS, "_score"],
        full_text_query=MatchQuery(" ".join(terms), TERMS, fuzziness=0),
        filter=filters.sql(),
        prefilter=True,
        limit=k,
        disable_scoring_autoprojection=True,
    )
    rows = rows.filter(rows[EMBEDDING].is_valid())  # as the exact scan: no vector, no hit
    if not rows.num_rows:
        return []
    sims = cosine(embedding_matrix(rows[EMBEDDING]), q[None, :])[:, 0]
    scores = rows["_score"].to_numpy().astype(np.float64)
    return to_hits(rows.select(list(HIT_COLUMNS)), sims, scores)


def query(
    index: OpenIndex,
    vectors: np.ndarray,
    top: int,
    filters: Filters,
    params: IndexParams | None = None,
    *,
    texts: list[str] | None = None,
    mode: str = SEMANTIC,
) -> list[list[dict[str, Any]]]:
    """Each query's ``top`` hits through the index, ranked by ``mode`` as the exact scan
    ranks them (keyword and hybrid need the queries' ``texts``); similarities are the
    exact cosines of the candidates' stored vectors."""
    p = params or index.params
    queries = unit_rows(np.asarray(vectors, np.float32))
    pool = top if mode == SEMANTIC else pool_size(top)  # ties: the nearer
    out = []
    for j, q in enumerate(queries):
        dense = _nearest(index, q, pool, filters, p) if needs_dense(mode) else []
        keyword = (
            _full_text(index, q, (texts or [])[j], pool, filters) if needs_keyword(mode) else []
        )
        out.append(combine(dense, keyword, top, mode))
    return out
