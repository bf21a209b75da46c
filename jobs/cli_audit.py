"""`docintel audit`: the nightly audit command (registered on jobs.cli.app)."""
