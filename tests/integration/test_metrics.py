"""Live metrics: a run's per-stage counters and gauges, read back from Ray's Prometheus
endpoint (the one the dashboard and a Prometheus scrape read)."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import ray

from docintel.actors.runner import execute
from docintel.pipeline import registry
from tests.conftest import run_config, write_docs

EXPORT_WAIT_S = 60  # Ray's agents push metrics every few seconds


def _scrape() -> str:
    node = next(n for n in ray.nodes() if n.get("Alive"))
    url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _samples(text: str, name: str, run_id: str) -> dict[str, float]:
    """``{labels: value}`` of one metric's samples for this run."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and f'run="{run_id}"' in line:
            labels, _, value = line.rpartition(" ")
            out[labels] = float(value)
    return out


def _label(labels: str, key: str) -> str:
    m = re.search(rf'{key}="([^"]*)"', labels)
    return m.group(1) if m else ""


def test_run_metrics_reach_rays_prometheus_endpoint(
    tmp_path: Path, ray_cluster: None, headlines: list[str]
) -> None:
    ids = [f"m{i:02d}" for i in range(20)]
    inp = write_docs(tmp_path / "in.parquet", ids, headlines[:20], row_group_size=4)
    cfg = run_config(**{"run.run_id": "metrics1", "run.embeddings": False})
    summary = execute(cfg, str(inp), str(tmp_path / "out"))
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())

    deadline = time.monotonic() + EXPORT_WAIT_S
    while True:
        text = _scrape()
        batches = _samples(text, "ray_docintel_batches_total", "metrics1")
        docs = _samples(text, "ray_docintel_documents_total", "metrics1")
        written = sum(docs.values())
        if (batches and written == summary.documents) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert written == summary.documents == 20
    stages = registry.chain(cfg).names
    per_stage = {_label(k, "stage"): v for k, v in batches.items()}
    assert per_stage == dict.fromkeys(stages, summary.batches)
    assert all(_label(k, "pool") == "cpu" for k in batches)
    sentences = _samples(text, "ray_docintel_sentences_total", "metrics1")
    assert {_label(k, "stage"): v for k, v in sentences.items()}["embed"] == summary.sentences
    # the gauges exist for the run: replicas per pool, busy fraction per replica
    replicas = _samples(text, "ray_docintel_replicas", "metrics1")
    assert {_label(k, "stage") for k, v in replicas.items() if v >= 1} == set(stages)
    busy = _samples(text, "ray_docintel_replica_busy_fraction", "metrics1")
    assert busy and all(0.0 <= v <= 1.0 for v in busy.values())
    # the manifest lists the same replicas, with what each served
    served = {r["stage"]: r["batches"] for r in manifest["replicas"]}
    assert served == dict.fromkeys(stages, summary.batches)
    assert all(r["node"] and r["joined"] and r["left"] for r in manifest["replicas"])
