"""`docintel search` and `docintel index`: options, help and printing only (the logic is
docintel.pipeline.search.query and docintel.pipeline.search.index)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from docintel.jobs.ui import ConfigOpt, console, fail, out, safe
from docintel.pipeline.config import load_config
from docintel.pipeline.errors import DocintelError
from docintel.pipeline.schema import UNLABELLED
from docintel.pipeline.untrusted import json_text

if TYPE_CHECKING:
    from docintel.pipeline.config import Config
    from docintel.pipeline.search.index import IndexParams
    from docintel.pipeline.search.query import SearchResult

OutputArg = Annotated[str, typer.Argument(help="A committed run's output: folder or s3://prefix.")]
QueryArg = Annotated[str | None, typer.Argument(help="The text to search for (or --queries FILE).")]
QueriesOpt = Annotated[
    Path | None,
    typer.Option(
        "--queries",
        help="UTF-8 text file, one query per line (blank lines skipped); default: none.",
        dir_okay=False,
    ),
]
TopOpt = Annotated[int, typer.Option("--top", help="Hits per query, 1 to 1,000.")]
LabelOpt = Annotated[
    str | None,
    typer.Option(
        "--label",
        help="Only sentences with this label (e.g. Bearish), or NAME.label for a label of "
        "the run's extra head NAME (--classifier); any case. Default: any label.",
    ),
]
MinScoreOpt = Annotated[
    float | None,
    typer.Option(
        "--min-score", help="Only sentences whose label score is >= X; default: any score."
    ),
]
DocIdOpt = Annotated[
    str | None,
    typer.Option("--doc-id", help="Only documents whose doc_id starts with PREFIX; default: all."),
]
EntityOpt = Annotated[
    str | None,
    typer.Option(
        "--entity",
        metavar="ID",
        help="Only sentences that name this watch-listed entity (its entity_id; the run was "
        "made with --watch-list); default: any sentence.",
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="JSON lines on stdout, one object per hit: doc_id, sent_index, text, label, "
        "score, similarity, bm25 (null: not a keyword hit) (and query first, when there "
        "are several queries).",
    ),
]
ExactOpt = Annotated[bool, typer.Option("--exact", help="Scan exactly; ignore any index.")]
ModeOpt = Annotated[
    str,
    typer.Option(
        "--mode",
        metavar="hybrid|semantic|keyword",
        help="The ranking: semantic (embedding cosine), keyword (BM25 on the words), or "
        "hybrid (both: 0.7 x the embedding's + 0.3 x the keyword's scaled scores).",
    ),
]


def search(
    output: OutputArg,
    query: QueryArg = None,
    queries: QueriesOpt = None,
    top: TopOpt = 10,
    label: LabelOpt = None,
    min_score: MinScoreOpt = None,
    doc_id: DocIdOpt = None,
    entity: EntityOpt = None,
    json_lines: JsonOpt = False,
    exact: ExactOpt = False,
    mode: ModeOpt = "hybrid",
    config: ConfigOpt = None,
) -> None:
    """Find the sentences of a committed run that best answer a query: by default hybrid,
    keyword relevance (BM25) fused with embedding similarity (cosine).

    The query is embedded with the encoder the run recorded in its manifest (a different
    installed encoder is refused, exit 2). Uses the index `docintel index` built when it
    matches the output as it is now, else an exact scan with bounded memory (stderr says
    which). A query longer than the encoder's token limit is truncated and flagged.
    --mode semantic ranks by the embedding alone, --mode keyword by BM25 alone.

    Examples:

      docintel search demo-out "going concern doubt"

      docintel search demo-out "material weakness" --label Bearish --json

      docintel search s3://bucket/run1 --queries watch.txt --doc-id 10-K/

      docintel search out/ "fraud investigation" --entity E0001234

      docintel search demo-out "staff cuts" --mode semantic
    """
    from docintel.pipeline.search.query import Filters, read_queries
    from docintel.pipeline.search.query import search as run_search

    try:
        texts = [query] if query is not None else []
        if queries is not None:
            texts += read_queries(queries)
        filters = Filters(label=label, min_score=min_score, doc_prefix=doc_id, entity_id=entity)
        cfg = load_config(config)
        result = run_search(output, texts, top, filters, cfg, exact=exact, mode=mode)
    except DocintelError as e:
        fail(e)
    _print_notes(result)
    if json_lines:
        _print_json(result)
    else:
        _print_tables(result)


def _print_notes(result: SearchResult) -> None:
    """stderr: the path and ranking taken, truncated queries, unlabelled hits."""
    console.print(f"docintel: {safe(result.note)}", markup=False, highlight=False)
    for i, (q, cut) in enumerate(zip(result.queries, result.truncated, strict=True), 1):
        if cut:
            console.print(
                f"[yellow]warning:[/] query {i} ({escape(safe(q[:60]))}...) is longer than "
                f"the encoder's {result.max_length} tokens: truncated, as sentences are",
                highlight=False,
            )
    unlabelled = sum(h["label"] is None for hits in result.hits for h in hits)
    if unlabelled:  # sentences in a language the run's model was not trained on
        console.print(
            f"docintel: {unlabelled} of {sum(map(len, result.hits))} hits are unlabelled "
            "(a language the model was not trained on: null label and score)",
            markup=False, highlight=False,
        )  # fmt: skip


def _print_json(result: SearchResult) -> None:
    several = len(result.queries) > 1
    for q, hits in zip(result.queries, result.hits, strict=True):
        for hit in hits:
            row: dict[str, Any] = {"query": q, **hit} if several else hit
            sys.stdout.write(json_text(row) + "\n")  # controls as \u escapes
    sys.stdout.flush()


def _one_line(text: str) -> str:
    """A sentence for the table: its newlines and tabs as spaces (a sentence split across
    lines in the source is one sentence), then control characters escaped (``safe``)."""
    return safe(_BREAKS.sub(" ", text))


_BREAKS = re.compile(r"[\r\n\t]+")


def _print_tables(result: SearchResult) -> None:
    """One table per query that stays readable at 80 columns: no vertical rules, the
    numbers never wrap, the doc id gets at most a fifth of the width (folded past it),
    and the text column the rest, wrapped at word boundaries."""
    for q, hits in zip(result.queries, result.hits, strict=True):
        title = Text(safe(q)).append(f"  ({result.mode})", style="dim")
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, padding=(0, 1, 0, 0))  # fmt: skip
        t.add_column("#", justify="right", no_wrap=True)
        t.add_column("similarity", justify="right", no_wrap=True)
        keyword = any(h.get("bm25") is not None for h in hits)  # else no bm25 column
        if keyword:
            t.add_column("bm25", justify="right", no_wrap=True)
        t.add_column("label", max_width=12, overflow="fold")
        t.add_column("score", justify="right", no_wrap=True)
        t.add_column("doc_id", overflow="fold", max_width=max(12, out.width // 5))
        t.add_column("sent", justify="right", no_wrap=True)
        t.add_column("text", overflow="fold", ratio=1)
        for n, h in enumerate(hits, 1):
            bm25 = h.get("bm25")  # absent or null: not a keyword hit
            t.add_row(
                str(n), f"{h['similarity']:.4f}",
                *(["" if bm25 is None else f"{bm25:.2f}"] if keyword else []),
                Text(safe(h["label"] or UNLABELLED)),
                "" if h["score"] is None else f"{h['score']:.3f}",
                Text(safe(h["doc_id"])), str(h["sent_index"]), Text(_one_line(h["text"])),
            )  # fmt: skip
        if not hits:
            t.caption = "no sentence matches the filters"
        out.print(t)


PartitionsOpt = Annotated[
    int, typer.Option(help="IVF partitions; 0 = auto (sqrt(sentences) / 2).", min=0)
]
SubVectorsOpt = Annotated[
    int, typer.Option(help="PQ sub-vectors; 0 = auto (embedding size / 8).", min=0)
]
NprobesOpt = Annotated[
    int, typer.Option(help="Partitions a query searches; 0 = auto (40 %, at least 8).", min=0)
]
RefineOpt = Annotated[
    int, typer.Option(help="Candidates re-ranked exactly: top x this factor.", min=0)
]
IndexRayOpt = Annotated[
    str | None,
    typer.Option(
        help="Build as one Ray task on this cluster ('auto' or ray://host:10001); the "
        "output must be s3:// or a path every node sees. Default: build here."
    ),
]


def index(
    output: OutputArg,
    partitions: PartitionsOpt = 0,
    sub_vectors: SubVectorsOpt = 0,
    nprobes: NprobesOpt = 0,
    refine_factor: RefineOpt = 10,
    ray_address: IndexRayOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Build the indexes `docintel search` uses: Lance IVF-PQ (cosine) over the run's
    embeddings and a full-text (BM25) index over its sentences' words, in OUTPUT/_index/.

    The build is committed last (OUTPUT/_index/current.json, atomically): a half-built
    index is never used, and a failed build is simply run again. The index records the
    output it was built from; once the output changes, search ignores it (exact scan)
    until it is rebuilt.

    Examples:

      docintel index demo-out

      docintel index s3://bucket/run1 --ray-address auto
    """
    from docintel.pipeline.search.index import IndexParams, build_index

    params = IndexParams(partitions, sub_vectors, nprobes, refine_factor)
    try:
        cfg = load_config(config)
        if ray_address:
            record = build_on_ray(ray_address, output, cfg, params)
        else:
            record = build_index(output, cfg.storage, params, cfg)
    except DocintelError as e:
        fail(e)
    p = record["params"]
    out.print(
        f"indexed {record['rows']:,} sentences of run {safe(record['run_id'])} in "
        f"{record['build_seconds']:.1f} s: {safe(record['where'])} "
        f"(IVF-PQ, {p['partitions']} partitions, {p['sub_vectors']} sub-vectors; "
        f"search probes {p['nprobes']}, refine x{p['refine_factor']}; full-text BM25)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def build_on_ray(address: str, output_uri: str, cfg: Config, params: IndexParams) -> dict[str, Any]:
    """docintel.pipeline.search.index.build_index as one Ray task on the cluster at
    ``address`` (or the Ray this process already runs), with every CPU of the smallest
    node (Lance trains IVF-PQ on native threads); not retried: a failed build is rerun."""
    import ray

    from docintel.pipeline.search.index import build_index

    if not ray.is_initialized():
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    alive = [n.get("Resources", {}).get("CPU", 1.0) for n in ray.nodes() if n.get("Alive")]
    cpus = max(1.0, min(alive, default=1.0))
    task = ray.remote(num_cpus=cpus, max_retries=0)(build_index)
    return ray.get(task.remote(output_uri, cfg.storage, params, cfg))
