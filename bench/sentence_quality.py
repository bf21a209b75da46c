"""How well news text breaks into sentences: spaCy's rule-based sentencizer on the whole
text (what docintel did before issue 32) against docintel's sentencize stage (paragraph
breaks as hard boundaries, quotes mended, line breaks joined).

    python bench/sentence_quality.py [--articles 300] [--seed 7]

The articles are assembled from the written news sentences of data/news_style_check and
data/news_style_train (invented companies and figures: data/news_style_check/SOURCE.md,
data/news_style_train/SOURCE.md): a headline (a
sentence's first words, no full stop), a blank line, then paragraphs of 2-4 sentences
separated by blank lines, where about one sentence in four is quoted as a wire story
quotes a spokesperson ('"...," the company said.' / '"..." said NAME.'), and one
paragraph in three is wrapped at about 70 columns as text extracted from a PDF is.
Seeded: the same articles every run. Prints one table: sentences, headlines fused with the
next sentence, sentences spanning a blank line, sentences ending with an opening quote,
sentences holding a line break in their stored text.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("data/news_style_check/news_sentences.csv", "data/news_style_train/news_train.csv")
SPEAKERS = ("the company said", "a spokesperson said", "the bank said", "analysts wrote")
NAMES = ("said Maria Lund", "said chief executive Tom Reyes", "said CFO Anna Berg")
BLANK = re.compile(r"\n[ \t]*\n")
OPENING_AT_END = re.compile(r'\s["\u201c]\Z')


def _quote(rng: random.Random, s: str) -> str:
    body = s.rstrip(".")
    if rng.random() < 0.5:
        return f'"{body}," {rng.choice(SPEAKERS)}.'
    return f'"{body}." {rng.choice(NAMES).capitalize()}.'


def _paragraph(rng: random.Random, pool: list[str]) -> str:
    sents = [
        _quote(rng, s) if rng.random() < 0.25 else s for s in rng.sample(pool, rng.randint(2, 4))
    ]
    text = " ".join(sents)
    return "\n".join(textwrap.wrap(text, 70)) if rng.random() < 1 / 3 else text


def articles(n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` articles and their headlines (see the module docstring)."""
    pool = [t for src in SOURCES for t in pd.read_csv(REPO / src)["text"] if t.endswith(".")]
    rng = random.Random(seed)
    docs, heads = [], []
    for _ in range(n):
        head = " ".join(rng.choice(pool).split()[: rng.randint(5, 9)]).rstrip(",;:")
        body = "\n\n".join(_paragraph(rng, pool) for _ in range(rng.randint(2, 4)))
        docs.append(f"{head}\n\n{body}")
        heads.append(head)
    return docs, heads


def _spacy_alone(docs: list[str]) -> list[list[tuple[str, str]]]:
    """(span of the text, stored text) per sentence, spaCy on the whole text (before)."""
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    return [
        [(s.text.strip(), s.text.strip()) for s in d.sents if s.text.strip()]
        for d in nlp.pipe(docs)
    ]


def _docintel(docs: list[str]) -> list[list[tuple[str, str]]]:
    """The same, through docintel's sentencize stage (after)."""
    from docintel.pipeline.stages.sentencize import SentencizeConfig, Sentencizer

    stage = Sentencizer(SentencizeConfig())
    stage.setup()
    ids = [str(i) for i in range(len(docs))]
    out = stage(pa.table({"doc_id": ids, "text": docs})).to_pylist()
    per: list[list[tuple[str, str]]] = [[] for _ in docs]
    for r in out:
        i = int(r["doc_id"])
        per[i].append((docs[i][r["start_char"] : r["end_char"]], r["text"]))
    return per


def score(per_doc: list[list[tuple[str, str]]], heads: list[str]) -> dict[str, float]:
    sents = [s for doc in per_doc for s in doc]
    n = len(sents)
    fused = sum(1 for doc, h in zip(per_doc, heads, strict=True) if doc and doc[0][0] != h)
    return {
        "sentences": n,
        "headline fused": fused / len(heads),
        "spans a blank line": sum(bool(BLANK.search(span)) for span, _ in sents) / n,
        "ends with an opening quote": sum(bool(OPENING_AT_END.search(t)) for _, t in sents) / n,
        "line break in stored text": sum("\n" in t for _, t in sents) / n,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--articles", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    docs, heads = articles(args.articles, args.seed)
    before, after = score(_spacy_alone(docs), heads), score(_docintel(docs), heads)
    print(f"{args.articles} articles (seed {args.seed})")
    print(f"{'':28} {'spaCy alone':>12} {'docintel':>12}")
    for key in before:
        fmt = "{:>12,}" if key == "sentences" else "{:>12.2%}"
        print(f"{key:28} {fmt.format(before[key])} {fmt.format(after[key])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
