"""Embedder: unit vectors, parity with sentence-transformers, order independence,
truncation, length packing, and clear errors for a broken model folder."""

from __future__ import annotations

import copy
import json
import random
import re
import shutil

import numpy as np
import pyarrow as pa
import pytest

from docintel.pipeline.config import EmbedConfig
from docintel.pipeline.errors import ModelError
from docintel.pipeline.schema import EMBEDDING, N_TOKENS, TEXT, TRUNCATED
from docintel.pipeline.stages.embed import (
    Embedder,
    check_encoder_dir,
    embedding_dim,
    pack_by_length,
)

DIM = 384
LONG_SENTENCE = " ".join(f"revenue{i % 7} rose by {i} percent" for i in range(120))


@pytest.fixture(scope="session")
def reference_model():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(
        str(EmbedConfig(model_path="stock").resolved_model_path()), device="cpu"
    )


@pytest.fixture(scope="module")
def stock_embedder() -> Embedder:
    """The stock MiniLM ([embed] model_path = "stock"): the default encoder is fine-tuned
    (tests/unit/test_finetune.py), so parity with sentence-transformers is checked here."""
    stage = Embedder(EmbedConfig(model_path="stock"))
    stage.setup()
    return stage


def _vectors(table: pa.Table) -> np.ndarray:
    emb = table[EMBEDDING].combine_chunks()
    return emb.flatten().to_numpy(zero_copy_only=False).reshape(-1, emb.type.list_size)


def test_vectors_are_unit_norm_float32_of_dim_384(embedder, valid_texts, valid_embedded):
    out = valid_embedded
    assert out.column_names == [TEXT, EMBEDDING, N_TOKENS, TRUNCATED]
    assert out.schema.field(EMBEDDING).type == pa.list_(pa.float32(), DIM)
    assert out.schema.field(N_TOKENS).type == pa.int32()
    assert out.schema.field(TRUNCATED).type == pa.bool_()
    x = _vectors(out)
    assert x.dtype == np.float32
    assert x.shape == (len(valid_texts), DIM)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert embedder.dim == DIM


def test_parity_with_sentence_transformers(stock_embedder, reference_model, valid_texts):
    ours = _vectors(stock_embedder(pa.table({TEXT: valid_texts})))
    ref = reference_model.encode(valid_texts, normalize_embeddings=True)
    cos = (ours * ref).sum(axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.999, cos


def test_results_do_not_depend_on_input_order(embedder, valid_texts, valid_embedded):
    texts = valid_texts
    base = valid_embedded
    shuffled = texts[:]
    random.Random(5).shuffle(shuffled)
    assert shuffled != texts
    other = embedder(pa.table({TEXT: shuffled}))
    assert other[TEXT].to_pylist() == shuffled  # rows stay in input order
    by_text = {t: i for i, t in enumerate(texts)}
    perm = [by_text[t] for t in shuffled]
    np.testing.assert_allclose(_vectors(other), _vectors(base)[perm], rtol=0, atol=1e-6)
    assert other[N_TOKENS].to_pylist() == [base[N_TOKENS].to_pylist()[i] for i in perm]
    assert other[TRUNCATED].to_pylist() == [base[TRUNCATED].to_pylist()[i] for i in perm]


def test_results_do_not_depend_on_micro_batching(embedder, valid_texts):
    """The same texts packed into many small micro-batches embed the same."""
    small = copy.copy(embedder)  # shares the loaded model; only the packing limits differ
    small.cfg = EmbedConfig(token_budget=64, max_microbatch=3)
    texts = valid_texts[:12]
    a, na, ta = embedder.encode(texts)
    b, nb, tb = small.encode(texts)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert (na == nb).all()
    assert (ta == tb).all()


def test_long_sentence_is_truncated_to_256_tokens(stock_embedder, reference_model):
    out = stock_embedder(pa.table({TEXT: [LONG_SENTENCE, "Revenue rose 5%."]}))
    assert out[TRUNCATED].to_pylist() == [True, False]
    n_tokens = out[N_TOKENS].to_pylist()
    assert n_tokens[0] == 256
    assert 3 < n_tokens[1] < 20
    # truncation keeps [CLS] ... [SEP] as sentence-transformers does
    ref = reference_model.encode([LONG_SENTENCE], normalize_embeddings=True)[0]
    assert float(_vectors(out)[0] @ ref) >= 0.999


def test_empty_table_gives_empty_output(embedder):
    out = embedder(pa.table({TEXT: pa.array([], pa.string())}))
    assert out.num_rows == 0
    assert out.schema.field(EMBEDDING).type == pa.list_(pa.float32(), DIM)
    assert N_TOKENS in out.column_names
    assert TRUNCATED in out.column_names


def _check_packing(lengths: list[int], budget: int, max_items: int) -> None:
    groups = pack_by_length(lengths, budget, max_items)
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(lengths))), "every index exactly once"
    for g in groups:
        assert g, "no empty group"
        assert len(g) <= max_items
        longest = max(lengths[i] for i in g)
        # a single item longer than the whole budget still has to go somewhere: alone
        assert len(g) * longest <= budget or len(g) == 1, (g, [lengths[i] for i in g])
        # the first index of a group is its longest (the padding width the stage uses)
        assert lengths[g[0]] == longest


def test_pack_by_length_properties_random():
    rng = random.Random(11)
    for _ in range(500):
        n = rng.randint(0, 200)
        lengths = [rng.randint(1, 600) for _ in range(n)]
        _check_packing(lengths, rng.randint(1, 5000), rng.randint(1, 150))


def test_pack_by_length_edge_cases():
    assert pack_by_length([], 4096, 128) == []
    _check_packing([5000], 4096, 128)  # one over-budget item
    _check_packing([10] * 1000, 4096, 128)  # many short: max_items binds
    groups = pack_by_length([10] * 1000, 4096, 128)
    assert [len(g) for g in groups] == [128] * 7 + [104]
    _check_packing([256] * 40, 4096, 128)  # budget binds: 16 per group
    assert [len(g) for g in pack_by_length([256] * 40, 4096, 128)] == [16, 16, 8]
    # one long sentence does not inflate the padding of the short ones
    groups = pack_by_length([3, 3, 3, 256, 3], 300, 128)
    assert groups[0] == [3]
    assert sorted(groups[1]) == [0, 1, 2, 4]


def test_missing_model_folder_raises_model_error(tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(ModelError, match=re.escape(str(missing))):
        check_encoder_dir(missing)
    with pytest.raises(ModelError, match=re.escape(str(missing))):
        embedding_dim(missing)
    with pytest.raises(ModelError, match=re.escape(str(missing))):
        Embedder(EmbedConfig(model_path=str(missing))).setup()


def test_folder_without_config_json_raises_model_error(tmp_path):
    folder = tmp_path / "noconfig"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ModelError, match=r"config\.json") as exc:
        check_encoder_dir(folder)
    assert str(folder) in str(exc.value)
    with pytest.raises(ModelError, match=re.escape(str(folder))):
        embedding_dim(folder)


def test_folder_without_weights_raises_model_error(tmp_path):
    src = EmbedConfig().resolved_model_path()
    folder = tmp_path / "noweights"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(src / name, folder / name)
    with pytest.raises(ModelError, match="weights") as exc:
        check_encoder_dir(folder)
    assert str(folder) in str(exc.value)
    with pytest.raises(ModelError, match=re.escape(str(folder))):
        Embedder(EmbedConfig(model_path=str(folder))).setup()


def test_embedding_dim_reads_config(tmp_path):
    assert embedding_dim(EmbedConfig().resolved_model_path()) == DIM
    folder = tmp_path / "nodim"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ModelError, match="hidden_size"):
        embedding_dim(folder)


def test_huge_sentences_are_cut_before_tokenizing_and_flagged(embedder):
    """A 1,000,000-character "sentence" is not tokenized whole: it is cut to
    max_length x MAX_CHARS_PER_TOKEN characters first, and flagged truncated."""
    from docintel.pipeline.stages import embed as embed_mod

    huge = "growth " * 142_858  # 1,000,006 chars
    out = embedder(pa.table({TEXT: [huge, "Shares rose."]}))
    assert out[TRUNCATED].to_pylist() == [True, False]
    assert out[N_TOKENS].to_pylist()[0] == EmbedConfig().max_length
    assert EmbedConfig().max_length * embed_mod.MAX_CHARS_PER_TOKEN < len(huge)


def test_encoding_in_chunks_gives_the_same_embeddings(embedder, valid_texts, monkeypatch):
    from docintel.pipeline.stages import embed as embed_mod

    texts = valid_texts[:9]
    whole = embedder(pa.table({TEXT: texts}))
    monkeypatch.setattr(embed_mod, "ENCODE_CHUNK", 4)  # three tokenizer calls
    chunked = embedder(pa.table({TEXT: texts}))
    a = np.array(whole[EMBEDDING].to_pylist())
    b = np.array(chunked[EMBEDDING].to_pylist())
    assert np.allclose(a, b, atol=1e-5)
    assert whole[N_TOKENS].to_pylist() == chunked[N_TOKENS].to_pylist()


def test_cuda_replicas_pack_to_the_gpu_token_budget(embedder):
    """CPU replicas pack small passes (token_budget); a replica on a card packs to
    gpu_token_budget (the attribute encode() packs with, whatever the device)."""
    cfg = EmbedConfig(token_budget=512, gpu_token_budget=16_384)
    stage = copy.copy(embedder)
    stage.cfg = cfg
    assert stage.device == "cpu" and stage.token_budget == 512
    stage.device = "cuda"
    assert stage.token_budget == 16_384
    assert EmbedConfig().token_budget == 1024 and EmbedConfig().gpu_token_budget == 8192
