"""Encoder runtimes behind one front end: a runtime only runs the model.

A runtime registered in ``RUNTIMES`` gets tokenization, truncation, the character cut,
packing and pooling from the shared front end unchanged (shown with a model-free fake
whose vectors can be computed by hand, and with a wrapper around the ONNX runtime); every
built-in CPU runtime counts and flags the same texts identically; and every ONNX Runtime
session, encoder or classifier head, is built by the one function with the same options.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pytest

from docintel.pipeline.config import ClassifyConfig, EmbedConfig
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.schema import EMBEDDING, N_TOKENS, TEXT, TRUNCATED
from docintel.pipeline.stages import encoder_runtimes, onnx_session
from docintel.pipeline.stages.classify import Int8Classifier
from docintel.pipeline.stages.embed import Embedder
from docintel.pipeline.stages.encoder_frontend import MAX_CHARS_PER_TOKEN
from docintel.pipeline.stages.encoder_runtimes import (
    RUNTIMES,
    EncoderRuntime,
    OnnxRuntime,
)

FAKE_DIM = 8
LONG = " ".join(f"revenue{i % 7} rose by {i} percent" for i in range(120))  # > 256 tokens


class TableRuntime(EncoderRuntime):
    """A deterministic fake: a token's hidden state is a fixed random row of its id, so
    the stage's vector of a text is the normalised mean of its kept tokens' rows."""

    backend = "cpu-test"
    calls: ClassVar[list[tuple[np.ndarray, np.ndarray]]] = []

    @property
    def tokenizer_dir(self) -> Path:
        return self.cfg.resolved_model_path()

    def load(self) -> None:
        self.model = np.random.default_rng(7).standard_normal((40_000, FAKE_DIM))
        self.model = self.model.astype(np.float32)
        self.dim, self.version = FAKE_DIM, "table@1"

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        self.calls.append((input_ids.copy(), attention_mask.copy()))
        return self.model[input_ids]


class DoubledOnnxRuntime(OnnxRuntime):
    """The fp32 ONNX runtime with its hidden states doubled: a wrapper runtime. Mean
    pooling is linear and the vectors are normalised, so its vectors are the ONNX ones."""

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return 2 * super().forward(input_ids, attention_mask)


def _by_hand(texts: list[str], cfg: EmbedConfig, table: np.ndarray) -> tuple[np.ndarray, ...]:
    """What the front end must give, computed here from the raw tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(cfg.resolved_model_path() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()  # the file may pad (this one pads to 128)
    cap = cfg.max_length * MAX_CHARS_PER_TOKEN
    vectors, n_tokens, truncated = [], [], []
    for text in texts:
        ids = tok.encode(text[:cap]).ids
        cut = len(ids) > cfg.max_length or len(text) > cap
        if len(ids) > cfg.max_length:  # [CLS] + body + [SEP]: keep both ends' specials
            ids = [*ids[: cfg.max_length - 1], ids[-1]]
        v = table[ids].mean(axis=0)
        vectors.append(v / np.linalg.norm(v))
        n_tokens.append(len(ids))
        truncated.append(cut)
    return np.array(vectors), np.array(n_tokens), np.array(truncated)


def _columns(table: pa.Table) -> tuple[np.ndarray, list[int], list[bool]]:
    emb = table[EMBEDDING].combine_chunks()
    x = emb.flatten().to_numpy(zero_copy_only=False).reshape(-1, emb.type.list_size)
    return x, table[N_TOKENS].to_pylist(), table[TRUNCATED].to_pylist()


def test_a_registered_runtime_gets_the_shared_front_end(
    monkeypatch: pytest.MonkeyPatch, valid_texts: list[str]
) -> None:
    monkeypatch.setitem(RUNTIMES, "table", TableRuntime)
    monkeypatch.setattr(TableRuntime, "calls", [])
    cfg = EmbedConfig(max_length=16, token_budget=64, max_microbatch=3)
    stage = Embedder(cfg, runtime="table")
    stage.setup()
    assert (stage.backend, stage.version, stage.dim) == ("cpu-test", "table@1", FAKE_DIM)
    # "x" * 2000 is one [UNK] token, but longer than the character cap: cut and flagged
    texts = [*valid_texts[:10], LONG, "x" * 2000, "", "Shares rose."]
    got, n_tokens, truncated = _columns(stage(pa.table({TEXT: texts})))
    want, want_n, want_t = _by_hand(texts, cfg, stage.model)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert n_tokens == want_n.tolist() and truncated == want_t.tolist()
    assert truncated[-4:] == [True, True, False, False] and n_tokens[-3] == 3
    # packed longest first under the budget: every text once, no padding beyond the longest
    calls = TableRuntime.calls
    assert sum(len(ids) for ids, _ in calls) == len(texts)
    for ids, mask in calls:
        assert ids.dtype == mask.dtype == np.int64 and ids.shape == mask.shape
        assert len(ids) <= cfg.max_microbatch
        assert ids.size <= cfg.token_budget or len(ids) == 1
        assert mask[0].all() and ids.shape[1] <= cfg.max_length


def test_unknown_runtime_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="onnx-int8"):
        Embedder(EmbedConfig(), runtime="no-such-runtime")


@pytest.fixture(scope="module")
def onnx_folder(int8_encoder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder with both ONNX encoders (the int8 one copied from the session's build),
    so that ``[embed] int8_dir`` = it serves every built-in runtime by default."""
    from docintel.pipeline.offline.quantize import build_fp32

    folder = tmp_path_factory.mktemp("runtimes")
    for f in int8_encoder.iterdir():
        if f.is_file():
            shutil.copy2(f, folder / f.name)
    build_fp32(EmbedConfig().resolved_model_path(), folder)
    return folder


def test_every_cpu_runtime_shares_the_front_end(onnx_folder: Path, headlines: list[str]) -> None:
    cfg = EmbedConfig(int8_dir=str(onnx_folder))
    texts = [*headlines[:60], LONG, "word " * 400, "x" * 20_000, ""]
    out = {}
    for name in RUNTIMES:
        stage = Embedder(cfg, runtime=name, threads=1)
        stage.setup()
        assert stage.device == "cpu" and stage.token_budget == cfg.token_budget
        out[name] = (_columns(stage(pa.table({TEXT: texts}))), stage.backend, stage.version)
        stage.teardown()
    (ref, ref_n, ref_t), _, _ = out["torch"]
    assert ref_t[-4:] == [True, True, True, False]
    for name, ((x, n_tokens, truncated), _, _) in out.items():
        assert n_tokens == ref_n and truncated == ref_t, name
        assert (x * ref).sum(axis=1).min() >= 0.95, name
    assert len({backend for _, backend, _ in out.values()}) == len(RUNTIMES)
    assert len({version for _, _, version in out.values()}) == len(RUNTIMES)


def test_a_wrapper_runtime_runs_unchanged_behind_the_front_end(
    onnx_folder: Path, headlines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(RUNTIMES, "onnx-doubled", DoubledOnnxRuntime)
    cfg = EmbedConfig(int8_dir=str(onnx_folder))
    texts = [*headlines[:40], LONG]
    plain = Embedder(cfg, runtime="onnx-fp32", threads=1)
    doubled = Embedder(cfg, runtime="onnx-doubled", threads=1)
    plain.setup()
    doubled.setup()
    a, b = plain.encode(texts), doubled.encode(texts)
    np.testing.assert_allclose(a[0], b[0], rtol=0, atol=1e-6)
    assert (a[1] == b[1]).all() and (a[2] == b[2]).all() and a[2][-1]


def test_one_function_builds_every_onnx_session(
    onnx_folder: Path, int8_encoder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Encoders and classifier heads get their sessions (and so their options) from
    ``onnx_session``: a replica's thread budget and no spinning hold for both."""
    built: list[tuple[str, int]] = []

    def spy(path: Path, threads: int) -> object:
        built.append((path.name, threads))
        session = onnx_session.onnx_session(path, threads)
        opts = session.get_session_options()
        assert opts.intra_op_num_threads == threads and opts.inter_op_num_threads == 1
        assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        return session

    from docintel.pipeline.stages import classify

    monkeypatch.setattr(encoder_runtimes, "onnx_session", spy)
    monkeypatch.setattr(classify, "onnx_session", spy)
    Embedder(EmbedConfig(int8_dir=str(onnx_folder)), runtime="onnx-int8", threads=2).setup()
    Int8Classifier(ClassifyConfig(), int8_encoder).setup()
    assert built[0] == ("model.int8.onnx", 2)
    assert built[1][0].endswith(".int8.onnx") and built[1][1] == 1  # a head: one thread
