"""Input: resolving Parquet files, folders, globs and ``s3://`` prefixes into work units,
``docintel ingest``, and the duplicate-id check."""
