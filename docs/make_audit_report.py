"""Make docs/audit_report.png: two real audit nights of the demo corpus, then a headless
Chromium screenshot of the second night's report.html.

Night 1 audits the first 400 demo documents. Night 2 sees 127 more, one removed
(digest-0007) and one changed: digest-0042 gets a paragraph announcing layoffs and a
suspended dividend. Run from the repository root (takes a few minutes on a laptop):

    .venv/bin/python docs/make_audit_report.py [WORKDIR]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "data" / "demo" / "documents.parquet"
TARGET = REPO / "docs" / "audit_report.png"
CHANGED, REMOVED = "digest-0042", "digest-0007"
UPDATE = (
    " Update: the company will cut 2,000 jobs and suspend its dividend after a quarterly "
    "loss. Shares fell 12% in early trading."
)
NIGHTS = ("2026-05-01", "2026-05-02")
WINDOW = "1280,2600"


def _audit(src: Path, out: Path, date: str) -> None:
    cmd = [str(REPO / ".venv" / "bin" / "docintel"), "audit", "--source", str(src),
           "--output", str(out), "--date", date, "--no-progress"]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=REPO)


def main(work: Path) -> None:
    demo = pq.read_table(DEMO)
    src, out = work / "source", work / "audits"
    shutil.rmtree(work, ignore_errors=True)
    src.mkdir(parents=True)
    pq.write_table(demo.slice(0, 400), src / "documents.parquet")
    _audit(src, out, NIGHTS[0])
    ids, texts = demo["doc_id"].to_pylist(), demo["text"].to_pylist()
    texts = [t + UPDATE if i == CHANGED else t for i, t in zip(ids, texts, strict=True)]
    night2 = pa.table({"doc_id": ids, "text": texts})
    night2 = night2.filter(pc.not_equal(night2["doc_id"], REMOVED))
    pq.write_table(night2, src / "documents.parquet")
    _audit(src, out, NIGHTS[1])
    page = out / f"run_date={NIGHTS[1]}" / "report.html"
    shot = work / "audit_report.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={work / 'profile'}", f"--window-size={WINDOW}",
         f"--screenshot={shot}", page.as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    shutil.copyfile(shot, TARGET)
    print(f"report: {page}\nscreenshot: {TARGET}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()) / "audit-demo")
