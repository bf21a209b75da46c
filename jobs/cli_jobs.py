"""`docintel submit`, `status` and `logs`: Ray Jobs API commands (registered on jobs.cli.app)."""
