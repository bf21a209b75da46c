"""`docintel run --classifier NAME=DIR`: bad heads are refused with exit 2 before any work,
naming the head; `--help` documents the option."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from docintel.pipeline.artefacts.paths import TRAINING_FILE
from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.stages.embed_settings import EmbedConfig
from tests.cli.test_cli import docintel
from tests.conftest import REPO, write_docs

OTHER_ENCODER = "other_minilm@0123456789ab"


def test_bad_heads_are_refused_before_any_work(tmp_path: Path) -> None:
    head = tmp_path / "topic"
    shutil.copytree(REPO / "models" / "finsent_ft", head, ignore=shutil.ignore_patterns("encoder"))
    foreign = tmp_path / "foreign"
    shutil.copytree(head, foreign)
    training = json.loads((foreign / TRAINING_FILE).read_text())
    (foreign / TRAINING_FILE).write_text(json.dumps({**training, "embedder": OTHER_ENCODER}))
    config = tmp_path / "docintel.toml"
    config.write_text(f'[classify.heads]\ntopic = "{head}"\n')
    inp = write_docs(tmp_path / "in.parquet", ["a"], ["Profit rose."])
    out = tmp_path / "out"
    encoder = fingerprint(EmbedConfig().resolved_model_path())
    cases = {
        # the config's head again on the command line, in another case
        ("--config", config, "--classifier", f"Topic={head}"): ["'Topic'", "already declared"],
        ("--classifier", f"top={head}"): ["'top'", "top_label"],  # documents' top_label
        ("--classifier", f"risk={tmp_path / 'gone'}"): ["risk", "does not exist"],
        ("--classifier", f"risk={foreign}"): [OTHER_ENCODER, encoder, str(foreign)],
        ("--classifier", "risk"): ["NAME=DIR"],
    }
    for args, said in cases.items():
        r = docintel("run", inp, out, *args)
        err = " ".join(r.stderr.split())
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert all(s in err for s in said), (args, err)
        assert "Traceback" not in err and not out.exists(), args
    r = docintel("run", "--help")
    assert r.returncode == 0 and "--classifier" in r.stdout and "N_label" in r.stdout
