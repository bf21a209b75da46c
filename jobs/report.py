"""The nightly audit's report: ``report.json`` and a self-contained ``report.html``.

``write_report`` reads one committed docintel run (documents/, sentences/, errors/ and
``_manifest.json``) and writes, beside it, what an auditor reads the next morning: counts,
the label distribution, the highest-risk sentences, the trend of label shares over the
previous audits, how much work the GPU and the int8 CPU replicas did, throughput and the
errors. The JSON is the record that later audits' trend charts are built from; the HTML is
one file that opens offline in any browser (inline CSS, charts as inline SVG, no scripts,
no external URLs), because reports are mailed, archived and opened on locked-down machines.

Memory stays flat whatever the run's size: tables are read record batch by record batch,
only the columns needed (never the embedding), and the top-N sentences are a running
selection, so the whole sentences table is never turned into Python objects.
"""

from __future__ import annotations

import datetime as dt
import html
import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.errors import ConfigError, InputError, UsageError
from pipeline.schema import DOC_ID, LABEL, N_TOKENS, SCORE, SENT_INDEX, STAGES, TEXT
from pipeline.sink import MANIFEST, atomic_write, read_manifest

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
REPORT_VERSION = 1  # bump when a key that trend-building reads changes meaning

READ_BATCH_ROWS = 16_384  # rows per record batch: bounds memory on huge part files
ERROR_SAMPLES = 5  # error rows shown verbatim: enough to see the pattern, not a dump
MESSAGE_CHARS = 300  # error messages are cut here in the report (the table has them whole)
NO_TOP_LABEL = "(no sentences)"  # documents whose top_label is null (empty or failed)

# The audit dict keys the report cannot do without; the others are shown when present.
REQUIRED_AUDIT_KEYS = ("date", "ran")
AUDIT_COUNTS = ("new", "changed", "removed", "unchanged")

# Backend families for the GPU-vs-CPU share: names as recorded by the stages
# (pipeline/stages/base.py, embed.py, embed_int8.py).
GPU_PREFIX = "gpu-"  # gpu-fp16, gpu-bf16, gpu-sim (a logical GPU without CUDA)
CPU_INT8 = "cpu-int8"
SHARE_KEYS = ("gpu", "cpu_int8", "cpu_other")
SHARE_NAMES = {"gpu": "GPU", "cpu_int8": "CPU int8", "cpu_other": "CPU fp32"}

# One colour per label/family, stable across charts and nights (matplotlib's tab10).
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
SHARE_COLOURS = {"gpu": "#2ca02c", "cpu_int8": "#1f77b4", "cpu_other": "#bbbbbb"}


def write_report(
    fs: pafs.FileSystem,
    run_root: str,
    audit: dict,
    history: list[dict],
    risk_label: str,
    top_n: int,
) -> dict:
    """Build the report of the run in ``run_root``, write report.json and report.html there.

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
    report = build_report(fs, root, audit, history, risk_label, top_n)
    # Round-trip through JSON so the returned dict is exactly what report.json holds
    # (datetimes in the audit dict become ISO strings in both).
    text = json.dumps(report, indent=2, default=_json_default, ensure_ascii=False)
    report = json.loads(text)
    if not isinstance(fs, pafs.S3FileSystem):
        # Nothing ran: the partition folder may not exist yet. Object stores need none.
        fs.create_dir(root, recursive=True)
    atomic_write(fs, f"{root}/{REPORT_JSON}", text.encode())
    atomic_write(fs, f"{root}/{REPORT_HTML}", render_html(report).encode())
    return report


def _json_default(value: object) -> str:
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return str(value)


# --- reading the run ---------------------------------------------------------------------


def build_report(
    fs: pafs.FileSystem,
    root: str,
    audit: dict,
    history: list[dict],
    risk_label: str,
    top_n: int,
) -> dict[str, Any]:
    """The report dict (not yet written): the audit's fields plus what the tables hold."""
    report: dict[str, Any] = dict(audit)
    report.update(
        report_version=REPORT_VERSION,
        generated=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        risk_label=risk_label,
        top_n=top_n,
    )
    if audit["ran"]:
        manifest = read_manifest(fs, root)
        if manifest is None:
            raise InputError(
                f"{root}/{MANIFEST} is missing: the run in {root} is not committed, so "
                "there is nothing to report yet; finish (or resume) the run first"
            )
        report.update(_run_sections(fs, root, manifest, risk_label, top_n))
    else:
        report.update(_empty_sections())
    report["trend"] = _trend(history, report)
    return report


def _empty_sections() -> dict[str, Any]:
    """A night on which nothing was processed: every count is zero."""
    return {
        "labels": [],
        "counts": {"documents": 0, "sentences": 0, "errors": 0, "tokens": 0},
        "documents_by_status": {},
        "label_distribution": {},
        "label_shares": {},
        "top_label_distribution": {},
        "top_risk": [],
        "backends": {},
        "backend_share": {},
        "resumed_batches": 0,
        "throughput": {},
        "errors": {"count": 0, "by_stage": {}, "by_type": [], "samples": []},
        "partial": False,
        "skipped_files": [],
        "warnings": [],
    }


def _run_sections(
    fs: pafs.FileSystem, root: str, manifest: dict[str, Any], risk_label: str, top_n: int
) -> dict[str, Any]:
    labels = list(manifest.get("labels", []))
    if risk_label not in labels:
        raise ConfigError(
            f"[audit] risk_label {risk_label!r} is not a label of the classifier that made "
            f"{root} (its labels: {', '.join(labels)}); set [audit] risk_label to one of them"
        )
    docs = _documents(fs, root)
    sents = _sentences(fs, root, risk_label, top_n)
    errs = _errors(fs, root)
    for lb in sents["label_counts"]:
        if lb not in labels:
            labels.append(lb)  # a label the manifest does not name: still counted
    label_counts = {lb: sents["label_counts"].get(lb, 0) for lb in labels}
    n_sent = sents["sentences"]
    counts = {
        "documents": docs["documents"],
        "sentences": n_sent,
        "errors": errs["count"],
        "tokens": sents["tokens"],
    }
    warnings = list(manifest.get("warnings", []))
    for key, value in manifest.get("counts", {}).items():
        if key in counts and value != counts[key]:
            warnings.append(
                f"the manifest says {value:,} {key} but the tables hold {counts[key]:,}"
            )
    backends = {s: dict(b) for s, b in manifest.get("backends", {}).items()}
    return {
        "labels": labels,
        "counts": counts,
        "documents_by_status": docs["by_status"],
        "label_distribution": label_counts,
        "label_shares": {lb: (c / n_sent if n_sent else None) for lb, c in label_counts.items()},
        "top_label_distribution": docs["top_labels"],
        "top_risk": sents["top_risk"],
        "backends": backends,
        "backend_share": _backend_share(backends),
        "resumed_batches": int(manifest.get("resumed_batches", 0)),
        "throughput": _throughput(manifest.get("timings", {}), counts),
        "errors": errs,
        "partial": bool(manifest.get("partial", False)),
        "skipped_files": list(manifest.get("skipped_files", [])),
        "warnings": warnings,
    }


def _part_files(fs: pafs.FileSystem, root: str, table: str) -> list[str]:
    """The committed part files of one table (hidden temporaries skipped), sorted."""
    sel = pafs.FileSelector(f"{root}/{table}", allow_not_found=True)
    return sorted(
        i.path
        for i in fs.get_file_info(sel)
        if i.type == pafs.FileType.File
        and i.base_name.startswith("part-")
        and i.base_name.endswith(".parquet")
    )


def _batches(
    fs: pafs.FileSystem, root: str, table: str, columns: list[str]
) -> Iterator[pa.RecordBatch]:
    """Record batches of ``columns`` from every part of ``table``, one file open at a time."""
    for path in _part_files(fs, root, table):
        with fs.open_input_file(path) as f:
            pf = pq.ParquetFile(f)
            absent = [c for c in columns if c not in pf.schema_arrow.names]
            if absent:
                raise InputError(
                    f"{path} has no column(s) {absent}: it is not a docintel {table} part "
                    f"(see pipeline/schema.py); remove it from {root}/{table}"
                )
            yield from pf.iter_batches(batch_size=READ_BATCH_ROWS, columns=columns)


def _value_counts(values: pa.Array) -> Counter[str]:
    return Counter(
        {
            (NO_TOP_LABEL if v["values"] is None else v["values"]): v["counts"]
            for v in pc.value_counts(values).to_pylist()
        }
    )


def _documents(fs: pafs.FileSystem, root: str) -> dict[str, Any]:
    n = 0
    status: Counter[str] = Counter()
    top: Counter[str] = Counter()
    for b in _batches(fs, root, "documents", [DOC_ID, "status", "top_label"]):
        n += b.num_rows
        status.update(_value_counts(b.column("status")))
        top.update(_value_counts(b.column("top_label")))
    ordered = sorted(top.items(), key=lambda kv: (kv[0] == NO_TOP_LABEL, kv[0]))
    return {"documents": n, "by_status": dict(sorted(status.items())), "top_labels": dict(ordered)}


TOP_SORT = [(SCORE, "descending"), (DOC_ID, "ascending"), (SENT_INDEX, "ascending")]


def _sentences(fs: pafs.FileSystem, root: str, risk_label: str, top_n: int) -> dict[str, Any]:
    """Counts per label, tokens, and a running top-N of the risk label by score."""
    cols = [DOC_ID, SENT_INDEX, TEXT, LABEL, SCORE, N_TOKENS]
    n = tokens = 0
    labels: Counter[str] = Counter()
    best: pa.Table | None = None  # at most top_n rows at any time
    for b in _batches(fs, root, "sentences", cols):
        n += b.num_rows
        tokens += int(pc.sum(b.column(N_TOKENS)).as_py() or 0)
        labels.update(_value_counts(b.column(LABEL)))
        risky = pa.Table.from_batches([b]).filter(pc.equal(b.column(LABEL), risk_label))
        if risky.num_rows == 0:
            continue
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


def _errors(fs: pafs.FileSystem, root: str) -> dict[str, Any]:
    n = 0
    by_type: Counter[tuple[str, str]] = Counter()
    samples: list[dict[str, str]] = []
    for b in _batches(fs, root, "errors", [DOC_ID, "stage", "error_type", "message"]):
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


def _backend_share(backends: dict[str, dict[str, int]]) -> dict[str, dict[str, float | int]]:
    """Per stage: batches served, and the share of them on GPU, CPU int8 and other CPU."""
    out: dict[str, dict[str, float | int]] = {}
    for stage in [*STAGES, *sorted(set(backends) - set(STAGES))]:
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
        points.append(
            {
                "date": str(h["date"]),
                "run_id": h.get("run_id"),
                "ran": bool(h["ran"]),
                "sentences": int(h["counts"].get("sentences", 0)),
                "shares": dict(h["label_shares"]),
            }
        )
    return points


# --- charts --------------------------------------------------------------------------------

_SVG_RC = {
    "svg.fonttype": "path",  # glyphs as paths: no font files or font names needed offline
    "text.parse_math": False,  # a label like "$AAPL$" is text, not mathtext
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def _svg(fig: Any) -> str:
    """A matplotlib figure as an inline <svg> element (no XML prolog, no metadata)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.DOTALL)


def _figure(width: float, height: float) -> Any:
    # Figure() without pyplot: no GUI backend or global state; savefig(format="svg")
    # renders with matplotlib's SVG backend, whatever backend is configured.
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _colour(labels: list[str], label: str) -> str:
    return PALETTE[labels.index(label) % len(PALETTE)]


def label_chart(report: dict[str, Any]) -> str:
    import matplotlib as mpl

    dist = report["label_distribution"]
    labels = list(dist)
    total = sum(dist.values()) or 1
    with mpl.rc_context(_SVG_RC):
        fig = _figure(7, 0.45 * len(labels) + 0.9)
        ax = fig.add_subplot()
        ys = range(len(labels))
        ax.barh(list(ys), [dist[lb] for lb in labels], color=[_colour(labels, lb) for lb in labels])
        ax.set_yticks(list(ys), labels)
        ax.invert_yaxis()
        for y, lb in zip(ys, labels, strict=True):
            ax.annotate(
                f" {dist[lb]:,} ({dist[lb] / total:.1%})",
                (dist[lb], y),
                va="center",
                fontsize=8,
            )
        ax.set_xlabel("sentences")
        ax.margins(x=0.2)
        return _svg(fig)


def trend_chart(report: dict[str, Any]) -> str:
    import matplotlib as mpl

    points = report["trend"]
    labels = list(report["labels"])
    for p in points:
        labels += [lb for lb in p["shares"] if lb not in labels]
    xs = list(range(len(points)))
    with mpl.rc_context(_SVG_RC):
        fig = _figure(7, 3)
        ax = fig.add_subplot()
        for lb in labels:
            ys = [100 * s if (s := p["shares"].get(lb)) is not None else math.nan for p in points]
            ax.plot(xs, ys, marker="o", markersize=4, label=lb, color=_colour(labels, lb))
        ax.set_xticks(xs, [p["date"] for p in points], rotation=45, ha="right")
        ax.set_ylabel("share of sentences (%)")
        ax.set_ylim(0, 100)
        if len(xs) == 1:
            ax.set_xlim(-1, 1)
        if labels:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
        return _svg(fig)


def backend_chart(report: dict[str, Any]) -> str:
    import matplotlib as mpl

    share = report["backend_share"]
    stages = list(share)
    with mpl.rc_context(_SVG_RC):
        fig = _figure(7, 0.45 * len(stages) + 1.0)
        ax = fig.add_subplot()
        left = [0.0] * len(stages)
        for key in SHARE_KEYS:
            widths = [100 * share[s][key] for s in stages]
            ax.barh(stages, widths, left=left, label=SHARE_NAMES[key], color=SHARE_COLOURS[key])
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.invert_yaxis()
        ax.set_xlim(0, 100)
        ax.set_xlabel("share of batches (%)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
        return _svg(fig)


# --- HTML ------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto;
       max-width: 1100px; padding: 0 1rem; color: #222; line-height: 1.4; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem;
     border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
.sub { color: #666; margin-top: 0; } .note { color: #555; font-style: italic; }
.warn { background: #fff4e5; border-left: 4px solid #f0a020; padding: .4rem .8rem; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .9rem; }
th, td { border: 1px solid #ddd; padding: .25rem .6rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.text { max-width: 640px; overflow-wrap: anywhere; }
.cards { display: flex; flex-wrap: wrap; gap: .6rem; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: .5rem .9rem; min-width: 110px; }
.card b { display: block; font-size: 1.3rem; } .card span { color: #666; font-size: .8rem; }
.chart svg { max-width: 100%; height: auto; }
"""


def _e(value: object) -> str:
    """Escape anything for HTML text or attribute context (sentence text is untrusted)."""
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: float | None, fmt: str = ",") -> str:
    return "—" if value is None else format(value, fmt)


def _table(table_id: str, headers: list[str], rows: list[list[str]], num: set[int]) -> str:
    """An HTML table; cells are already escaped, column indexes in ``num`` right-aligned.
    No ``headers``: a key/value table without a header row."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"num" if j in num else "text"}">{c}</td>' for j, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f'<table id="{table_id}">{thead}<tbody>{body}</tbody></table>'


def _yes_no(value: object) -> str | None:
    return None if value is None else ("yes" if value else "no")


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{_e(title)}</h2>{body}</section>'


def _summary(r: dict[str, Any]) -> str:
    c = r["counts"]
    cards = [
        ("documents", c["documents"]),
        ("sentences", c["sentences"]),
        ("errors", c["errors"]),
        ("tokens", c["tokens"]),
        *((k, r.get(k)) for k in AUDIT_COUNTS),
        # documents re-run although unchanged (the models changed), when the audit says
        *((k, r[k]) for k in ("reprocessed",) if k in r),
    ]
    html_cards = "".join(
        f'<div class="card" data-key="{_e(k)}"><b>{_e(_num(v))}</b><span>{_e(k)}</span></div>'
        for k, v in cards
    )
    body = f'<div class="cards" id="summary-counts">{html_cards}</div>'
    if not r["ran"]:
        body += (
            '<p class="note" id="nothing-ran">Nothing was processed this night: no document '
            "was new or changed, so every count is zero.</p>"
        )
    details = [
        ("date", r.get("date")),
        ("run id", r.get("run_id")),
        ("source", r.get("source")),
        ("output", r.get("output")),
        ("partition", r.get("partition")),
        ("started", r.get("started")),
        ("finished", r.get("finished")),
        ("models changed", _yes_no(r.get("models_changed"))),
    ]
    rows = [[_e(k), _e(v)] for k, v in details if v is not None]
    rows += [[_e(f"model: {s}"), _e(v)] for s, v in (r.get("models") or {}).items()]
    body += _table("summary-table", [], rows, set())
    if r["partial"]:
        files = ", ".join(_e(f.get("uri", f)) for f in r["skipped_files"])
        body += f'<p class="warn">Partial run: unreadable input files were skipped: {files}</p>'
    body += "".join(f'<p class="warn">{_e(w)}</p>' for w in r["warnings"])
    return _section("summary", "Summary", body)


def _labels_section(r: dict[str, Any]) -> str:
    if not r["counts"]["sentences"]:
        return _section(
            "labels",
            "Label distribution",
            '<div id="label-chart" class="chart"><p class="note">No sentences were '
            "classified this night.</p></div>",
        )
    rows = [
        [_e(lb), _num(n), _num(r["label_shares"][lb], ".1%")]
        for lb, n in r["label_distribution"].items()
    ]
    docs = [[_e(lb), _num(n)] for lb, n in r["top_label_distribution"].items()]
    body = (
        f'<div id="label-chart" class="chart">{label_chart(r)}</div>'
        + _table("label-table", ["label", "sentences", "share"], rows, {1, 2})
        + "<p>Documents by top label (the label with the highest mean probability):</p>"
        + _table("top-label-table", ["top label", "documents"], docs, {1})
    )
    return _section("labels", "Label distribution", body)


def _trend_section(r: dict[str, Any]) -> str:
    points = r["trend"]
    note = ""
    if len(points) == 1:
        note = '<p class="note" id="trend-note">Only one audit so far: the trend starts here.</p>'
    elif not any(p["sentences"] for p in points):
        note = '<p class="note" id="trend-note">No sentences in any of these audits.</p>'
    labels = list(r["labels"])
    for p in points:
        labels += [lb for lb in p["shares"] if lb not in labels]
    rows = [
        [_e(p["date"]), _num(p["sentences"])] + [_num(p["shares"].get(lb), ".1%") for lb in labels]
        for p in points
    ]
    body = (
        note
        + f'<div id="trend-chart" class="chart">{trend_chart(r)}</div>'
        + _table(
            "trend-table",
            ["date", "sentences", *labels],
            rows,
            set(range(1, len(labels) + 2)),
        )
    )
    title = (
        f"Label shares over the last {len(points)} audits"
        if len(points) > 1
        else "Label shares (one audit so far)"
    )
    return _section("trend", title, body)


def _risk_section(r: dict[str, Any]) -> str:
    rows = [
        [
            _num(i + 1),
            _e(s["doc_id"]),
            _num(s["sent_index"]),
            _e(s["text"]),
            _num(s["score"], ".3f"),
        ]
        for i, s in enumerate(r["top_risk"])
    ]
    risk = _e(r["risk_label"])
    intro = (
        f"<p>The {r['top_n']} sentences labelled <b>{risk}</b> with the highest scores "
        f"({len(rows)} found).</p>"
    )
    table = _table("top-risk", ["#", "doc_id", "sentence", "text", "score"], rows, {0, 2, 4})
    if not rows:
        table += f'<p class="note" id="no-risk">No sentence was labelled {risk} this night.</p>'
    return _section("risk", "Highest-risk sentences", intro + table)


def _backend_section(r: dict[str, Any]) -> str:
    share = r["backend_share"]
    if not share:
        return _section(
            "backends",
            "GPU vs CPU-int8 share per stage",
            '<div id="backend-chart" class="chart"><p class="note">No batches were '
            "processed this night.</p></div>",
        )
    rows = [
        [_e(stage), _num(s["batches"])]
        + [_num(s[k], ".1%") for k in SHARE_KEYS]
        + [_e(", ".join(f"{b}: {n}" for b, n in sorted(r["backends"].get(stage, {}).items())))]
        for stage, s in share.items()
    ]
    body = f'<div id="backend-chart" class="chart">{backend_chart(r)}</div>' + _table(
        "backend-table",
        ["stage", "batches", *(SHARE_NAMES[k] for k in SHARE_KEYS), "batches by backend"],
        rows,
        {1, 2, 3, 4},
    )
    if r["resumed_batches"]:
        body += (
            f'<p class="note">{r["resumed_batches"]} batches were committed by an earlier '
            "invocation of this run (resumed); they are counted from their committed "
            "rows.</p>"
        )
    return _section("backends", "GPU vs CPU-int8 share per stage", body)


def _throughput_section(r: dict[str, Any]) -> str:
    t = r["throughput"]
    if not t:
        return _section("throughput", "Throughput", '<p class="note">Nothing ran.</p>')
    rows = [
        ["documents/s", _num(t["documents_per_s"], ",.1f")],
        ["sentences/s", _num(t["sentences_per_s"], ",.1f")],
        ["tokens/s", _num(t["tokens_per_s"], ",.0f")],
        # without start-up (Ray and model loading), which dominates small nights
        ["sentences/s while processing", _num(t["sentences_per_processing_s"], ",.1f")],
        ["wall time (s)", _num(t["wall_seconds"], ",.1f")],
        ["start-up: checks, Ray, models (s)", _num(t["startup_seconds"], ",.1f")],
        ["processing (s)", _num(t["processing_seconds"], ",.1f")],
    ]
    rows += [[_e(f"time in {s} (s)"), _num(v, ",.1f")] for s, v in t["stage_seconds"].items()]
    return _section("throughput", "Throughput", _table("throughput-table", [], rows, {1}))


def _errors_section(r: dict[str, Any]) -> str:
    e = r["errors"]
    if not e["count"]:
        return _section("errors", "Errors", '<p id="no-errors">No document failed.</p>')
    by_type = [[_e(x["stage"]), _e(x["error_type"]), _num(x["count"])] for x in e["by_type"]]
    samples = [
        [_e(x["doc_id"]), _e(x["stage"]), _e(x["error_type"]), _e(x["message"])]
        for x in e["samples"]
    ]
    body = (
        f"<p>{e['count']:,} document{'s' if e['count'] > 1 else ''} failed; each is a row "
        "of the run's errors/ table.</p>"
        + _table("errors-table", ["stage", "error type", "documents"], by_type, {2})
        + "<p>Examples:</p>"
        + _table("error-samples", ["doc_id", "stage", "error type", "message"], samples, set())
    )
    return _section("errors", "Errors", body)


def render_html(report: dict[str, Any]) -> str:
    """One self-contained page: inline CSS and SVG, no scripts, no external resources."""
    title = f"docintel audit {report.get('date', '')}"
    sections = [
        _summary(report),
        _labels_section(report),
        _trend_section(report),
        _risk_section(report),
        _backend_section(report),
        _throughput_section(report),
        _errors_section(report),
    ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        f'<p class="sub">run {_e(report.get("run_id") or "—")} · generated '
        f"{_e(report['generated'])}</p>" + "".join(sections) + "</body></html>\n"
    )
