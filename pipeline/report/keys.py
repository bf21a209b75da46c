"""Names the report dict shares between aggregate.py (which builds it) and html.py (which
renders it). A module of their own so that html.py never imports aggregate.py (aggregate
imports html to render the page: the other way round would be an import cycle).
"""

from __future__ import annotations

# documents whose top_label is null: no sentences (empty or failed), or only unlabelled ones
# (a language the model was not trained on)
NO_TOP_LABEL = "(no labelled sentences)"

# The audit dict keys the report cannot do without; the others are shown when present.
REQUIRED_AUDIT_KEYS = ("date", "ran")
AUDIT_COUNTS = ("new", "changed", "removed", "unchanged")

# Backend families for the GPU-vs-CPU share (aggregate.py maps the backend names the
# stages record onto them) and their names on the page.
SHARE_KEYS = ("gpu", "cpu_int8", "cpu_other")
SHARE_NAMES = {"gpu": "GPU", "cpu_int8": "CPU int8", "cpu_other": "CPU fp32"}
