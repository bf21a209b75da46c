"""docintel's run definition: config, schemas, stage logic, sources, sinks and routing.

Nothing in this package imports Ray, torch or TensorFlow at import time; stages import
their framework inside ``setup()``.
"""
