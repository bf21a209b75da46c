"""The nightly audit: each night, process only the documents that are new or changed.

One function, :func:`run_audit`, serves ``docintel audit`` and the Ray job entrypoint
``python -m docintel.jobs.nightly_audit``; it selects the night's documents and hands them
to the run function it is given: :func:`docintel.actors.runner.execute`, the same run
function as ``docintel run``. The run function is passed in (not imported) because
``docintel.pipeline`` does not know Ray; the callers in ``docintel.jobs`` pass it.

Layout under the audit OUTPUT (a local folder or an ``s3://`` prefix)::

    _audit/state.json                   written last, only when an audit completes: model
                                        versions, source files {path: size, mtime_ns} as
                                        seen when that audit started, completed audits
    _audit/doc_index-<date>-<nonce>.parquet
                                        the index of the last completed audit, named in
                                        state.json ("index"): doc_id, content_hash,
                                        processed_date, source_file, one row per document
    _audit/inputs/run_date=D/           the night's staging input (new + changed documents
                                        only, one Parquet file per source file that has
                                        some), then _selection.json (the selection's
                                        counts; marks the staging complete) and
                                        _doc_index.parquet (the index once D completes)
    run_date=D/                         a normal docintel run (run id ``audit-D``) over the
                                        staging input, plus report.html, report.json,
                                        review.csv and changes.csv
    latest/                             each current document once, its latest version
                                        (latest.py), updated before the state is committed

With ``[output] format = "iceberg"`` the night's run is not in ``run_date=D/`` (which then
holds the report only) but appended to the Iceberg tables of the audit root's warehouse
(``_catalog.db``, ``<namespace>/<table>/``, ``_runs/audit-D/``; tables.py).

Why the selection is persisted before the run: a crashed audit resumes its run with the
same run id and the *same* input (the run's batch ids depend on the input's layout), and
the counts and the index it records must describe what that run processed, not what the
source holds by the time the rerun happens. The state and the index change only after the
report is written, so a night that never completed leaves its documents to the next one.

Change detection is two-level. Files whose (size, mtime) match the state's are not read at
all. Files that are new or differ are read (the id column first, for one join against the
index and the duplicate checks; then id + text streamed batch by batch, hashed with
BLAKE2b-128) and each document is new (id not in the index), changed (different hash) or
unchanged. Ids the index holds that the source no longer has are counted as removed.

Modules: state.py is the audit root (its layout, ``state.json``, the doc index, what a
crash leaves behind); select.py decides a night's documents and writes their staging
input and the selection; changes.py lists a night's new, changed and removed documents
and a changed document's added and removed sentences; latest.py keeps ``latest/``;
tables.py says where a night's run writes and reads it back as tables (either format);
night.py runs :func:`run_audit`, night by night. A failed audit removes a half-written
staging and the folders it created and left empty.
"""

from docintel.pipeline.audit.night import Execute, run_audit
from docintel.pipeline.audit.state import (
    AUDIT_DIR,
    DOC_INDEX_FILE,
    INDEX_SCHEMA,
    INPUTS_DIR,
    PARTITION_KEY,
    PENDING_INDEX_FILE,
    SELECTION_FILE,
    STATE_FILE,
    STATE_VERSION,
    AuditLayout,
    AuditSummary,
    parse_date,
)

__all__ = [
    "AUDIT_DIR",
    "DOC_INDEX_FILE",
    "INDEX_SCHEMA",
    "INPUTS_DIR",
    "PARTITION_KEY",
    "PENDING_INDEX_FILE",
    "SELECTION_FILE",
    "STATE_FILE",
    "STATE_VERSION",
    "AuditLayout",
    "AuditSummary",
    "Execute",
    "parse_date",
    "run_audit",
]
