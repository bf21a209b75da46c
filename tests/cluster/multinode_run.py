"""Run docintel on a local multi-node Ray cluster and change the cluster mid-run.

Used by test_multinode.py in its own process (one Ray per process). Modes:

* ``remove``: a head (no CPUs) and two 2-CPU workers; the node of the embed actor is
  removed after the first batch;
* ``join-gpu``: a head (no CPUs) and one 2-CPU worker; a worker with one logical GPU
  joins after the first batch (its GPU replicas run on the CPU, labelled gpu-sim).

Prints a JSON line with what happened.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from docintel.actors.cluster import WORKER_ENV, actor_name
from docintel.actors.runner import execute
from tests.conftest import run_config

RESULT = "MULTINODE-RESULT "  # marks the result line among Ray's log lines
NODE_CPUS = 2  # each worker node alone can host every stage actor plus I/O tasks


def main(mode: str, input_uri: str, output_uri: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        {"remove": remove_on, "join-gpu": join_on}[mode](cluster, input_uri, output_uri)
    finally:
        ray.shutdown()
        cluster.shutdown()


def _connect(cluster: Cluster) -> None:
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, runtime_env={"env_vars": WORKER_ENV}, logging_level="WARNING")


def _report(summary: object, output_uri: str, **more: object) -> None:
    manifest = json.loads((Path(output_uri) / "_manifest.json").read_text())
    print(
        RESULT
        + json.dumps(
            {
                "batches": summary.batches,  # type: ignore[attr-defined]
                "errors": summary.errors,  # type: ignore[attr-defined]
                "documents": summary.documents,  # type: ignore[attr-defined]
                "replicas": manifest["replicas"],
                "backends": manifest["backends"],
                **more,
            }
        )
    )


def remove_on(cluster: Cluster, input_uri: str, output_uri: str) -> None:
    workers = [cluster.add_node(num_cpus=NODE_CPUS) for _ in range(2)]
    _connect(cluster)
    removed: list[str] = []

    def remove_embed_node(stats: object) -> None:
        if removed:
            return
        replica = ray.get_actor(actor_name("multi1", "embed/cpu/0"))
        node_id = ray.get(replica.ready.remote())["node"]  # the node the replica runs on
        node = next(w for w in workers if w.node_id == node_id)
        cluster.remove_node(node, allow_graceful=False)
        removed.append(node_id)

    cfg = run_config(**{"run.run_id": "multi1", "run.batch_size": 2})
    summary = execute(cfg, input_uri, output_uri, on_batch=remove_embed_node)
    _report(summary, output_uri, removed=removed)


def join_on(cluster: Cluster, input_uri: str, output_uri: str) -> None:
    cluster.add_node(num_cpus=NODE_CPUS)
    _connect(cluster)
    joined: list[str] = []

    def add_gpu_node(stats: object) -> None:
        if not joined:
            joined.append(cluster.add_node(num_cpus=NODE_CPUS, num_gpus=1).node_id)

    # auto pools (the default): the run starts with CPU pools only, sized to the 2-CPU
    # worker; the GPU node must get GPU replicas of every stage while the run goes on.
    # embed's max_replicas = 2 is more CPU encoder replicas than the first worker holds:
    # the second waits as a pending actor (autoscaler demand) and is placed on the new node
    cfg = run_config(
        **{"run.run_id": "join1", "run.batch_size": 4, "resources.embed.max_replicas": 2}
        | {f"resources.{s}.gpu_replicas": "auto" for s in ("sentencize", "embed", "classify")}
    )
    summary = execute(cfg, input_uri, output_uri, on_batch=add_gpu_node)
    _report(summary, output_uri, joined=joined)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
