"""Integration tier: one local Ray cluster (2 CPUs, small object store) for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray

from docintel.actors.cluster import WORKER_ENV

OBJECT_STORE_BYTES = 256 * 1024 * 1024  # tiny corpora; keeps the test node's footprint small


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=1,  # logical: GPU pools are scheduled, their actors run on the CPU
        include_dashboard=False,
        object_store_memory=OBJECT_STORE_BYTES,
        runtime_env={"env_vars": WORKER_ENV},
        logging_level="WARNING",
    )
    yield
    ray.shutdown()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
