"""Spill calls sized for the CPU replica (pipeline/run/slices.py): slicing on against off.

Both pools are **modelled** so the measurement is the dispatcher and the driver, not this
machine's two cores: GPU replicas sleep ``--gpu-s`` per sentence (``[faults]
gpu_model_s_per_sentence``), CPU replicas ``--cpu-s`` per sentence (``[faults]
cpu_model_s_per_sentence``), ``--cpu-replicas`` of them per model stage, each holding
0.1 CPU (they sleep; the cores stay free for the driver, Ray and the I/O tasks). Every
stage is modelled, the sentencizer's GPU replicas too (``gpu_model_rule_based``). One
logical GPU, ``spill = "auto"``, ``batch_size = "auto"`` (``--batch-bytes`` of text a
batch), one-sentence documents. The same corpus runs with ``run.spill_slicing`` on and
off, alternating, ``--rounds`` times, in one Ray session.

Reported per run: processing seconds and documents/s (the manifest's), the batches each
pool served per stage (spill share), the embed CPU pool's calls and their mean service time
(the executor's dispatch record) against the embed GPU replica's, and the driver's CPU.

    .venv/bin/python bench/spill_slices.py --docs 131072 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import load_average, machine_lines, md_row  # noqa: E402
from bench.driver_cost import corpus, cpu_s  # noqa: E402
from docintel.actors.runner import execute  # noqa: E402
from docintel.pipeline.config import load_config  # noqa: E402

STAGES = ("sentencize", "embed", "classify")


class _Dispatch(logging.Handler):
    """Keeps the executor's end-of-run dispatch record (per-replica calls and times)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.replicas: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, "replicas"):
            self.replicas = record.__dict__["replicas"]


def run(path: Path, out: Path, args: argparse.Namespace, slicing: bool, tag: str) -> list[str]:
    o: dict[str, Any] = {
        "run.run_id": tag,
        "run.spill": "auto",
        "run.spill_slicing": slicing,
        "run.batch_size": "auto",
        "run.gpu_batch_bytes": args.batch_bytes,
        "run.embeddings": False,
        "run.show_progress": False,
        "run.part_target_mb": 0,
        "embed.cpu_precision": "fp32",  # never loaded (modelled); no int8 build needed
        "faults.gpu_model_s_per_sentence": args.gpu_s,
        "faults.cpu_model_s_per_sentence": args.cpu_s,
        "faults.gpu_model_rule_based": True,
    }
    for stage in STAGES:
        o[f"resources.{stage}.gpu_replicas"] = 1
        o[f"resources.{stage}.gpu_cpus"] = 0.0
        # the sentencizer (never sliced: its results may split into pieces) keeps to its
        # modelled GPU replica, so the CPU pools measured are the model stages'
        o[f"resources.{stage}.replicas"] = args.cpu_replicas if stage != STAGES[0] else 0
        o[f"resources.{stage}.cpus"] = 0.1
    handler = _Dispatch()
    logging.getLogger("docintel.actors.executor").addHandler(handler)
    logging.getLogger("docintel.actors.executor").setLevel(logging.INFO)
    c0 = cpu_s()
    s = execute(load_config(None, o), str(path), str(out))
    driver = cpu_s() - c0
    logging.getLogger("docintel.actors.executor").removeHandler(handler)
    backends = json.loads((out / "_manifest.json").read_text())["backends"]
    reps = {r["replica"]: r for r in handler.replicas}
    cpu = [r for k, r in reps.items() if k.startswith("embed/cpu/")]
    gpu = reps["embed/gpu/0"]
    calls = sum(r["calls"] for r in cpu)
    busy = sum(r["busy_s"] for r in cpu)
    spill = "; ".join(
        f"{st} {backends[st].get('cpu-model', 0)}/{sum(backends[st].values())}" for st in STAGES
    )
    return [
        "on" if slicing else "off",
        f"{s.processing_seconds:.1f}",
        f"{s.documents / s.processing_seconds:,.0f}",
        spill,
        str(calls),
        f"{busy / calls:.2f}" if calls else "-",
        f"{gpu['busy_s'] / max(1, gpu['calls']):.2f}",
        f"{driver:.1f}",
        load_average(),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=131_072)
    ap.add_argument("--batch-bytes", type=int, default=64 * 1024)
    ap.add_argument("--gpu-s", type=float, default=2e-4, help="GPU s per sentence")
    ap.add_argument("--cpu-s", type=float, default=2e-3, help="CPU replica s per sentence")
    ap.add_argument("--cpu-replicas", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    for line in machine_lines():
        print(line)
    with tempfile.TemporaryDirectory() as tmp:
        path = corpus(Path(tmp), args.docs, "short")
        ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
        rows = []
        for r in range(args.rounds):
            for slicing in (True, False):
                tag = f"r{r}-{'on' if slicing else 'off'}"
                rows.append(run(path, Path(tmp) / tag, args, slicing, tag))
                time.sleep(1)
        ray.shutdown()
    print(
        f"\n{args.docs:,} one-sentence documents, GPU {args.gpu_s:g} s/sentence, "
        f"{args.cpu_replicas} CPU replicas x {args.cpu_s:g} s/sentence, "
        f"batches of {args.batch_bytes // 1024} KiB of text\n"
    )
    head = [
        "slicing", "processing s", "docs/s", "batches on the CPU pool (of all)",
        "embed CPU calls", "embed CPU s/call", "embed GPU s/call", "driver CPU s", "load",
    ]  # fmt: skip
    print(md_row(head))
    print(md_row(["---"] * len(head)))
    for row in rows:
        print(md_row(row))


if __name__ == "__main__":
    main()
