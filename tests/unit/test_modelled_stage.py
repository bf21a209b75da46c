"""ModelledStage ([faults] gpu_model_s_per_sentence, bench/scaleout.py): a GPU replica of
embed/classify that loads no model, sleeps its modelled time and returns what the real
stage returns, column for column and type for type."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pytest

from docintel.pipeline import registry
from docintel.pipeline.config import load_config
from docintel.pipeline.run.layout import build_stage, stage_layout
from docintel.pipeline.schema import BACKEND_CPU_MODEL, BACKEND_GPU_MODEL, TEXT
from docintel.pipeline.stages.classify import Classifier
from docintel.pipeline.stages.embed import Embedder
from docintel.pipeline.stages.faults import MODELLED_VERSION, ModelledStage
from docintel.pipeline.stages.sentencize import Sentencizer
from tests.conftest import REPO

S_PER_SENTENCE = 0.01


def _config(seconds: float = S_PER_SENTENCE, spill: str = "auto"):
    overrides: dict[str, object] = {
        "run.spill": spill,
        "faults.gpu_model_s_per_sentence": seconds,
        "embed.cpu_precision": "fp32",
    }
    for stage in ("sentencize", "embed", "classify"):
        overrides[f"resources.{stage}.gpu_replicas"] = 1
    return load_config(None, overrides)


def _stages(cfg) -> dict[tuple[str, str], object]:
    """(stage, pool kind) -> the stage object build_stage gives that pool's replicas."""
    chain = registry.chain(cfg)
    layout = stage_layout(cfg, None, chain)
    return {(s, p.kind): build_stage(chain, p) for s, pools in layout.items() for p in pools}


def test_only_gpu_replicas_of_the_model_stages_are_modelled() -> None:
    built = _stages(_config())
    assert isinstance(built["embed", "gpu"], ModelledStage)
    assert isinstance(built["classify", "gpu"], ModelledStage)
    assert isinstance(built["sentencize", "gpu"], Sentencizer)  # rule-based: runs for real
    assert not isinstance(built["embed", "cpu"], ModelledStage)
    assert not isinstance(built["classify", "cpu"], ModelledStage)
    off = _stages(_config(seconds=0.0))
    assert isinstance(off["embed", "gpu"], Embedder)
    assert isinstance(off["classify", "gpu"], Classifier)


def test_cpu_replicas_are_modelled_on_their_own_setting() -> None:
    cfg = _config(seconds=0.0).with_overrides({"faults.cpu_model_s_per_sentence": 0.002})
    built = _stages(cfg)
    for stage in ("embed", "classify"):
        cpu = built[stage, "cpu"]
        assert isinstance(cpu, ModelledStage) and cpu.seconds_per_sentence == 0.002
        cpu.setup()
        assert cpu.backend == BACKEND_CPU_MODEL and cpu.version == MODELLED_VERSION
    assert isinstance(built["embed", "gpu"], Embedder)  # the GPU pool is not
    assert isinstance(built["sentencize", "cpu"], Sentencizer)  # rule-based: runs for real


def test_outputs_match_the_real_stages_columns_and_types(embedder, classifier) -> None:
    built = _stages(_config(seconds=0.0005))
    texts = ["Revenue rose 4% in the quarter.", "Shares fell.", "Guidance is unchanged."]
    table = pa.table({TEXT: texts})
    fake_embed, fake_classify = built["embed", "gpu"], built["classify", "gpu"]
    fake_embed.setup()
    fake_classify.setup()

    real_e, fake_e = embedder(table), fake_embed(table)
    assert fake_e.schema == real_e.schema
    assert fake_e.num_rows == real_e.num_rows == len(texts)
    assert fake_embed.output_columns == embedder.output_columns
    real_c, fake_c = classifier(real_e), fake_classify(fake_e)
    assert fake_c.schema == real_c.schema
    assert fake_classify.output_columns == classifier.output_columns
    assert set(fake_c["label"].to_pylist()) <= set(classifier.labels)
    # unit vectors and probabilities that sum to one, like the real outputs
    for row in fake_e["embedding"].to_pylist():
        assert sum(x * x for x in row) == pytest.approx(1.0, rel=1e-5)
    for row in fake_c["probs"].to_pylist():
        assert sum(row) == pytest.approx(1.0, rel=1e-5)
    for stage in (fake_embed, fake_classify):
        assert (stage.backend, stage.version) == (BACKEND_GPU_MODEL, MODELLED_VERSION)
    # an empty batch (documents without sentences) keeps the schema too
    assert fake_embed(table.slice(0, 0)).schema == real_e.schema


def test_a_call_sleeps_rows_times_the_modelled_time() -> None:
    stage = _stages(_config())["embed", "gpu"]
    stage.setup()
    rows = 20
    t0 = time.perf_counter()
    stage(pa.table({TEXT: ["x."] * rows}))
    elapsed = time.perf_counter() - t0
    assert rows * S_PER_SENTENCE <= elapsed < rows * S_PER_SENTENCE + 1.0  # host may be loaded


PROBE = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    from docintel.pipeline.config import load_config
    from docintel.pipeline import registry
    from docintel.pipeline.run.layout import build_stage, stage_layout
    cfg = load_config(None, {"run.spill": "gpu-only", "faults.gpu_model_s_per_sentence": 0.001,
        **{f"resources.{s}.gpu_replicas": 1 for s in ("sentencize", "embed", "classify")}})
    chain = registry.chain(cfg)
    layout = stage_layout(cfg, None, chain)
    embed, classify = (build_stage(chain, layout[s][0]) for s in ("embed", "classify"))
    embed.setup(); classify.setup()
    out = classify(embed(pa.table({"text": ["One.", "Two."]})))
    print("RESULT " + json.dumps({"rows": out.num_rows,
        "frameworks": sorted(m for m in ("torch", "tensorflow", "keras", "onnxruntime")
                             if m in sys.modules)}))
    """
)


def test_no_model_or_framework_is_loaded() -> None:
    """In a fresh process (as in a Ray actor), setup and a call import no ML framework."""
    r = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result == {"rows": 2, "frameworks": []}
