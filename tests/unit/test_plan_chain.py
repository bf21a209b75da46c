"""A run resolves its stage chain once, in the plan; replicas are built from the plan.

``prepare()`` resolves ``[pipeline] stages`` (user stages imported, specs checked) once
and carries the result as ``Plan.chain``. Layouts sized again mid-run, replica builds,
split caps, artefacts and the user stages shipped to workers read that chain: here the
registry's resolver is made to fail after ``prepare()``, and all of them still work.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from docintel.pipeline import registry
from docintel.pipeline.run.layout import (
    CPU_POOL,
    ClusterShape,
    artefacts,
    build_stage,
    stage_layout,
)
from docintel.pipeline.run.plan import prepare
from docintel.pipeline.schema import SENT_INDEX
from tests.conftest import run_config, write_docs
from tests.userstage import ENTRY


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every registry.chain() call from here on, by the config's stages."""
    calls: list[str] = []
    real = registry.chain

    def counted(cfg):  # type: ignore[no-untyped-def]
        calls.append(",".join(cfg.pipeline.stages))
        return real(cfg)

    monkeypatch.setattr(registry, "chain", counted)
    return calls


def test_prepare_resolves_the_chain_once_and_replicas_build_from_it(
    user_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = run_config(**{
        "pipeline.stages": ["sentencize", ENTRY, "embed", "classify"],
        "stages.keywords.words": ["fell"],
        "embed.cpu_runtime": "torch",  # no derived artefact to build for this test
        "classify.cpu_runtime": "keras",
        "run.num_gpus": 0,
    })  # fmt: skip
    docs = write_docs(tmp_path / "docs.parquet", ["a", "b"], ["Shares fell.", "Flat."])
    calls = _counting(monkeypatch)
    p = prepare(cfg, str(docs))
    assert len(calls) == 1  # the plan's one resolution
    assert p.chain is not None and p.chain.names == p.stages
    assert p.chain.cfg is p.cfg  # bound to the plan's config (its batch size resolved)

    def resolved_again(_cfg):  # type: ignore[no-untyped-def]
        raise AssertionError("the chain was resolved again downstream of the plan")

    monkeypatch.setattr(registry, "chain", resolved_again)
    assert p.layout is not None
    built = {s: build_stage(p.chain, pools[0]) for s, pools in p.layout.items()}
    classes = {
        "sentencize": "Sentencizer", "language": "LanguageDetector", "keywords": "UserStage",
        "embed": "Embedder", "classify": "Classifier",
    }  # fmt: skip
    assert list(built) == p.chain.names  # one stage per pool, in chain order
    assert [type(s).__name__ for s in built.values()] == [classes[n] for n in p.chain.names]
    assert p.chain.names.index("keywords") < p.chain.names.index("embed")  # where listed
    assert all(pools[0].kind == CPU_POOL for pools in p.layout.values())
    # the split cap: only the stage that makes sentence rows splits its results
    caps = {s: p.chain.split_cap(s) for s in p.stages}
    assert caps == {s: cfg.run.max_batch_sentences if s == "sentencize" else 0 for s in caps}
    assert SENT_INDEX in p.chain.spec("sentencize").output_columns
    # a layout sized again (a node joined), and what it loads, from the same chain
    grown = stage_layout(p.cfg, ClusterShape.of(16), p.chain)
    assert list(grown) == p.stages
    assert artefacts(p.chain, grown) == []  # torch and keras CPU replicas: none derived
    keywords = built["keywords"]
    keywords.setup()
    out = keywords(pa.table({"text": ["Shares fell, then fell again."]}))
    assert out["keyword_hits"].to_pylist() == [2]


def test_user_stages_ship_from_the_plan(
    user_package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from docintel.actors import cluster

    chain = registry.chain(
        run_config(**{"pipeline.stages": ["sentencize", "embed", "classify", ENTRY]})
    )
    shipped: list[str] = []
    monkeypatch.setattr(
        cluster.ray.cloudpickle, "register_pickle_by_value", lambda m: shipped.append(m.__name__)
    )
    monkeypatch.setattr(registry, "chain", lambda _cfg: pytest.fail("resolved again"))
    cluster._ship_user_stages(chain)
    assert shipped == [ENTRY.partition(":")[0]]
