"""Benchmark: `docintel run` on the embedded local Ray vs a plain single-process loop.

Both sides take the same corpus (data/demo/documents.parquet repeated ``--repeat`` times,
with unique doc ids) through the same three models:

(a) ``docintel run INPUT OUT --no-progress --run-id bench`` as a subprocess: the driver,
    the Ray daemons it starts and every Ray worker.
(b) this script with ``--loop-only`` as a subprocess: spaCy ``blank("en")`` + sentencizer
    (``nlp.pipe`` over every document), the packaged all-MiniLM-L6-v2 through
    transformers AutoTokenizer/AutoModel in batches of 64 sentences in corpus order
    (padding=True, truncation=True, max_length=256; mean pooling, L2 normalisation),
    then the Keras classifier models/finsent/model.keras in batches of 1024. No length
    sorting: this is the naive baseline.

Wall time is the subprocess's, so it includes interpreter start, imports, model loading
and (for (a)) Ray start-up. Peak RSS is the maximum, over samples taken every
``--interval`` seconds, of the RSS summed over the subprocess and all its descendants
(a sum of RSS counts shared pages once per process that maps them, e.g. the shared
libraries every Ray worker loads).

Run from the repository root:

    .venv/bin/python bench/pipeline_vs_loop.py --repeat 4 --output-md bench/results.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from common import (
    DOC_ID,
    REPO,
    SAMPLE_INTERVAL_S,
    TEXT,
    Measured,
    build_corpus,
    docintel_executable,
    machine_lines,
    rss_breakdown,
    run_measured,
)
from common import fmt as _fmt
from common import md_row as _row

CLASSIFIER_DIR = REPO / "models" / "finsent"

DEFAULT_REPEAT = 4  # 4 x 528 demo documents: long enough that start-up is not everything
RUN_ID = "bench"

# The plain loop's fixed parameters (the naive baseline)
EMBED_BATCH = 64  # sentences per forward pass, in corpus order
MAX_LENGTH = 256  # all-MiniLM-L6-v2's training length, as the pipeline's default
CLASSIFY_BATCH = 1024  # rows per Keras predict batch, as the pipeline's default

MIB = 1024 * 1024
SENT_INDEX, LABEL, N_TOKENS, EMBEDDING = "sent_index", "label", "n_tokens", "embedding"


# --------------------------------------------------------------------------------------
# (b) the plain loop, run in its own process with --loop-only
# --------------------------------------------------------------------------------------


@dataclass
class LoopModels:
    nlp: Any
    tokenizer: Any
    encoder: Any
    classifier: Any
    labels: list[str]


@dataclass
class Sentences:
    doc_ids: list[str] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)


def load_models() -> LoopModels:
    """Import the frameworks and load the three models (timed as model load)."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import spacy
    from transformers import AutoModel, AutoTokenizer

    from docintel.pipeline.config import EmbedConfig

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    encoder_path = str(EmbedConfig().resolved_model_path())
    tokenizer = AutoTokenizer.from_pretrained(encoder_path)
    encoder = AutoModel.from_pretrained(encoder_path).eval()
    classifier = keras.saving.load_model(str(CLASSIFIER_DIR / "model.keras"), compile=False)
    labels = json.loads((CLASSIFIER_DIR / "labels.json").read_text())
    return LoopModels(nlp, tokenizer, encoder, classifier, labels)


def sentencize(nlp: Any, doc_ids: list[str], texts: list[str | None]) -> Sentences:
    """Every non-blank sentence, stripped, numbered per document (as the pipeline does)."""
    out = Sentences()
    for doc_id, doc in zip(doc_ids, nlp.pipe(t or "" for t in texts), strict=True):
        index = 0
        for sent in doc.sents:
            text = sent.text.strip()
            if not text:
                continue
            out.doc_ids.append(doc_id)
            out.indexes.append(index)
            out.texts.append(text)
            index += 1
    return out


def embed(tokenizer: Any, encoder: Any, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Unit-length mean-pooled embeddings and attention-mask token counts, in order."""
    import torch

    vectors: list[np.ndarray] = [np.zeros((0, encoder.config.hidden_size), np.float32)]
    tokens: list[np.ndarray] = [np.zeros(0, np.int32)]
    with torch.inference_mode():
        for start in range(0, len(texts), EMBED_BATCH):
            enc = tokenizer(
                texts[start : start + EMBED_BATCH],
                padding=True,
                truncation=True,
                max_length=MAX_LENGTH,
                return_tensors="pt",
            )
            hidden = encoder(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            vectors.append(torch.nn.functional.normalize(pooled, p=2, dim=1).numpy())
            tokens.append(enc["attention_mask"].sum(1).numpy().astype(np.int32))
    return np.concatenate(vectors), np.concatenate(tokens)


def classify(classifier: Any, vectors: np.ndarray, n_labels: int) -> np.ndarray:
    if len(vectors) == 0:
        return np.zeros((0, n_labels), np.float32)
    return np.asarray(classifier.predict(vectors, batch_size=CLASSIFY_BATCH, verbose=0))


def predictions_table(
    sents: Sentences, labels: list[str], probs: np.ndarray, vectors: np.ndarray, tokens: np.ndarray
) -> pa.Table:
    best = probs.argmax(axis=1)
    flat = pa.array(vectors.reshape(-1), pa.float32())
    return pa.table(
        {
            DOC_ID: pa.array(sents.doc_ids, pa.string()),
            SENT_INDEX: pa.array(sents.indexes, pa.int32()),
            TEXT: pa.array(sents.texts, pa.string()),
            LABEL: pa.array([labels[i] for i in best], pa.string()),
            "score": pa.array(probs[np.arange(len(probs)), best], pa.float32()),
            N_TOKENS: pa.array(tokens, pa.int32()),
            EMBEDDING: pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1]),
        }
    )


def loop_main(corpus: Path, predictions: Path, result: Path) -> None:
    """The plain loop: load, read, sentencize, embed, classify, write; timings to JSON."""
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    models = load_models()
    seconds["load"] = time.perf_counter() - t
    import torch  # imported by load_models (transformers); named here for its thread count

    t = time.perf_counter()
    table = pq.read_table(corpus, columns=[DOC_ID, TEXT])
    doc_ids = table[DOC_ID].to_pylist()
    seconds["read"] = time.perf_counter() - t

    t = time.perf_counter()
    sents = sentencize(models.nlp, doc_ids, table[TEXT].to_pylist())
    seconds["sentencize"] = time.perf_counter() - t

    t = time.perf_counter()
    vectors, tokens = embed(models.tokenizer, models.encoder, sents.texts)
    seconds["embed"] = time.perf_counter() - t

    t = time.perf_counter()
    probs = classify(models.classifier, vectors, len(models.labels))
    seconds["classify"] = time.perf_counter() - t

    t = time.perf_counter()
    pq.write_table(predictions_table(sents, models.labels, probs, vectors, tokens), predictions)
    seconds["write"] = time.perf_counter() - t

    summary = {
        "documents": len(doc_ids),
        "sentences": len(sents.texts),
        "tokens": int(tokens.sum()),
        "seconds": seconds,
        "torch_threads": torch.get_num_threads(),
        # Linux reports ru_maxrss in KiB: a cross-check of the sampled peak
        "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    result.write_text(json.dumps(summary, indent=2))


# --------------------------------------------------------------------------------------
# Results of both sides
# --------------------------------------------------------------------------------------


@dataclass
class Side:
    """One side's counts and timings, as shown in the tables."""

    name: str
    documents: int
    sentences: int
    tokens: int
    measured: Measured
    processing_s: float | None  # without model load / Ray start-up
    details: list[str]

    def rates(self, seconds: float | None) -> tuple[float, float, float] | None:
        if not seconds:
            return None
        return self.documents / seconds, self.sentences / seconds, self.tokens / seconds


def ray_side(measured: Measured, out: Path) -> tuple[Side, pa.Table]:
    manifest = json.loads((out / "_manifest.json").read_text())
    counts = manifest["counts"]
    timings = manifest["timings"]
    sentences = pads.dataset(out / "sentences", format="parquet").to_table(
        columns=[DOC_ID, SENT_INDEX, TEXT, LABEL, N_TOKENS, EMBEDDING]
    )
    busy = ", ".join(f"{s} {sec:.1f}" for s, sec in timings["stage_seconds"].items())
    details = [
        f"in-process run time (manifest timings.wall_seconds; includes Ray start-up and "
        f"model loading, excludes interpreter start and CLI imports): "
        f"{timings['wall_seconds']:.1f} s",
        f"stage busy seconds summed over batches (stages overlap): {busy}",
    ]
    processing = timings["processing_seconds"]
    details.append(
        f"processing only (manifest timings.processing_seconds: streaming every batch, "
        f"after {timings['startup_seconds']:.1f} s of checks, Ray start and model loads): "
        f"{processing:.1f} s"
    )
    if counts["errors"]:
        details.append(f"WARNING: {counts['errors']} documents failed (see {out}/errors)")
    side = Side(
        "(a) docintel on Ray",
        counts["documents"],
        counts["sentences"],
        counts["tokens"],
        measured,
        processing,
        details,
    )
    return side, sentences


def loop_side(measured: Measured, result: Path, predictions: Path) -> tuple[Side, pa.Table]:
    r = json.loads(result.read_text())
    sec = r["seconds"]
    processing = sum(v for k, v in sec.items() if k != "load")
    details = [
        f"model load (imports + spaCy, MiniLM, Keras): {sec['load']:.1f} s; processing "
        f"(read, sentencize, embed, classify, write): {processing:.1f} s",
        "stage seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in sec.items() if k != "load"),
        f"torch threads: {r['torch_threads']}; the process's own ru_maxrss (cross-check of "
        f"the sampled peak): {r['ru_maxrss_mib']:.0f} MiB",
    ]
    side = Side(
        "(b) plain loop",
        r["documents"],
        r["sentences"],
        r["tokens"],
        measured,
        processing,
        details,
    )
    return side, pq.read_table(predictions)


def compare(ray_sents: pa.Table, loop_sents: pa.Table) -> list[str]:
    """Sentence count check, and per-sentence agreement joined by (doc_id, sent_index)."""
    lines: list[str] = []
    if ray_sents.num_rows != loop_sents.num_rows:
        lines.append(
            f"WARNING: sentence counts differ: (a) {ray_sents.num_rows}, (b) {loop_sents.num_rows}"
        )
    keys = [DOC_ID, SENT_INDEX]
    cols = [*keys, TEXT, LABEL, N_TOKENS]

    def indexed(t: pa.Table, row: str) -> pa.Table:
        return t.select(cols).append_column(row, pa.array(np.arange(t.num_rows)))

    joined = indexed(ray_sents, "row_a").join(
        indexed(loop_sents, "row_b"), keys, left_suffix="_a", right_suffix="_b"
    )
    n = joined.num_rows
    if n == 0:
        return [*lines, "WARNING: no sentence matched by (doc_id, sent_index)"]

    def same(column: str) -> int:
        return int(pc.sum(pc.equal(joined[f"{column}_a"], joined[f"{column}_b"])).as_py())

    agree = same(LABEL)
    lines.append(f"label agreement (a) vs (b): {agree}/{n} sentences = {100 * agree / n:.2f}%")
    unmatched = max(ray_sents.num_rows, loop_sents.num_rows) - n
    if unmatched:
        lines.append(f"WARNING: {unmatched} sentences have no partner in the other output")
    for column, what in ((TEXT, "sentence texts"), (N_TOKENS, "token counts")):
        if (k := n - same(column)) > 0:
            lines.append(f"WARNING: {k} of {n} joined sentences differ in their {what}")
    ea = _unit_rows(ray_sents, joined["row_a"])
    eb = _unit_rows(loop_sents, joined["row_b"])
    cos = (ea * eb).sum(axis=1)
    lines.append(
        f"embedding cosine (a) vs (b) (length-sorted packing vs corpus-order padding): "
        f"mean {cos.mean():.6f}, min {cos.min():.6f}"
    )
    return lines


def _unit_rows(table: pa.Table, rows: pa.ChunkedArray) -> np.ndarray:
    emb = table[EMBEDDING].take(rows).combine_chunks()
    return emb.flatten().to_numpy(zero_copy_only=False).reshape(len(rows), emb.type.list_size)


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def _rate_cells(rates: tuple[float, float, float] | None) -> list[str]:
    if rates is None:
        return ["—"] * 3
    return [_fmt(rates[0], 1), _fmt(rates[1], 1), _fmt(rates[2], 0)]


def _ratio_cells(
    ra: tuple[float, float, float] | None, rb: tuple[float, float, float] | None
) -> list[str]:
    if ra is None or rb is None:
        return ["—"] * 3
    return [f"{x / y:.2f}x" if y else "—" for x, y in zip(ra, rb, strict=True)]


def main_table(a: Side, b: Side) -> list[str]:
    head = ["run", "docs/s", "sentences/s", "tokens/s", "wall s", "peak RSS MiB"]
    lines = [_row(head), _row(["---", *["---:"] * (len(head) - 1)])]
    for s in (a, b):
        rss = s.measured.peak.rss_bytes / MIB
        cells = _rate_cells(s.rates(s.measured.wall_s))
        lines.append(_row([s.name, *cells, _fmt(s.measured.wall_s, 1), _fmt(rss, 0)]))
    ratios = _ratio_cells(a.rates(a.measured.wall_s), b.rates(b.measured.wall_s))
    rss_ratio = a.measured.peak.rss_bytes / max(b.measured.peak.rss_bytes, 1)
    lines.append(_row(["ratio (a)/(b)", *ratios, "—", f"{rss_ratio:.2f}x"]))
    return lines


def processing_table(a: Side, b: Side) -> list[str]:
    head = ["run (processing only)", "seconds", "docs/s", "sentences/s", "tokens/s"]
    lines = [_row(head), _row(["---", *["---:"] * (len(head) - 1)])]
    names = {a.name: "(a) no Ray start-up or model load", b.name: "(b) no model load"}
    for s in (a, b):
        cells = _rate_cells(s.rates(s.processing_s))
        lines.append(_row([names[s.name], _fmt(s.processing_s, 1), *cells]))
    ratios = _ratio_cells(a.rates(a.processing_s), b.rates(b.processing_s))
    lines.append(_row(["ratio (a)/(b)", "—", *ratios]))
    return lines


def report(args: argparse.Namespace, a: Side, b: Side, checks: list[str], load: str) -> str:
    peak_a = a.measured.peak
    lines = [
        f"# docintel on Ray vs a plain loop ({a.documents:,} documents, --repeat {args.repeat})",
        "",
        *(f"- {m}" for m in machine_lines()),
        f"- load average (1, 5, 15 min): {load}",
        f"- command: `{shlex.join([sys.executable, *sys.argv])}`",
        f"- (a): `{shlex.join(a.measured.command)}`",
        f"- (b): `{shlex.join(b.measured.command)}`",
        "",
        *main_table(a, b),
        "",
        *processing_table(a, b),
        "",
        "Throughput in the first table is over the subprocess's wall time (interpreter start, "
        "imports, model loading and, for (a), Ray start-up included). Peak RSS: the maximum, "
        f"over samples every {args.interval:g} s, of the RSS summed over the process and all "
        "its descendants (shared pages count once per process that maps them).",
        "",
        f"- (a) RSS at its peak, {peak_a.processes_at_peak} processes (max in tree "
        f"{peak_a.max_processes}, {peak_a.samples} samples): {rss_breakdown(peak_a)}",
        *(f"- (a) {d}" for d in a.details),
        *(f"- (b) {d}" for d in b.details),
        f"- counts: (a) {a.sentences:,} sentences, {a.tokens:,} tokens; "
        f"(b) {b.sentences:,} sentences, {b.tokens:,} tokens",
        *(f"- {c}" for c in checks),
    ]
    if a.tokens != b.tokens:
        lines.append(f"- WARNING: token totals differ: (a) {a.tokens:,}, (b) {b.tokens:,}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> None:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="docintel-bench-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        corpus = work / "corpus" / "documents.parquet"
        n_docs = build_corpus(args.repeat, corpus)
        print(f"corpus: {n_docs:,} documents in {corpus}", file=sys.stderr)
        out = work / "out-ray"
        if out.exists():
            shutil.rmtree(out)
        run_a = [docintel_executable(), "run", str(corpus), str(out), "--no-progress"]
        run_a += ["--run-id", RUN_ID]
        print("running (a) docintel on Ray ...", file=sys.stderr)
        measured_a = run_measured(run_a, work / "ray.log", args.interval)
        a, ray_sents = ray_side(measured_a, out)

        result, predictions = work / "loop.json", work / "loop.parquet"
        run_b = [sys.executable, str(Path(__file__).resolve()), "--loop-only"]
        run_b += ["--corpus", str(corpus), "--result", str(result)]
        run_b += ["--predictions", str(predictions)]
        print("running (b) plain loop ...", file=sys.stderr)
        measured_b = run_measured(run_b, work / "loop.log", args.interval)
        b, loop_sents = loop_side(measured_b, result, predictions)

        checks = compare(ray_sents, loop_sents)
        load += " at start; " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + " at end"
        text = report(args, a, b, checks, load)
        print(text)
        if args.output_md:
            Path(args.output_md).write_text(text)
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept the corpus, outputs and logs in {work}", file=sys.stderr)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help="copies of the demo corpus")
    p.add_argument("--output-md", help="also write the markdown report to this file")
    p.add_argument("--interval", type=float, default=SAMPLE_INTERVAL_S, help="RSS sample period")
    p.add_argument("--workdir", help="folder for the corpus, outputs and logs (kept)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    loop = p.add_argument_group("internal: the plain-loop subprocess")
    loop.add_argument("--loop-only", action="store_true", help="run only the plain loop")
    loop.add_argument("--corpus", type=Path)
    loop.add_argument("--result", type=Path)
    loop.add_argument("--predictions", type=Path)
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.loop_only and not (args.corpus and args.result and args.predictions):
        p.error("--loop-only needs --corpus, --result and --predictions")
    return args


def main() -> None:
    args = parse_args()
    if args.loop_only:
        loop_main(args.corpus, args.predictions, args.result)
    else:
        bench(args)


if __name__ == "__main__":
    main()
