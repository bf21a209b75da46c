"""Where a demo run's start-up goes (issue 19): imports, the plan, Ray's start, the stage
actors, the first batch written. Run from the repository root with a warm artefact cache:

    .venv/bin/python bench/startup.py

With a Ray kept running (`ray start --head --num-cpus 2 --include-dashboard false`
first), Ray's start leaves the run:

    .venv/bin/python bench/startup.py --ray-address auto

Ray's own start alone, for comparison:

    .venv/bin/python -c "import ray, time; t = time.perf_counter(); \
        ray.init(num_cpus=2, include_dashboard=False); print(time.perf_counter() - t)"
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

T0 = time.perf_counter()
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from docintel.actors import cluster, runner  # noqa: E402 - timed from here
from docintel.pipeline.config import load_config  # noqa: E402

OUT = Path("/tmp/docintel-startup-out")
marks: list[tuple[str, float]] = []


def mark(what: str) -> None:
    marks.append((what, time.perf_counter() - T0))


def main() -> None:
    mark("imports")
    prepare, session, pools = runner.prepare, cluster.ray_session, cluster.stage_pools

    def timed_prepare(*a: Any, **k: Any) -> Any:
        out = prepare(*a, **k)
        mark("plan (prepare) done")
        return out

    @contextlib.contextmanager
    def timed_session(*a: Any, **k: Any) -> Iterator[None]:
        with session(*a, **k):
            mark("Ray started")
            yield

    @contextlib.contextmanager
    def timed_pools(*a: Any, **k: Any) -> Iterator[Any]:
        with pools(*a, **k) as p:
            mark("stage actors created")
            yield p

    runner.prepare, cluster.ray_session, cluster.stage_pools = (
        timed_prepare, timed_session, timed_pools,
    )  # fmt: skip
    shutil.rmtree(OUT, ignore_errors=True)
    first: list[bool] = []

    def on_batch(_stats: object) -> None:
        if not first:
            first.append(True)
            mark("first batch written")

    overrides: dict[str, Any] = {"run.show_progress": False}
    if len(sys.argv) > 2 and sys.argv[1] == "--ray-address":  # a Ray kept running
        overrides["run.ray_address"] = sys.argv[2]
    cfg = load_config(None, overrides)
    s = runner.execute(cfg, str(REPO / "data/demo/documents.parquet"), str(OUT), on_batch=on_batch)
    mark("run done")
    for what, t in marks:
        print(f"{t:6.2f} s  {what}")
    print(
        f"manifest: startup_seconds {s.startup_seconds:.2f} (to the first replica call), "
        f"models_loaded_seconds {s.models_loaded_seconds:.2f}, wall {s.wall_seconds:.2f}"
    )


if __name__ == "__main__":
    main()
