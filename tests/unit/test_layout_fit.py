"""A 2-core machine runs five stages: the light stages' CPU shares shrink to fit (issue
32/35: parse and redaction beside the three), the default chain keeps its shares, and a
share the user set is never changed."""

from __future__ import annotations

from docintel.pipeline.config import load_config
from docintel.pipeline.run.layout import CPU_POOL, ClusterShape, stage_layout


def _cpus(layout: dict) -> dict[str, float]:
    return {
        s: sum(p.cpus * p.replicas for p in ps if p.kind == CPU_POOL) for s, ps in layout.items()
    }


def test_the_default_chain_keeps_its_shares() -> None:
    assert _cpus(stage_layout(load_config(), ClusterShape.of(2))) == {
        "sentencize": 0.25, "language": 0.25, "embed": 1.0, "classify": 0.25,
    }  # fmt: skip


def test_five_stages_fit_two_cores_with_the_light_ones_squeezed() -> None:
    cfg = load_config(None, {"input.kind": "documents", "privacy.redact": True})
    cpus = _cpus(stage_layout(cfg, ClusterShape.of(2)))
    assert list(cpus) == ["parse", "sentencize", "privacy", "language", "embed", "classify"]
    assert cpus["embed"] == 1.0  # the heavy stage keeps its share
    assert sum(cpus.values()) + cfg.resources.io_cpus <= 2.0
    assert all(0.05 <= v < 0.25 for s, v in cpus.items() if s != "embed")


def test_a_share_the_user_set_is_kept() -> None:
    over = {"input.kind": "documents", "privacy.redact": True, "resources.parse.cpus": 0.5}
    cpus = _cpus(stage_layout(load_config(None, over), ClusterShape.of(2)))
    assert cpus["parse"] == 0.5 and cpus["sentencize"] < 0.25


def test_what_cannot_fit_even_squeezed_is_left_as_it_was() -> None:
    """Nothing is shrunk when shrinking cannot make it fit: the run's start check then
    refuses the layout with its real sizes (actors/resources.py)."""
    cfg = load_config(None, {"resources.embed.cpus": 2.0})
    assert _cpus(stage_layout(cfg, ClusterShape.of(2)))["sentencize"] == 0.25
