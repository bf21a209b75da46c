"""Benchmark: what ``--redact`` costs a CPU run, end to end (issue 35; target: at most 15%).

The same ``docintel run`` (CPU pools, the default configuration) on the same corpus,
without redaction (side A) and with ``--redact`` (side B: every built-in type), each run
its own subprocess, in alternating order (A B, B A, A B, ...). Side B pays everything
redaction brings: the setting's check on the driver, the extra pool (the privacy replica's
start, its import of phonenumbers and python-stdnum) and the detection and replacement on
every sentence, with the batches' extra hop between replicas.

Corpus: ``--docs`` long news documents of ``--sentences-per-doc`` consecutive headlines
(bench/pipeline_vs_loop.py ``--corpus long``, the corpus of the other end-to-end benches:
300 documents, ~5,200 sentences of financial news, full of numbers, amounts, dates and
percentages), every third one opening with a contact line that holds an e-mail address and
a phone number, and every ninth one with a card number and an IBAN too, so that B replaces
values as well as scanning for them. The derived ONNX models are built by one warm-up run
of side A before the timed runs (not counted).

Per run: the subprocess's wall time, the CPU seconds of its whole process tree (driver,
Ray daemons, workers; sampled every 0.2 s), the manifest's wall time and the privacy
stage's seconds (its replica's time in calls). On a shared machine wall times spread; the
ratio of the medians of tree CPU seconds is the figure.

Run from the repository root:

    .venv/bin/python bench/redact_cost.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: common, pipeline_vs_loop

from common import (
    ab_orders,
    ab_table,
    docintel_executable,
    fmt,
    load_average,
    machine_lines,
    median_known,
    sampled_docintel_run,
)
from pipeline_vs_loop import build_long_corpus

RUN_ID = "bench"
COLUMNS = {
    "wall": "process wall s",
    "run_wall": "manifest wall s",
    "tree_cpu": "tree CPU s",
    "stage": "privacy stage s",
}
CONTACT = "Contact the desk at desk{i}@example.com or +44 20 7946 {n:04d}."
PAYMENT = "Refunds go to card 4111 1111 1111 1111 or IBAN DE89 3704 0044 0532 0130 00."


def build_corpus(args: argparse.Namespace, work: Path) -> tuple[Path, int]:
    """The news corpus with contact lines planted; cached in ``work``."""
    corpus = work / f"news-{args.docs}x{args.sentences_per_doc}-contacts.parquet"
    plain = work / "plain.parquet"
    build_long_corpus(args.docs, args.sentences_per_doc, plain)
    table = pq.read_table(plain)
    texts = table["text"].to_pylist()
    planted = 0
    for i in range(0, len(texts), 3):
        lead = CONTACT.format(i=i, n=1000 + i % 9000)
        if i % 9 == 0:
            lead += " " + PAYMENT
        texts[i] = f"{lead} {texts[i]}"
        planted += 1
    with_values = table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts))
    pq.write_table(with_values, corpus, row_group_size=100)
    return corpus, planted


def one_run(side: str, corpus: Path, work: Path, cache: Path, i: int) -> dict:
    """One ``docintel run`` of ``side`` (A: plain, B: --redact), measured."""
    out = work / f"out-{i}-{side}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [docintel_executable(), "run", str(corpus), str(out), "--no-progress",
           "--run-id", RUN_ID]  # fmt: skip
    if side == "B":
        cmd.append("--redact")
    env = {**os.environ, "DOCINTEL_CACHE_DIR": str(cache)}
    wall, peak, manifest, _, _ = sampled_docintel_run(cmd, out, f"run {i} {side}", env, cpu=True)
    timings = manifest["timings"]
    placeholders = 0
    if side == "B":
        pii = pq.read_table(out / "sentences", columns=["pii"])["pii"]
        placeholders = sum(len(x) for x in pii.to_pylist())
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall": wall,
        "run_wall": timings["wall_seconds"],
        "tree_cpu": peak.cpu_s,
        "stage": timings["stage_seconds"].get("privacy"),
        "sentences": manifest["counts"]["sentences"],
        "placeholders": placeholders,
    }


def stage_alone(corpus: Path, repeat: int = 3) -> tuple[float, int, int]:
    """The privacy stage's own CPU seconds on the corpus's sentences, in this process (the
    sentencizer's rows, one call per 100 documents as a run's batches; best of ``repeat``):
    a figure the machine's load hardly moves. Returns (CPU s, sentences, placeholders)."""
    from docintel.pipeline.config import load_config
    from docintel.pipeline.privacy.stage import PII, Redact
    from docintel.pipeline.stages.sentencize import SentencizeConfig, Sentencizer

    sentencizer = Sentencizer(SentencizeConfig())
    sentencizer.setup()
    docs = pq.read_table(corpus)
    batches = [sentencizer(docs.slice(i, 100)) for i in range(0, docs.num_rows, 100)]
    stage = Redact(load_config(None, {"privacy.redact": True}).privacy)
    stage.setup()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        outs = [stage(b) for b in batches]
        best = min(best, time.process_time() - t0)
    found = sum(len(x) for o in outs for x in o[PII].to_pylist())
    return best, sum(b.num_rows for b in batches), found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="A/B pairs, alternating order")
    p.add_argument("--docs", type=int, default=300)
    p.add_argument("--sentences-per-doc", type=int, default=17)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/docintel-bench-redact"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    corpus, planted = build_corpus(args, work)
    print(f"corpus: {args.docs} news documents, {planted} with a contact line", flush=True)
    print("warm-up run (A, not counted: builds the derived ONNX models)", flush=True)
    one_run("A", corpus, work, cache, 0)
    rows = []
    for r, side in ab_orders(args.rounds):
        row = {"round": r, "side": side, **one_run(side, corpus, work, cache, r)}
        rows.append(row)
        print(f"  round {r} {side}: {row['wall']:.1f} s wall, {row['tree_cpu']:.1f} CPU-s, "
              f"{row['sentences']:,} sentences, {row['placeholders']:,} placeholders "
              f"(load {load_average()})", flush=True)  # fmt: skip
    print()
    for line in machine_lines():
        print(line)
    print(f"load average at the end: {load_average()}\n")
    print(ab_table(rows, COLUMNS, 1, ("B", "A")))
    cpu, n, found = stage_alone(corpus)
    per_sentence_a = median_known(
        [r["tree_cpu"] / r["sentences"] for r in rows if r["side"] == "A"]
    )
    share = cpu / n / per_sentence_a if per_sentence_a else None
    print(f"\nprivacy stage alone (in-process, best of 3): {cpu:.2f} CPU-s for {n:,} "
          f"sentences ({cpu / n * 1e6:.0f} us a sentence, {found:,} placeholders) = "
          f"{fmt(share and share * 100, 2)}% of side A's tree CPU a sentence")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
