"""Real caps on a real GPU: torch's fraction holds, TF does not map the whole card, and all
three stages share one GPU. Run with `pytest -m gpu tests/gpu` on a CUDA machine."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import REPO

PROBE = textwrap.dedent(
    """
    import json, sys
    import torch
    from docintel.pipeline.config import ClassifyConfig, EmbedConfig, SentencizeConfig
    from docintel.pipeline.stages.base import Placement
    from docintel.pipeline.stages.classify import Classifier
    from docintel.pipeline.stages.embed import Embedder
    from docintel.pipeline.stages.sentencize import Sentencizer
    kind, fraction = sys.argv[1], float(sys.argv[2])
    place = Placement("gpu", fraction)
    stage = {"embed": lambda: Embedder(EmbedConfig(), placement=place),
             "classify": lambda: Classifier(ClassifyConfig(), placement=place),
             "sentencize": lambda: Sentencizer(SentencizeConfig(), place)}[kind]()
    stage.setup()
    total = torch.cuda.get_device_properties(0).total_memory
    out = {"backend": stage.backend, "total": total}
    if kind == "embed":
        try:  # more than the fraction must fail
            torch.empty(int(total * (fraction + 0.1)), dtype=torch.uint8, device="cuda")
            out["over_fraction_allocated"] = True
        except torch.OutOfMemoryError:
            out["over_fraction_allocated"] = False
    if kind == "classify":
        import tensorflow as tf
        out["tf_limit_mb"] = tf.config.get_logical_device_configuration(
            tf.config.list_physical_devices("GPU")[0])[0].memory_limit
    print("RESULT " + json.dumps(out))
    """
)


def _probe(kind: str, fraction: float) -> dict:
    import json

    r = subprocess.run(
        [sys.executable, "-c", PROBE, kind, str(fraction)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_torch_fraction_holds() -> None:
    out = _probe("embed", 0.5)
    assert out["backend"] in {"gpu-bf16", "gpu-fp16"}
    assert out["over_fraction_allocated"] is False


def test_tensorflow_is_capped_to_its_fraction() -> None:
    out = _probe("classify", 0.25)
    assert out["backend"] == "gpu-fp32"
    assert out["tf_limit_mb"] <= 0.25 * out["total"] / 2**20 + 1


def test_three_stages_share_one_gpu(tmp_path) -> None:
    from tests.conftest import write_docs

    inp = write_docs(tmp_path / "in.parquet", ["a", "b"], ["Sales rose. Costs fell.", "Ok."])
    cmd = [
        sys.executable,
        "-m",
        "docintel.jobs.cli",
        "run",
        str(inp),
        str(tmp_path / "out"),
        "--gpus",
        "1",
        "--spill",
        "gpu-only",
        "--config",
        str(tmp_path / "c.toml"),
    ]
    (tmp_path / "c.toml").write_text(
        "".join(f"[resources.{s}]\ngpu_replicas = 1\n" for s in ("sentencize", "embed", "classify"))
    )
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    import pandas as pd

    sents = pd.read_parquet(tmp_path / "out" / "sentences")
    assert set(sents.embed_backend) <= {"gpu-bf16", "gpu-fp16"}
    assert set(sents.classify_backend) == {"gpu-fp32"}
