"""Classifier heads from the command line: a head trained on another encoder is refused
before anything is built from it, and `docintel train` says what its calibration reached
and when its hold-out was too small to trust."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from docintel.pipeline.artefacts.paths import CACHE_ENV, TRAINING_FILE
from docintel.pipeline.artefacts.versions import fingerprint
from docintel.pipeline.offline.calibration import MIN_CALIBRATION_ROWS
from docintel.pipeline.stages.embed_settings import EmbedConfig
from tests.cli.test_cli import docintel
from tests.conftest import REPO, VALID_CSV, write_docs

OTHER_ENCODER = "other_minilm@0123456789ab"


def test_a_head_of_another_encoder_is_refused_before_any_build(tmp_path: Path) -> None:
    head = tmp_path / "head"
    shutil.copytree(REPO / "models" / "finsent", head)
    training = json.loads((head / TRAINING_FILE).read_text())
    (head / TRAINING_FILE).write_text(json.dumps({**training, "embedder": OTHER_ENCODER}))
    cache = tmp_path / "cache"  # empty: every derived artefact this run needs is missing
    inp = write_docs(tmp_path / "in.parquet", ["a"], ["Profit rose."])
    r = docintel("run", inp, tmp_path / "out", "--model", head, **{CACHE_ENV: str(cache)})
    assert r.returncode == 2, r.stderr[-3000:]
    err = " ".join(r.stderr.split())
    encoder = fingerprint(EmbedConfig().resolved_model_path())
    assert OTHER_ENCODER in err and encoder in err, err
    assert "building" not in err and "Traceback" not in err
    built = [p.relative_to(cache) for p in cache.rglob("*") if "logs" not in p.parts]
    assert not built, f"built before the refusal: {built}"
    assert not (tmp_path / "out").exists()


def test_train_prints_its_ece_and_warns_of_a_small_holdout(tmp_path: Path) -> None:
    data = tmp_path / "small.csv"
    pd.read_csv(VALID_CSV).groupby("label").head(20).to_csv(data, index=False)  # 60 rows
    model = tmp_path / "clf"
    r = docintel("train", data, "--out", model, "--head", "linear", "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    record = json.loads((model / TRAINING_FILE).read_text())["calibration"]
    n = record["n"]
    assert n < MIN_CALIBRATION_ROWS
    line = f"ECE {record['ece_before']:.4f} before, {record['ece_after']:.4f} after"
    assert line in " ".join(r.stdout.split()) and f"fitted on {n} holdout rows" in r.stdout
    err = " ".join(r.stderr.split())
    assert f"warning: the calibration hold-out has only {n} rows" in err
    assert f"(under {MIN_CALIBRATION_ROWS})" in err
