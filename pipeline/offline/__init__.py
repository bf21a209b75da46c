"""Offline tools: ``docintel train`` (the classifier head) and ``docintel quantize`` (int8
artefacts). They build model artefacts; the stages only load them, by the names and paths in
:mod:`docintel.pipeline.artefacts.paths`, and never import this package."""
