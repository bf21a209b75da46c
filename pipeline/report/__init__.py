"""The nightly audit's report: ``report.json`` and a self-contained ``report.html``.

``write_report`` reads one committed docintel run (documents/, sentences/, errors/ and
``_manifest.json``) and writes, beside it, what an auditor reads the next morning: counts,
the label distribution, the highest-risk sentences, the trend of label shares over the
previous audits, how much work the GPU and the int8 CPU replicas did, throughput and the
errors. The JSON is the record that later audits' trend charts are built from; the HTML is
one file that opens offline in any browser (inline CSS, charts as inline SVG, no scripts,
no external URLs), because reports are mailed, archived and opened on locked-down machines.

aggregate.py reads the run and builds the report dict (memory stays flat whatever the
run's size); html.py renders that dict, and only that dict, as the page; keys.py holds the
names both share.
"""

from docintel.pipeline.report.aggregate import (
    REPORT_HTML,
    REPORT_JSON,
    REPORT_VERSION,
    build_report,
    write_report,
)
from docintel.pipeline.report.html import render_html

__all__ = [
    "REPORT_HTML",
    "REPORT_JSON",
    "REPORT_VERSION",
    "build_report",
    "render_html",
    "write_report",
]
