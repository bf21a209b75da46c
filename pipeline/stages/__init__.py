"""Stage logic: plain classes that run with or without Ray (docs/design.md, Conventions)."""

from docintel.pipeline.stages.base import Stage, check_chain, run_stage

__all__ = ["Stage", "check_chain", "run_stage"]
