"""Output: the run-level protocol (open, record, finish, commit), the sink interface, a
committed run's tables read back, and offline compaction. Each table format lives in
``docintel.pipeline.formats``."""
