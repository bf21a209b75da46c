"""Reading a committed run and building the audit report: ``report.json`` (and, through
html.py, ``report.html``).

``write_report`` reads one committed docintel run (its documents, sentences and errors and
its ``_manifest.json``, through tables.py: a Parquet run folder or one run's rows of
Iceberg tables) and writes, into the run folder (the night's partition), what an auditor
reads the next morning: counts, the label distribution, the highest-risk sentences, the
trend of label shares over the previous audits, how much work the GPU and the int8 CPU
replicas did, throughput and the errors. The JSON is the record that later audits' trend
charts are built from; the HTML (rendered from the same dict by html.py) is one file that
opens offline in any browser.

Memory stays small whatever the run's size: tables are read record batch by record batch,
only the columns needed (never the embedding), the top-N sentences are a running
selection, and the review keeps a few numbers per document in Arrow (review.py), so the
sentences table is never held whole nor turned into Python objects.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from docintel.pipeline.errors import ConfigError, InputError, UsageError
from docintel.pipeline.formats.parquet import ParquetRun
from docintel.pipeline.labels import LabelRef, label_columns, resolve_labels, risk_of, run_heads
from docintel.pipeline.output.sink import atomic_write
from docintel.pipeline.output.tables import RunTables
from docintel.pipeline.report.entities import (
    ENTITIES,
    ENTITIES_CSV,
    EntityRisk,
    entities_csv,
    no_entities,
    screened,
)
from docintel.pipeline.report.html import render_html
from docintel.pipeline.report.keys import NO_TOP_LABEL, REQUIRED_AUDIT_KEYS, SHARE_KEYS
from docintel.pipeline.report.review import (
    CHANGES_CSV,
    REVIEW_CSV,
    DocScores,
    changes_csv,
    review_csv,
    review_sections,
)
from docintel.pipeline.schema import DOC_ID, LABEL, N_TOKENS, SCORE, SENT_INDEX, TEXT, UNLABELLED
from docintel.pipeline.untrusted import json_text

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
REPORT_VERSION = 1  # bump when a key that trend-building reads changes meaning

ERROR_SAMPLES = 5  # error rows shown verbatim: enough to see the pattern, not a dump
MESSAGE_CHARS = 300  # error messages are cut here in the report (the table has them whole)

# Backend names as recorded by the stages (pipeline/stages/base.py, embed.py,
# embed_int8.py), mapped onto the share families of keys.SHARE_KEYS.
GPU_PREFIX = "gpu-"  # gpu-fp16, gpu-bf16, gpu-sim (a logical GPU without CUDA)
CPU_INT8 = "cpu-int8"
READ_BATCH_ROWS = 16_384  # rows per record batch: bounds memory on huge files


def write_report(
    fs: pafs.FileSystem,
    run_root: str,
    audit: dict,
    history: list[dict],
    risk_label: str | Sequence[str],
    top_n: int,
    tables: RunTables | None = None,
) -> dict:
    """Build the report of the run in ``run_root``, write report.json and report.html there.

    ``tables``: where the run's rows are, when not in ``run_root`` as Parquet output (an
    audit with Iceberg output: its run's rows of the warehouse's tables).

    ``risk_label``: the risk label, or several (``[audit] risk_labels``: ``NAME.label``
    for an extra head's), matched case-insensitively against the run's heads.

    ``audit`` describes the night (date, run id, new/changed/removed/unchanged counts,
    whether anything ran); ``history`` holds earlier nights' returned dicts, oldest first,
    for the trend. Returns the dict written as report.json. Both files are written
    atomically, so a reader never sees half a report.
    """
    if top_n < 1:
        raise ConfigError(f"[audit] top_n is {top_n}; set it to 1 or more")
    missing = [k for k in REQUIRED_AUDIT_KEYS if k not in audit]
    if missing:
        raise UsageError(f"audit dict for {run_root} lacks {missing}; pass at least date and ran")
    root = run_root.rstrip("/") or "/"
    report = build_report(tables or ParquetRun(fs, root), audit, history, risk_label, top_n)
    ranked = report.pop("_ranked")
    entities_ranked = report.pop("_entities_ranked", None)
    # Round-trip through JSON so the returned dict is exactly what report.json holds
    # (datetimes in the audit dict become ISO strings in both).
    # Control characters of document text are \u escapes in the file (json_text).
    text = json_text(report, indent=2, default=_json_default)
    report = json.loads(text)
    if not isinstance(fs, pafs.S3FileSystem):
        # Nothing ran: the partition folder may not exist yet. Object stores need none.
        fs.create_dir(root, recursive=True)
    atomic_write(fs, f"{root}/{REVIEW_CSV}", review_csv(ranked, report["review"]))
    atomic_write(fs, f"{root}/{CHANGES_CSV}", changes_csv(report.get("changes") or {}))
    if entities_ranked is not None:  # a run screened against watch lists
        csv = entities_csv(entities_ranked, report[ENTITIES])
        atomic_write(fs, f"{root}/{ENTITIES_CSV}", csv)
    atomic_write(fs, f"{root}/{REPORT_JSON}", text.encode())
    atomic_write(fs, f"{root}/{REPORT_HTML}", render_html(report).encode())
    return report


def _json_default(value: object) -> str:
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return str(value)


# --- reading the run ---------------------------------------------------------------------


def build_report(
    tables: RunTables,
    audit: dict,
    history: list[dict],
    risk_label: str | Sequence[str],
    top_n: int,
) -> dict[str, Any]:
    """The report dict (not yet written): the audit's fields plus what the tables hold."""
    report: dict[str, Any] = dict(audit)
    risk = [risk_label] if isinstance(risk_label, str) else list(risk_label)
    report.update(
        report_version=REPORT_VERSION,
        generated=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        risk_label=", ".join(risk),  # as the night's config wrote them; resolved below
        risk_labels=risk,
        top_n=top_n,
    )
    if audit["ran"]:
        manifest = tables.manifest()
        if manifest is None:
            raise InputError(
                f"{tables.manifest_uri} is missing: the run {tables.uri} is not committed, "
                "so there is nothing to report yet; finish (or resume) the run first"
            )
        previous = history[-1] if history else None
        changes = audit.get("changes")
        report.update(_run_sections(tables, manifest, risk, top_n, changes, previous))
        report["risk_label"] = ", ".join(report["risk_labels"])  # as the heads name them
        new_mentions = report.pop("_entity_changes", None)
        if new_mentions is not None and report.get("changes") is not None:
            report["changes"] = {**report["changes"], **new_mentions}
    else:
        report.update(_empty_sections())
        report["_ranked"] = DocScores([]).ranked(audit.get("changes"))
    report["trend"] = _trend(history, report)
    return report


def _empty_sections() -> dict[str, Any]:
    """A night on which nothing was processed: every count is zero (the keys of a night
    that ran, so that readers of report.json need no special case)."""
    return {
        "labels": [],
        "heads": [],
        "counts": {"documents": 0, "sentences": 0, "errors": 0, "tokens": 0, "unlabelled": 0},
        "documents_by_status": {},
        "label_distribution": {},
        "label_shares": {},
        "top_label_distribution": {},
        "top_risk": [],
        "review": [],
        "review_total": 0,
        "drilldown": [],
        "backends": {},
        "backend_share": {},
        "resumed_batches": 0,
        "throughput": {},
        "errors": {"count": 0, "by_stage": {}, "by_type": [], "samples": []},
        "partial": False,
        "skipped_files": [],
        "warnings": [],
        **no_entities(),
    }


def _run_sections(
    tables: RunTables,
    manifest: dict[str, Any],
    risk_labels: list[str],
    top_n: int,
    changes: dict[str, Any] | None,
    previous: dict[str, Any] | None,
) -> dict[str, Any]:
    """The sections of a night that ran; ``previous``: the previous audit's report."""
    labels = list(manifest.get("labels", []))
    risk = _risk(manifest, risk_labels, tables.uri)
    scores = DocScores(risk)
    docs = _documents(tables, scores)
    named = EntityRisk(risk, changes) if screened(tables) else None
    sents = _sentences(tables, risk, top_n, scores, named)
    ranked = scores.ranked(changes)
    errs = _errors(tables)
    label_counts, unlabelled = _label_distribution(labels, sents["label_counts"])
    n_sent = sents["sentences"]
    counts = {
        "documents": docs["documents"],
        "sentences": n_sent,
        "errors": errs["count"],
        "tokens": sents["tokens"],
        "unlabelled": unlabelled,
    }
    heads = manifest.get("heads") or []
    warnings = list(manifest.get("warnings", []))
    for key, value in manifest.get("counts", {}).items():
        if key in counts and value != counts[key]:
            warnings.append(
                f"the manifest says {value:,} {key} but the tables hold {counts[key]:,}"
            )
    backends = {s: dict(b) for s, b in manifest.get("backends", {}).items()}
    return {
        "labels": labels,
        # the run's extra heads ([classify.heads]) and the risk labels as resolved
        "heads": [{k: h.get(k) for k in ("name", "labels", "version")} for h in heads],
        "risk_labels": [str(r) for r in risk],
        "counts": counts,
        "documents_by_status": docs["by_status"],
        "label_distribution": label_counts,
        "label_shares": {lb: (c / n_sent if n_sent else None) for lb, c in label_counts.items()},
        "top_label_distribution": docs["top_labels"],
        "top_risk": sents["top_risk"],
        **review_sections(tables, ranked, risk, top_n),
        "_ranked": ranked,  # popped by write_report: review.csv, not report.json
        "backends": backends,
        "backend_share": _backend_share(backends, manifest.get("stages", [])),
        "resumed_batches": int(manifest.get("resumed_batches", 0)),
        "throughput": _throughput(manifest.get("timings", {}), counts),
        "errors": errs,
        "partial": bool(manifest.get("partial", False)),
        "skipped_files": list(manifest.get("skipped_files", [])),
        "warnings": warnings,
        **(named.result(tables, previous) if named else no_entities()),
    }


def _risk(manifest: dict[str, Any], risk_labels: list[str], uri: str) -> list[LabelRef]:
    """The risk labels as labels of the run's heads (ConfigError, exit 2, if one is not)."""
    try:
        return resolve_labels(risk_labels, run_heads(manifest), "[audit] risk_label")
    except UsageError as e:
        raise ConfigError(
            f"{e} (the heads that made {uri}); set [audit] risk_label or risk_labels to some "
            "of them"
        ) from e


def _label_distribution(labels: list[str], found: dict[str, int]) -> tuple[dict[str, int], int]:
    """The sentences per label of ``labels`` (a label ``found`` that the manifest does not
    name is appended to ``labels``: still counted) with (unlabelled) beside them, never one
    of them; and the unlabelled count."""
    unlabelled = found.get(UNLABELLED, 0)
    for lb in found:
        if lb not in labels and lb != UNLABELLED:
            labels.append(lb)  # a label the manifest does not name: still counted
    label_counts = {lb: found.get(lb, 0) for lb in labels}
    if unlabelled:
        label_counts[UNLABELLED] = unlabelled
    return label_counts, unlabelled


def _value_counts(values: pa.Array, null: str = NO_TOP_LABEL) -> Counter[str]:
    """Each value's count; nulls counted under ``null``."""
    return Counter(
        {
            (null if v["values"] is None else v["values"]): v["counts"]
            for v in pc.value_counts(values).to_pylist()
        }
    )


def _documents(tables: RunTables, scores: DocScores) -> dict[str, Any]:
    n = 0
    status: Counter[str] = Counter()
    top: Counter[str] = Counter()
    for b in tables.batches("documents", [DOC_ID, "status", "top_label"], rows=READ_BATCH_ROWS):
        n += b.num_rows
        scores.add_documents(b)
        status.update(_value_counts(b.column("status")))
        top.update(_value_counts(b.column("top_label")))
    ordered = sorted(top.items(), key=lambda kv: (kv[0] == NO_TOP_LABEL, kv[0]))
    return {"documents": n, "by_status": dict(sorted(status.items())), "top_labels": dict(ordered)}


TOP_SORT = [(SCORE, "descending"), (DOC_ID, "ascending"), (SENT_INDEX, "ascending")]


def _sentences(
    tables: RunTables,
    risk: list[LabelRef],
    top_n: int,
    scores: DocScores,
    named: EntityRisk | None = None,
) -> dict[str, Any]:
    """Counts per label, tokens, a running top-N of the risk labels' sentences by score
    (the probability of the risk labels they have), the per-document sums of ``scores``
    and, for a screened run, the entities' (``named``)."""
    cols = [DOC_ID, SENT_INDEX, TEXT, *label_columns(risk), N_TOKENS]
    cols += [ENTITIES] if named else []
    n = tokens = 0
    labels: Counter[str] = Counter()
    best: pa.Table | None = None  # at most top_n rows at any time
    for b in tables.batches("sentences", cols, rows=READ_BATCH_ROWS):
        n += b.num_rows
        scores.add_sentences(b)
        if named is not None:
            named.add(b)
        tokens += int(pc.sum(b.column(N_TOKENS)).as_py() or 0)
        # a null label (a language the model was not trained on) is counted as UNLABELLED
        labels.update(_value_counts(b.column(LABEL), UNLABELLED))
        mask, mass = risk_of(b, risk)
        if not mask.any():
            continue
        risky = pa.table([b.column(DOC_ID), b.column(SENT_INDEX), b.column(TEXT), mass],
                         names=[DOC_ID, SENT_INDEX, TEXT, SCORE]).filter(mask)  # fmt: skip
        pool = risky if best is None else pa.concat_tables([best, risky])
        best = pool.take(pc.sort_indices(pool, sort_keys=TOP_SORT)[:top_n])
    top = [
        {
            "doc_id": r[DOC_ID],
            "sent_index": r[SENT_INDEX],
            "text": r[TEXT],
            "score": round(r[SCORE], 6),
        }
        for r in (best.select([DOC_ID, SENT_INDEX, TEXT, SCORE]).to_pylist() if best else [])
    ]
    return {"sentences": n, "tokens": tokens, "label_counts": labels, "top_risk": top}


def _errors(tables: RunTables) -> dict[str, Any]:
    n = 0
    by_type: Counter[tuple[str, str]] = Counter()
    samples: list[dict[str, str]] = []
    for b in tables.batches(
        "errors", [DOC_ID, "stage", "error_type", "message"], rows=READ_BATCH_ROWS
    ):
        n += b.num_rows
        if b.num_rows == 0:
            continue
        grouped = (
            pa.Table.from_batches([b])
            .group_by(["stage", "error_type"])
            .aggregate([(DOC_ID, "count")])
        )
        for r in grouped.to_pylist():
            by_type[(r["stage"], r["error_type"])] += r[f"{DOC_ID}_count"]
        if len(samples) < ERROR_SAMPLES:
            for r in b.slice(0, ERROR_SAMPLES - len(samples)).to_pylist():
                msg = r["message"]
                if len(msg) > MESSAGE_CHARS:
                    msg = msg[: MESSAGE_CHARS - 1] + "…"
                samples.append({**r, "message": msg})
    by_stage: Counter[str] = Counter()
    for (stage, _), c in by_type.items():
        by_stage[stage] += c
    return {
        "count": n,
        "by_stage": dict(sorted(by_stage.items())),
        "by_type": [
            {"stage": s, "error_type": t, "count": c}
            for (s, t), c in sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "samples": samples,
    }


def _backend_family(backend: str) -> str:
    if backend.startswith(GPU_PREFIX):
        return "gpu"
    return "cpu_int8" if backend == CPU_INT8 else "cpu_other"


def _backend_share(
    backends: dict[str, dict[str, int]], stages: list[str]
) -> dict[str, dict[str, float | int]]:
    """Per stage: batches served, and the share of them on GPU, CPU int8 and other CPU.

    In chain order: the manifest's ``stages`` (older manifests have none), then any other
    stage in the order the manifest recorded its backends."""
    out: dict[str, dict[str, float | int]] = {}
    for stage in dict.fromkeys([*stages, *backends]):
        served = backends.get(stage, {})
        total = sum(served.values())
        if not total:
            continue
        fam: Counter[str] = Counter()
        for backend, batches in served.items():
            fam[_backend_family(backend)] += batches
        out[stage] = {"batches": total, **{k: fam[k] / total for k in SHARE_KEYS}}
    return out


def _throughput(timings: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
    wall = float(timings.get("wall_seconds") or 0.0)
    proc = float(timings.get("processing_seconds") or 0.0)

    def rate(n: int, seconds: float) -> float | None:
        return n / seconds if seconds > 0 else None

    return {
        "wall_seconds": wall,
        "startup_seconds": float(timings.get("startup_seconds") or 0.0),
        "processing_seconds": proc,
        "documents_per_s": rate(counts["documents"], wall),
        "sentences_per_s": rate(counts["sentences"], wall),
        "tokens_per_s": rate(counts["tokens"], wall),
        "sentences_per_processing_s": rate(counts["sentences"], proc),
        "stage_seconds": dict(timings.get("stage_seconds") or {}),
    }


def _trend(history: list[dict], current: dict[str, Any]) -> list[dict[str, Any]]:
    """One point per audit, oldest first, ending with tonight's."""
    points = []
    for i, h in enumerate([*history, current]):
        absent = [k for k in ("date", "ran", "label_shares", "counts") if k not in h]
        if absent:
            raise UsageError(
                f"history[{i}] lacks {absent}: the trend is built from dicts returned by "
                "write_report (or read from earlier nights' report.json)"
            )
        corpus = h.get("corpus")
        points.append(
            {
                "date": str(h["date"]),
                "run_id": h.get("run_id"),
                "ran": bool(h["ran"]),
                "documents": int(h["counts"].get("documents", 0)),
                "sentences": int(h["counts"].get("sentences", 0)),
                "shares": dict(h["label_shares"]),
                # the whole corpus after the night (latest/), when the audit recorded it
                "corpus": None
                if not corpus
                else {
                    "documents": int(corpus["documents"]),
                    "sentences": int(corpus["sentences"]),
                    "shares": dict(corpus["label_shares"]),
                },
            }
        )
    return points
