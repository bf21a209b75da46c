"""Benchmark: fine-tuning the encoder (`docintel train --fine-tune`), full vs LoRA, against
the frozen-encoder head.

Each method is trained by the documented command itself, in its own process, on
``sent_train.csv`` (the hold-out that selects epochs is carved from it):

    docintel train data/twitter_fin_sentiment/sent_train.csv --out WORK/<method> \\
        --label-names Bearish,Bullish,Neutral --fine-tune --method <method> --encoder stock

and evaluated on ``sent_valid.csv`` (never used for training or selection) with the
encoder it wrote. The baseline is the frozen stock MiniLM with its head
(``models/finsent``, trained by the same command without ``--fine-tune``; its training
minutes come from its training.json). Reported per model: training minutes (wall, the
whole command: fine-tuning, embedding, head), MB it ships (encoder folder + head files),
hold-out and validation macro-F1, accuracy, per-class precision/recall/F1, and the
macro-F1 gained over the frozen baseline per minute of training and per MB shipped.

Run from the repository root (about 10-20 minutes per method on 2 cores):

    .venv/bin/python bench/finetune.py --output-md bench/finetune_table.md
    .venv/bin/python bench/finetune.py --reuse     # table again from WORK, no training
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "data" / "twitter_fin_sentiment" / "sent_train.csv"
VALID = REPO / "data" / "twitter_fin_sentiment" / "sent_valid.csv"
LABELS = "Bearish,Bullish,Neutral"
FROZEN = REPO / "models" / "finsent"
HEAD_FILES = ("model.keras", "labels.json", "training.json", "metrics.json")


def shipped_mb(model_dir: Path) -> float:
    """Bytes a model folder ships: the head files and its encoder folder, if any."""
    files = [model_dir / f for f in HEAD_FILES if (model_dir / f).is_file()]
    encoder = model_dir / "encoder"
    if encoder.is_dir():
        files += [p for p in encoder.iterdir() if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e6


def train(method: str, out: Path, epochs: int, seed: int) -> dict[str, float]:
    """Run the documented training command in a fresh process: its wall minutes and its
    CPU minutes (user + system of every thread: what the training costs, whatever else
    loads the machine)."""
    cmd = [
        sys.executable, "-m", "docintel.jobs.cli", "train", str(TRAIN), "--out", str(out),
        "--label-names", LABELS, "--fine-tune", "--method", method, "--encoder", "stock",
        "--epochs", str(epochs), "--seed", str(seed),
    ]  # fmt: skip
    print("$", " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "COLUMNS": "120"})
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    wall = (time.perf_counter() - t0) / 60
    return {"wall_min": wall, "cpu_min": (usage.ru_utime + usage.ru_stime) / 60}


def step_speed(methods: list[str], steps: int, rounds: int) -> dict[str, Any]:
    """Training examples/s of each method, measured fairly: the same batches of real
    tweets, ``steps`` optimiser steps per method per round, methods alternating for
    ``rounds`` rounds (the order rotating), after one untimed warm-up step each. The
    per-round ratio to the first method holds even when other jobs load the machine;
    whole training runs' wall and CPU minutes do not."""
    import statistics

    import numpy as np
    import torch
    import transformers
    from transformers import AutoTokenizer

    transformers.logging.disable_progress_bar()

    from docintel.pipeline.artefacts.paths import stock_encoder_dir
    from docintel.pipeline.offline import finetune as ft
    from docintel.pipeline.offline.train import load_labelled
    from docintel.pipeline.stages.base import usable_cores
    from docintel.pipeline.stages.embed import load_encoder

    texts, raw = load_labelled(TRAIN)
    base = stock_encoder_dir()
    tok = AutoTokenizer.from_pretrained(str(base))
    torch.set_num_threads(usable_cores())
    runs = {}
    # the training loop of `docintel train --fine-tune` itself (its private helpers, on
    # purpose: a copy here could drift from what the command runs)
    for m in methods:
        params = ft.FineTuneParams(method=m)
        encoder = load_encoder(base)
        if m == "lora":
            encoder = ft._with_lora(encoder, params, "stock")
        tuner = ft._Tuner(encoder, 3, tok.pad_token_id or 0, 0)
        opt, schedule = ft._optimizer(tuner, params, 10_000)
        runs[m] = ft._Loop(
            tuner, opt, schedule, ft._tokenize(tok, texts, params.max_length),
            torch.as_tensor(np.array([int(v) for v in raw])), None, params, ft._Quiet(),
        )  # fmt: skip
        tuner.train(True)
    batch = runs[methods[0]].params.batch_size
    rng = np.random.default_rng(0)
    rates: dict[str, list[float]] = {m: [] for m in methods}
    for r in range(rounds + 1):  # round 0 is a warm-up, not reported
        order = rng.permutation(len(texts))[: (steps if r else 1) * batch]
        for m in methods[r % len(methods) :] + methods[: r % len(methods)]:
            _, rate = runs[m].epoch(r, order)
            if r:
                rates[m].append(rate)
    ref = methods[0]
    return {
        m: {
            "examples_per_s": statistics.median(v),
            f"vs_{ref}": statistics.median(x / y for x, y in zip(v, rates[ref], strict=True)),
        }
        for m, v in rates.items()
    }


def evaluate(model_dir: Path, encoder: str) -> dict[str, Any]:
    from docintel.pipeline.config import EmbedConfig
    from docintel.pipeline.offline.train import evaluate as do_evaluate

    return do_evaluate(model_dir, VALID, EmbedConfig(model_path=encoder))


def row(
    name: str, model_dir: Path, minutes: dict[str, float], valid: dict[str, Any]
) -> dict[str, Any]:
    holdout = json.loads((model_dir / "metrics.json").read_text())
    training = json.loads((model_dir / "training.json").read_text())
    tuned = training.get("fine_tune", {})
    return {
        "model": name,
        "minutes": round(minutes["wall_min"], 2),
        "cpu_minutes": round(minutes["cpu_min"], 2) if "cpu_min" in minutes else None,
        "mb": round(shipped_mb(model_dir), 2),
        "holdout_macro_f1": holdout["macro_f1"],
        "valid": valid,
        "best_epoch": tuned.get("best_epoch"),
        "curve": [
            {k: e[k] for k in ("epoch", "train_loss", "holdout_loss", "holdout_macro_f1")}
            for e in tuned.get("epochs", [])
        ],
        "fine_tune_minutes": round(tuned.get("seconds", 0.0) / 60, 2),
        "examples_per_s": [e["examples_per_s"] for e in tuned.get("epochs", [])],
        "embedder": training["embedder"],
        "method": tuned.get("method", ""),
        "examples_tuned": training["train_rows"] * len(tuned.get("epochs", [])),
    }


HEAD_MIN = 1.0  # embedding the training file + fitting the head, quiet machine (docs/models.md)


def est_minutes(r: dict[str, Any], speed: dict[str, Any]) -> float | None:
    """Training minutes on a quiet machine: the fine-tuning's examples at the interleaved
    step speed, plus the head. Whole runs' wall and CPU minutes move with other jobs (and
    with spin-waiting threads under contention); the step speed is measured fairly."""
    rate = speed.get(r["method"], {}).get("examples_per_s") if r["method"] else None
    if not rate:
        return None
    return r["examples_tuned"] / rate / 60 + HEAD_MIN


def table(rows: list[dict[str, Any]], speed: dict[str, Any]) -> str:
    base = rows[0]["valid"]["macro_f1"]
    head = (
        "| model | wall min (as run) | CPU min (as run) | step speed, ex/s | est. train min "
        "| MB shipped | hold-out macro-F1 | valid accuracy | valid macro-F1 | F1 Bearish "
        "| F1 Bullish | F1 Neutral | +F1 / est. min | +F1 / MB |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        v, gain = r["valid"], r["valid"]["macro_f1"] - base
        per = [f"{v['per_class'][n]['f1']:.3f}" for n in LABELS.split(",")]
        tuned = bool(r["method"])
        cpu, est = r["cpu_minutes"], est_minutes(r, speed)
        rate = speed.get(r["method"], {}).get("examples_per_s") if tuned else None
        cells = [
            r["model"],
            f"{r['minutes']:.1f}",
            f"{cpu:.1f}" if cpu else "n/a",
            f"{rate:.1f}" if rate else "",
            f"{est:.1f}" if est else "",
            f"{r['mb']:.1f}",
            f"{r['holdout_macro_f1']:.4f}",
            f"{v['accuracy']:.4f}",
            f"{v['macro_f1']:.4f}",
            *per,
            f"{gain / est:+.4f}" if tuned and est else "",
            f"{gain / r['mb']:+.4f}" if tuned else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    per_class = [
        "",
        "| model | class | precision | recall | F1 | support |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        for n, c in r["valid"]["per_class"].items():
            per_class.append(
                f"| {r['model']} | {n} | {c['precision']:.3f} | {c['recall']:.3f} "
                f"| {c['f1']:.3f} | {c['support']} |"
            )
    curves = ["", "| model | epoch | train loss | hold-out loss | hold-out macro-F1 |"]
    curves.append("|---|---:|---:|---:|---:|")
    for r in rows:
        for e in r["curve"]:
            curves.append(
                f"| {r['model']} | {e['epoch']} | {e['train_loss']:.4f} | "
                f"{e['holdout_loss']:.4f} | {e['holdout_macro_f1']:.4f} |"
            )
    return head + "\n".join(lines) + "\n" + "\n".join(per_class) + "\n" + "\n".join(curves) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="full,lora", help="comma-separated: full, lora")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/docintel-bench-finetune"))
    ap.add_argument("--reuse", action="store_true", help="evaluate what WORK holds, no training")
    ap.add_argument("--output-md", type=Path, help="also write the tables to this file")
    ap.add_argument(
        "--speed-steps", type=int, default=0, help="also time N training steps per method"
    )
    ap.add_argument("--speed-rounds", type=int, default=3)
    args = ap.parse_args()
    speed_file = args.work / "speed.json"
    if args.speed_steps:
        args.work.mkdir(parents=True, exist_ok=True)
        speed = step_speed(args.methods.split(","), args.speed_steps, args.speed_rounds)
        speed_file.write_text(json.dumps(speed, indent=2) + "\n")
    speed = json.loads(speed_file.read_text()) if speed_file.is_file() else {}
    args.work.mkdir(parents=True, exist_ok=True)
    minutes_file = args.work / "minutes.json"
    minutes: dict[str, Any] = {}
    if minutes_file.is_file():  # {method: wall minutes} (older files) or {wall_min, cpu_min}
        for k, v in json.loads(minutes_file.read_text()).items():
            minutes[k] = v if isinstance(v, dict) else {"wall_min": v}
    for method in args.methods.split(","):
        if not (args.reuse and (args.work / method / "training.json").is_file()):
            minutes[method] = train(method, args.work / method, args.epochs, args.seed)
            minutes_file.write_text(json.dumps(minutes, indent=2) + "\n")
    frozen_min = {  # measured when it was trained: wall only (CPU time was not recorded)
        "wall_min": json.loads((FROZEN / "training.json").read_text())["seconds"]["total"] / 60
    }
    rows = [
        row("frozen MiniLM + head (models/finsent)", FROZEN, frozen_min, evaluate(FROZEN, "stock"))
    ]
    for method in args.methods.split(","):
        d = args.work / method
        rows.append(row(f"fine-tuned, {method}", d, minutes[method], evaluate(d, "")))
    (args.work / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    md = table(rows, speed)
    env = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; sent_valid.csv n={rows[0]['valid']['n']:,}"
    )
    print(md + "\n" + env)
    if args.output_md:
        args.output_md.write_text(md + "\n" + env + "\n")


if __name__ == "__main__":
    main()
