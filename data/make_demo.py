"""Build data/demo/documents.parquet from the vendored finance headlines (deterministic).

Each demo document is a short "news digest": 1 to 8 consecutive headlines from
sent_valid.csv, each ended with a full stop when it has no closing punctuation, so the
sentencizer has real multi-sentence documents to split. Run: python data/make_demo.py
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "twitter_fin_sentiment" / "sent_valid.csv"
TARGET = HERE / "demo" / "documents.parquet"
SEED = 7
MAX_HEADLINES = 8
ROW_GROUP = 100  # several row groups, so a run has several work units


def main() -> None:
    texts = pacsv.read_csv(SOURCE)["text"].to_pylist()
    rng = random.Random(SEED)
    ids, docs, i = [], [], 0
    while i < len(texts):
        k = rng.randint(1, MAX_HEADLINES)
        lines = [t.strip() for t in texts[i : i + k]]
        lines = [t if t.endswith((".", "!", "?")) else t + "." for t in lines]
        ids.append(f"digest-{len(ids):04d}")
        docs.append(" ".join(lines) if rng.random() < 0.7 else "\n\n".join(lines))
        i += k
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"doc_id": ids, "text": docs}), TARGET, row_group_size=ROW_GROUP)
    print(f"wrote {len(ids)} documents ({len(texts)} headlines) to {TARGET}")


if __name__ == "__main__":
    main()
