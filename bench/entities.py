"""Watch-list screening (issue 34): compile cost, throughput, precision and recall.

Lists are SYNTHETIC (``docintel.pipeline.entities.synthetic``, seeded): half people, half
companies, pronounceable names with some accented letters, plus the capitalised word pairs
of the sentence corpus (``PLANTED``), so that the news sentences do name some listed
entities. Sentences: data/news_style_check/news_sentences.csv and
data/twitter_fin_sentiment/*.csv (~14,000).

* ``compile``: ``compile_watch_lists`` on the loaded list (load_list is not timed), the
  pickled size (what Ray's object store holds once per run), and the memory a replica
  holds: the RSS a fresh process adds by unpickling the compiled lists.
* ``throughput``: ``Matcher.find`` over every sentence, in sentences per CPU second of
  one core (CPU time, not wall time: the machine is shared); fuzzy both cold (first pass,
  every new word looked up) and warm (second pass: a long run's steady state).
* ``precision/recall``: the labelled test set of ``synthetic.labelled_cases`` (listed names in
  every variant, decoys) and ``synthetic.typos`` (one letter changed: fuzzy positives).

    .venv/bin/python bench/entities.py                         # 1e3, 1e5, 1e6
    .venv/bin/python bench/entities.py --sizes 1000 --fuzzy 0.9
"""

from __future__ import annotations

import argparse
import csv
import gc
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

from docintel.pipeline.entities import Matcher, WatchList, compile_watch_lists
from docintel.pipeline.entities.compiled import CompiledLists
from docintel.pipeline.entities.synthetic import Case, labelled_cases, names, typos

REPO = Path(__file__).resolve().parent.parent
SOURCES = [
    REPO / "data" / "news_style_check" / "news_sentences.csv",
    *sorted((REPO / "data" / "twitter_fin_sentiment").glob("*.csv")),
]
PLANTED = 500  # capitalised word pairs of the corpus put on every list
MIB = 1024 * 1024
REPLICA = """
import sys, psutil
from docintel.pipeline.entities.compiled import CompiledLists
p = psutil.Process(); before = p.memory_info().rss
data = open(sys.argv[1], "rb").read(); mid = p.memory_info().rss
c = CompiledLists.from_bytes(data); del data
print(p.memory_info().rss - before - (mid - before))
"""


def sentences() -> list[str]:
    out = []
    for path in SOURCES:
        with path.open(encoding="utf-8", newline="") as f:
            out += [row["text"] for row in csv.DictReader(f) if row.get("text")]
    return out


def watch_list(size: int, corpus: list[str]) -> WatchList:
    """``size`` names: synthetic ones and up to ``PLANTED`` word pairs of the corpus."""
    pairs = re.compile(r"\b([A-Z][a-z]{3,} [A-Z][a-z]{3,})\b")
    planted = list(dict.fromkeys(m for s in corpus for m in pairs.findall(s)))
    planted = planted[: min(PLANTED, size // 10)]
    rows = names(size - len(planted))
    rows += [(f"P{i:05d}", n, "planted") for i, n in enumerate(planted)]
    return WatchList(
        "bench",
        "-",
        [r[0] for r in rows],
        [r[1] for r in rows],
        [() for _ in rows],
        [r[2] for r in rows],
    )


def compile_cost(wl: WatchList) -> tuple[CompiledLists, dict[str, float]]:
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    compiled = compile_watch_lists([wl])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    data = compiled.to_bytes()
    with tempfile.NamedTemporaryFile(suffix=".pkl") as f:
        f.write(data)
        f.flush()
        run = [sys.executable, "-c", REPLICA, f.name]
        replica = int(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
    stats = compiled.stats()
    return compiled, {
        "compile_s": seconds,
        "compile_cpu_s": cpu,
        "pickled_mib": len(data) / MIB,
        "replica_mib": replica / MIB,
        "automaton_mib": stats["automaton_bytes"] / MIB,
        "words": stats["words"],
        "keys": stats["keys"],
    }


def throughput(matcher: Matcher, corpus: list[str]) -> dict[str, float]:
    """Sentences per CPU second (one core; the machine is shared) over the corpus: the first
    pass (cold: the fuzzy cache empty) and the second (warm)."""
    rates = []
    for _ in range(2):
        cpu = time.process_time()
        found = sum(len(matcher.find(s)) for s in corpus)
        rates.append(len(corpus) / (time.process_time() - cpu))
    return {"cold": rates[0], "sent_per_s": rates[1], "matches": found}


def score(matcher: Matcher, cases: list[Case]) -> dict[str, Counter]:
    """True/false positives and false negatives per kind of case."""
    out: dict[str, Counter] = {}
    for case in cases:
        got = {(m.entity_id, m.match) for m in matcher.find(case.sentence)}
        want = set(case.expected)
        c = out.setdefault(case.kind, Counter())
        c["tp"] += len(got & want)
        c["fp"] += len(got - want)
        c["fn"] += len(want - got)
    return out


def pr_table(listed: int, sims: list[float | None]) -> list[str]:
    rows = names(listed)
    wl = WatchList(
        "pr", "-", [r[0] for r in rows], [r[1] for r in rows], [()] * listed, [""] * listed
    )
    compiled = compile_watch_lists([wl])
    cases, typo_cases = labelled_cases(rows), typos(rows)
    kinds = sorted({c.kind for c in cases + typo_cases})
    head = "| kind | cases | " + " | ".join(
        "exact: TP/FP/FN" if s is None else f"{s}: TP/FP/FN" for s in sims
    )
    lines = [head + " |", "| --- | ---: |" + " ---: |" * len(sims)]
    results = [score(Matcher(compiled, s), cases + typo_cases) for s in sims]
    counts = Counter(c.kind for c in cases + typo_cases)
    for kind in [*kinds, "all but typos", "typos"]:
        cells = []
        for res in results:
            picked = [k for k in res if _in_group(k, kind)]
            tp, fp, fn = (sum(res[k][x] for k in picked) for x in ("tp", "fp", "fn"))
            cells.append(f"{tp}/{fp}/{fn}" + _pr(tp, fp, fn, kind))
        n = sum(v for k, v in counts.items() if _in_group(k, kind))
        lines.append(f"| {kind} | {n} | " + " | ".join(cells) + " |")
    return lines


def _in_group(kind: str, group: str) -> bool:
    if group == "all but typos":
        return kind != "typo"
    return kind == "typo" if group == "typos" else kind == group


def _pr(tp: int, fp: int, fn: int, kind: str) -> str:
    if kind not in ("all but typos", "typos"):
        return ""
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    return f" (P {precision:.4f}, R {recall:.4f})"


def size_table(sizes: list[int], fuzzy: float | None, fuzzy_sentences: int) -> list[str]:
    corpus = sentences()
    lines = [
        f"sentences: {len(corpus)}; fuzzy at min_similarity {fuzzy} on the first {fuzzy_sentences}",
        "",
        "| names | compile s (cpu s) | automaton MiB | pickled MiB | replica MiB | words | "
        "exact sent/s | matches | fuzzy sent/s cold / warm | fuzzy matches |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in sizes:
        compiled, cost = compile_cost(watch_list(size, corpus))
        exact = throughput(Matcher(compiled), corpus)
        near = {"cold": float("nan"), "sent_per_s": float("nan"), "matches": 0}
        if fuzzy is not None:
            near = throughput(Matcher(compiled, fuzzy), corpus[:fuzzy_sentences])
        lines.append(
            f"| {size:,} | {cost['compile_s']:.1f} ({cost['compile_cpu_s']:.1f}) | "
            f"{cost['automaton_mib']:.0f} | "
            f"{cost['pickled_mib']:.0f} | {cost['replica_mib']:.0f} | {cost['words']:,} | "
            f"{exact['sent_per_s']:,.0f} | {exact['matches']:,} | "
            f"{near['cold']:,.0f} / {near['sent_per_s']:,.0f} | {near['matches']:,} |"
        )
        print(lines[-1], flush=True)
        del compiled
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000,1000000")
    parser.add_argument("--fuzzy", type=float, default=0.85, help="min_similarity measured")
    parser.add_argument("--fuzzy-sentences", type=int, default=1000)
    parser.add_argument("--listed", type=int, default=2000, help="names of the P/R test set")
    parser.add_argument("--skip-pr", action="store_true")
    args = parser.parse_args()
    print(f"cpu: {psutil.cpu_count()} cores; python {sys.version.split()[0]}")
    sizes = [int(s) for s in args.sizes.split(",")]
    table = size_table(sizes, args.fuzzy, args.fuzzy_sentences)
    print("\n".join(table))
    if not args.skip_pr:
        print(f"\nprecision/recall: {args.listed:,} listed names; TP/FP/FN per kind")
        print("\n".join(pr_table(args.listed, [None, 0.85, 0.9, 0.95])))


if __name__ == "__main__":
    main()
