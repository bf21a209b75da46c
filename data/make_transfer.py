"""Build the style-transfer check, data/twitter_fin_sentiment/sent_valid_newsstyle.csv.

The rows of sent_valid.csv (never trained on: `docintel train` reads sent_train.csv) that
read most like news: no cashtag ($ followed by a letter), no link (http://, https://,
www.), no @mention, no #hashtag and no emoji or other pictographic symbol. Columns and
label ids as in sent_valid.csv (0 Bearish, 1 Bullish, 2 Neutral); rows in file order.
Deterministic. Run: python data/make_transfer.py
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "twitter_fin_sentiment" / "sent_valid.csv"
TARGET = HERE / "twitter_fin_sentiment" / "sent_valid_newsstyle.csv"
TWEET_MARKS = re.compile(r"\$[A-Za-z]|https?://|www\.|@\w|#\w")


def news_style(text: str) -> bool:
    """No tweet marks and no pictographic symbols (Unicode category So)."""
    if TWEET_MARKS.search(text):
        return False
    return not any(unicodedata.category(ch) == "So" for ch in text)


def main() -> None:
    table = pacsv.read_csv(
        SOURCE,
        convert_options=pacsv.ConvertOptions(column_types={"text": pa.string()}),
    )
    keep = pa.array([news_style(t) for t in table["text"].to_pylist()])
    kept = table.filter(keep)
    pacsv.write_csv(kept, TARGET)
    counts = pc.value_counts(kept["label"]).to_pylist()
    print(f"{TARGET.name}: {kept.num_rows} of {table.num_rows} rows; labels {counts}")


if __name__ == "__main__":
    main()
