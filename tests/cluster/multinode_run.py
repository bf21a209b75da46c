"""Run docintel on a 3-node local Ray cluster and remove the node of the embed actor mid-run.

Used by test_multinode.py in its own process (one Ray per process). Prints a JSON line
with what happened.
"""

from __future__ import annotations

import json
import sys

import ray
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

from docintel.actors.cluster import WORKER_ENV, actor_name
from docintel.actors.runner import execute
from tests.conftest import run_config

RESULT = "MULTINODE-RESULT "  # marks the result line among Ray's log lines
NODE_CPUS = 2  # each worker node alone can host every stage actor plus I/O tasks


def main(input_uri: str, output_uri: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        run_on(cluster, input_uri, output_uri)
    finally:
        ray.shutdown()
        cluster.shutdown()


def run_on(cluster: Cluster, input_uri: str, output_uri: str) -> None:
    workers = [cluster.add_node(num_cpus=NODE_CPUS) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, runtime_env={"env_vars": WORKER_ENV}, logging_level="WARNING")
    removed: list[str] = []

    def remove_embed_node(stats: object) -> None:
        if removed:
            return
        name = actor_name("multi1", "embed/cpu/0")
        node_id = next(
            a.node_id for a in list_actors(filters=[("name", "=", name)]) if a.state == "ALIVE"
        )
        node = next(w for w in workers if w.node_id == node_id)
        cluster.remove_node(node, allow_graceful=False)
        removed.append(node_id)

    cfg = run_config(**{"run.run_id": "multi1", "run.batch_size": 2})
    summary = execute(cfg, input_uri, output_uri, on_batch=remove_embed_node)
    print(
        RESULT
        + json.dumps(
            {
                "removed": removed,
                "batches": summary.batches,
                "errors": summary.errors,
                "documents": summary.documents,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
