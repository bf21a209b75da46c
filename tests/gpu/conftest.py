"""GPU tier: needs a real CUDA device. Skipped when none exists, unless asked for with
``-m gpu``: then a missing GPU is a loud failure, never a silent skip."""

from __future__ import annotations

import pytest


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [i for i in items if "tests/gpu" in str(i.fspath)]
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
    if not gpu_items or _cuda():
        return
    if "gpu" in (config.option.markexpr or ""):
        raise pytest.UsageError("-m gpu asked for the GPU tests, but torch sees no CUDA device")
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason="no CUDA device on this machine"))
