"""The nightly audit's report: ``report.json`` and a self-contained ``report.html``.

``write_report`` reads one committed docintel run (documents/, sentences/, errors/ and
``_manifest.json``) and writes, beside it, what an auditor reads the next morning: what
changed tonight (the audit's ``changes``), the documents to review first (ranked by a risk
score, review.py) with a drill-down per document, for a run screened against watch lists
the listed names in risk sentences (entities.py, entity_sections.py) with a drill-down per
name, the highest-risk sentences, the trend of the corpus and of each night's documents,
the label distribution, the errors, and, folded away, backends and throughput. review.csv,
changes.csv (and entities.csv) hold the full lists.
The JSON is the record that later audits' trend charts are built from; the HTML is
one file that opens offline in any browser (inline CSS, charts as inline SVG, no scripts,
no external URLs), because reports are mailed, archived and opened on locked-down machines.

aggregate.py reads the run and builds the report dict (memory: a few numbers per
document, never the whole sentences table); html.py renders that dict, and only that dict,
as the page (sections.py the document sections, markup.py the escaping and tables); keys.py
holds the names both share.
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
