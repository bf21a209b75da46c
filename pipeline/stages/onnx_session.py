"""The one place ONNX Runtime sessions are built, for every model that runs on it.

Every ONNX model in a replica (encoders, classifier heads) shares these options, so a
tuning decision (threads, spinning, graph optimisation) is made once and holds for all.
Import this module only where a model is loaded (``setup()``): it imports onnxruntime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Only the CPU provider: GPU replicas run the frameworks themselves, and an ORT build with
# CUDA would otherwise pick the card for a replica the scheduler placed on CPUs.
PROVIDERS = ("CPUExecutionProvider",)


def onnx_session(path: Path, threads: int) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``path`` on ``threads`` intra-op threads.

    One inter-op thread and sequential execution: these graphs are a single chain, and a
    replica's parallelism is its intra-op pool (sized by the caller to its share of the
    cores). Idle intra-op threads sleep instead of spinning: between calls, and while the
    replica tokenizes, spinning threads would take the cores that the other replicas and
    the I/O tasks on the same machine need (measured on the encoder: 5% more sentences/s
    alone, and fewer CPU-s per sentence). ORT's load errors propagate unchanged; callers
    turn them into a ``ModelError`` that says how to rebuild their file.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), opts, providers=list(PROVIDERS))
