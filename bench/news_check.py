"""The transfer check as a user would run it: `docintel run` on labelled sentences, one
document per sentence, each document's `top_label` scored against the gold label.

    .venv/bin/python bench/news_check.py                       # the default model
    .venv/bin/python bench/news_check.py --model models/finsent --files my_news.csv

Files: labelled CSV/Parquet with `text` and `label` (0 Bearish, 1 Bullish, 2 Neutral, as
the vendored data); default: the written news sentences (data/news_style_check) and the
news-style slice of the tweets' validation split. Prints macro-F1 and accuracy per file,
and how many documents the sentencizer split into more than one sentence (their
`top_label` is the label of their highest-scoring sentence), and how many it left unlabelled
(the language gate: counted as wrong).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
FILES = (
    REPO / "data" / "news_style_check" / "news_sentences.csv",
    REPO / "data" / "twitter_fin_sentiment" / "sent_valid_newsstyle.csv",
)
LABELS = ["Bearish", "Bullish", "Neutral"]
DOCINTEL = Path(sys.executable).with_name("docintel")


def check(path: Path, model: str, work: Path) -> dict[str, float]:
    """Run the pipeline on ``path``'s texts (one document each) and score it."""
    from docintel.pipeline.offline.metrics import metrics
    from docintel.pipeline.offline.train import load_labelled

    texts, raw = load_labelled(path)
    ids = [f"s{i:06d}" for i in range(len(texts))]
    src = work / f"{path.stem}.parquet"
    pq.write_table(pa.table({"id": ids, "text": texts}), src)
    out = work / f"{path.stem}-out"
    cmd = [str(DOCINTEL), "run", str(src), str(out), "--id-column", "id", "--no-progress"]
    subprocess.run([*cmd, "--model", model], check=True, stdout=subprocess.DEVNULL)
    docs = ds.dataset(out / "documents", format="parquet").to_table().to_pydict()
    top = dict(zip(docs["doc_id"], docs["top_label"], strict=True))
    split = dict(zip(docs["doc_id"], docs["n_sentences"], strict=True))
    gold = np.array([int(v) for v in raw])
    # a document the run left unlabelled (e.g. the language gate) counts as wrong
    none = np.array([top[i] is None for i in ids])
    pred = np.array([LABELS.index(top[i]) if top[i] is not None else -1 for i in ids])
    pred = np.where(none, (gold + 1) % len(LABELS), pred)
    m = metrics(gold, pred, LABELS)
    return {
        "n": len(ids),
        "macro_f1": round(m["macro_f1"], 4),
        "accuracy": round(m["accuracy"], 4),
        "split_documents": sum(split[i] > 1 for i in ids),
        "unlabelled": int(none.sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default", help="classifier folder, or default/stock")
    ap.add_argument("--files", nargs="+", type=Path, default=list(FILES))
    args = ap.parse_args()
    head = "| file | n | macro-F1 | accuracy | split documents | unlabelled |"
    print(f"{head}  (model: {args.model})")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="news-check-") as tmp:
        for f in args.files:
            r = check(f, args.model, Path(tmp))
            print(f"| {f.name} | {r['n']} | {r['macro_f1']:.4f} | {r['accuracy']:.4f} | "
                  f"{r['split_documents']} | {r['unlabelled']} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
