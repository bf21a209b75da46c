"""The command line (``docintel``) and the Ray job entrypoints: parse, call, map errors to
exit codes. What a run is lives in docintel.pipeline; running it on Ray in docintel.actors."""
