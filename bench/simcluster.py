"""A local multi-node Ray cluster whose nodes stand for disjoint machines (bench/spill.py,
bench/scaleout.py).

``ray.cluster_utils.Cluster`` starts every node's processes (raylet, agents, and the
workers the raylet forks) on this host. Each stand-in node is pinned to its own cores:
the driver sets its own CPU affinity just before ``cluster.add_node`` (the raylet and
everything it starts inherit it), then restores it, on every driver thread (``add_node``
starts a driver thread or two while the affinity is narrowed). The head node declares 0
CPUs and 0 GPUs so no actor or task lands on it; its processes (GCS, the driver) float
on all cores.

Placement is verified, not assumed: :class:`NodeWatch` maps every Ray worker process to
the node whose raylet forked it, reads its CPU affinity, and samples the process titles
Ray gives workers while they run (``ray::EmbedActor``, ``ray::_read``, ``ray::write_batch``),
so a report can show which node (and core) ran which actor and which I/O task.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import ray
from ray.cluster_utils import Cluster

from bench.common import process_tree
from docintel.actors.cluster import WORKER_ENV

MIB = 2**20
# Object store per stand-in node: batches here are a few hundred KB; Ray's own test
# default is 150 MiB, a little headroom avoids spilling objects to disk.
NODE_OBJECT_STORE_MB = 256
WATCH_INTERVAL_S = 0.25  # how often NodeWatch samples worker titles (driver CPU: ~1%)
WARM_TASK_S = 1.0  # each warm-up task holds its worker this long, so all start at once


def _restore_driver_threads(cores: set[int]) -> None:
    """Every thread of this process back on ``cores`` (new ones inherited a narrowed set)."""
    for task in Path("/proc/self/task").iterdir():
        try:
            if os.sched_getaffinity(int(task.name)) != cores:
                os.sched_setaffinity(int(task.name), cores)
        except OSError:  # the thread ended meanwhile
            continue


@dataclass
class SimNode:
    role: str  # "head", "gpu0", "gpu1"..., "cpu"
    node: Any  # ray._private.node.Node
    cores: set[int]

    @property
    def node_id(self) -> str:
        return self.node.node_id

    @property
    def raylet_pid(self) -> int:
        return self.node.all_processes["raylet"][0].process.pid


@dataclass
class SimCluster:
    """Head (0 CPUs, unpinned) plus pinned stand-in nodes; ``ray.init`` connected to it."""

    cluster: Cluster
    nodes: list[SimNode] = field(default_factory=list)

    @classmethod
    def start(cls) -> SimCluster:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "num_gpus": 0, "include_dashboard": False},
        )
        sim = cls(cluster)
        sim.nodes.append(SimNode("head", cluster.head_node, os.sched_getaffinity(0)))
        return sim

    def add(self, role: str, cores: set[int], **node_args: Any) -> SimNode:
        """A node whose processes run on ``cores`` only."""
        saved = os.sched_getaffinity(0)
        node_args.setdefault("object_store_memory", NODE_OBJECT_STORE_MB * MIB)
        os.sched_setaffinity(0, cores)
        try:
            node = self.cluster.add_node(**node_args)
        finally:
            os.sched_setaffinity(0, saved)
            _restore_driver_threads(saved)
        sim = SimNode(role, node, set(cores))
        self.nodes.append(sim)
        return sim

    def connect(self) -> None:
        self.cluster.wait_for_nodes()
        ray.init(
            address=self.cluster.address,
            runtime_env={"env_vars": WORKER_ENV},
            logging_level="ERROR",
        )
        _restore_driver_threads(os.sched_getaffinity(0))

    def shutdown(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()

    def by_role(self, role: str) -> SimNode:
        return next(n for n in self.nodes if n.role == role)

    def node_lines(self) -> list[str]:
        """One line per node: declared resources, raylet pid and the cores it runs on."""
        declared = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        lines = []
        for n in self.nodes:
            res = declared.get(n.node_id, {})
            cpus, gpus = res.get("CPU", 0), res.get("GPU", 0)
            aff = sorted(psutil.Process(n.raylet_pid).cpu_affinity() or [])
            lines.append(
                f"{n.role}: node {n.node_id[:8]}, {cpus:g} CPU / {gpus:g} GPU declared, "
                f"raylet pid {n.raylet_pid} on cores {aff}"
            )
        return lines

    def role_of(self, pid: int) -> str:
        """The node whose raylet started process ``pid`` ("?" if none)."""
        raylets = {n.raylet_pid: n.role for n in self.nodes}
        try:
            for parent in psutil.Process(pid).parents():
                if parent.pid in raylets:
                    return raylets[parent.pid]
        except psutil.Error:
            return "?"
        return "?"


def affinity(pid: int) -> list[int]:
    try:
        return sorted(psutil.Process(pid).cpu_affinity() or [])
    except psutil.Error:
        return []


class NodeWatch(threading.Thread):
    """Samples, per node, the titles of its Ray worker processes and their CPU affinity.

    Ray retitles a worker while it runs a task (``ray::_read``, ``ray::write_batch``) or
    hosts an actor (``ray::EmbedActor``...), so the samples show where each kind of work
    ran. ``seen[role][title]`` counts samples; ``cores[role]`` is every affinity seen.
    """

    def __init__(self, sim: SimCluster, interval: float = WATCH_INTERVAL_S) -> None:
        super().__init__(daemon=True)
        self.sim = sim
        self.interval = interval
        self.seen: dict[str, Counter[str]] = defaultdict(Counter)
        self.cores: dict[str, set[tuple[int, ...]]] = defaultdict(set)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            for n in self.sim.nodes:
                for w in process_tree(n.raylet_pid, include_root=False):
                    try:
                        title = (w.cmdline() or [""])[0].split()[0] if w.cmdline() else ""
                        if not title.startswith("ray::"):
                            continue
                        self.seen[n.role][title.removeprefix("ray::")] += 1
                        self.cores[n.role].add(tuple(sorted(w.cpu_affinity() or [])))
                    except (psutil.Error, IndexError):
                        continue
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def lines(self) -> list[str]:
        out = []
        for role in sorted(self.seen):
            titles = ", ".join(f"{t} ({c})" for t, c in sorted(self.seen[role].items()))
            cores = " ".join(str(list(c)) for c in sorted(self.cores[role]))
            out.append(f"{role}: worker affinity {cores}; titles sampled: {titles}")
        return out


def _warm() -> int:
    # the modules a read and a write task import, so the first real ones start warm
    import docintel.pipeline.formats.parquet
    import docintel.pipeline.input.source  # noqa: F401

    time.sleep(WARM_TASK_S)
    return os.getpid()


def warm_io_workers(io_cpus: float, count: int) -> int:
    """Start ``count`` worker processes for tasks of ``io_cpus`` CPUs and import what the
    read/write tasks import, before a run: Ray starts task workers on demand, and starting
    several at once on a loaded core took ~10 s here, which is start-up, not processing.
    Returns how many distinct worker processes ran the warm-up tasks."""
    task = ray.remote(_warm).options(num_cpus=io_cpus)
    return len(set(ray.get([task.remote() for _ in range(count)])))
