"""pool() and the layer choice against NumPy written from the definitions; bad documents."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkv
from qkv.embeddings.errors import EmbeddingError, EmptyDocumentError
from qkv.embeddings.pooling import pool
from qkv.embeddings.pooling import normalize_layers, select_layers


def _case():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, 7, 24, generator=g)  # (B,T,C) with distinct sizes
    lengths = [7, 1, 3, 6, 2]
    mask = torch.tensor([[i < n for i in range(7)] for n in lengths])
    h[~mask] = 1e4  # padding must never leak into a pooled vector
    return h, mask, lengths


def _numpy_pool(real: np.ndarray, mode: str) -> np.ndarray:
    """The definition of each mode on the n real token vectors (n,C) of one window."""
    n = len(real)
    weights = np.arange(1, n + 1, dtype=np.float64)[:, None]  # position weights 1 … n
    return {"mean": real.mean(0), "cls": real[0], "max": real.max(0),
            "mean_sqrt_len": real.sum(0) / np.sqrt(n),
            "weightedmean": (weights * real).sum(0) / weights.sum(), "lasttoken": real[-1]}[mode]


@pytest.mark.parametrize("mode", ["mean", "cls", "max", "mean_sqrt_len", "weightedmean", "lasttoken",
                                  "lasttoken+cls+weightedmean"])
def test_pool_matches_numpy(mode):
    from qkv.embeddings.pooling import pool_packed
    from qkv.nn.packed import PackedBatch

    h, mask, lengths = _case()
    got = pool(h, mask, mode).numpy()
    packed = PackedBatch.from_sequences([list(range(n)) for n in lengths])
    flat = torch.cat([h[b, :n] for b, n in enumerate(lengths)])  # (N,C) the real tokens back to back
    got_packed = pool_packed(flat, packed, mode).numpy()
    for b, n in enumerate(lengths):
        real = h[b, :n].numpy().astype(np.float64)
        ref = np.concatenate([_numpy_pool(real, m) for m in mode.split("+")])  # concatenated in order
        np.testing.assert_allclose(got[b], ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_packed[b], ref, rtol=1e-5, atol=1e-6)


def test_pool_accepts_integer_masks():
    h, mask, _ = _case()
    np.testing.assert_allclose(pool(h, mask.long(), "mean"), pool(h, mask, "mean"))


def test_layers():
    assert normalize_layers(-1, 6) == (6,)
    assert normalize_layers((-4, -3, -2, -1), 6) == (3, 4, 5, 6)
    assert normalize_layers([0, -7], 6) == (0,)
    hs = [torch.full((1, 2, 3), float(i)) for i in range(4)]
    assert torch.equal(select_layers(hs, (1, 3)), torch.full((1, 2, 3), 2.0))
    for bad in ((), (7,), (-8,), ("1",), (1.0,)):
        with pytest.raises(EmbeddingError):
            normalize_layers(bad, 6)


def test_empty_documents(tiny_model):
    with pytest.raises(EmptyDocumentError, match=r"1 empty document.*: 1\b.*empty='zero'"):
        qkv.embed(tiny_model, ["a text", "  \n", "another text"])
    got = qkv.embed(tiny_model, ["a text", "  \n", "another text"], empty="zero")
    assert np.all(got[1] == 0)
    np.testing.assert_allclose(got[[0, 2]], qkv.embed(tiny_model, ["a text", "another text"]), atol=1e-6)
    with pytest.raises(EmbeddingError, match="skip"):
        qkv.embed(tiny_model, ["x"], empty="skip")


def test_non_text_documents(tiny_model):
    with pytest.raises(EmbeddingError, match=r"bytes, expected str.*decode"):
        qkv.embed(tiny_model, ["fine", b"\xff\xfe"])
    assert qkv.embed(tiny_model, "one document").shape == (1, 24)
    assert qkv.embed(tiny_model, []).shape == (0, 24)


def test_model_without_tokenizer(tiny_model, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("qkv.json", "model.safetensors"):
        shutil.copy(tiny_model / name, bare / name)
    with pytest.raises(EmbeddingError, match="no tokenizer.*tokenizer.json or vocab.txt"):
        qkv.embed(bare, ["text"])
    model = qkv.load(bare).model
    with pytest.raises(EmbeddingError, match="a bare Encoder carries no tokenizer; pass tokenizer="):
        qkv.embed(model, ["text"])
    with pytest.raises(EmbeddingError, match="the model has no tokenizer.*or pass tokenizer="):
        qkv.embed(qkv.load(bare), ["text"])  # what qkv.load returns for a folder without one
    tok = qkv.load(tiny_model).tokenizer
    np.testing.assert_allclose(qkv.embed(model, ["text"], tokenizer=tok), qkv.embed(tiny_model, ["text"]),
                               atol=1e-6)


def test_run_folder_declares_its_block_length(tiny_model, tmp_path):
    import json
    import shutil

    from qkv.embeddings.embedder import Embedder

    run = tmp_path / "run"
    shutil.copytree(tiny_model, run)
    (run / "run.json").write_text(json.dumps({"format": "qkv-run", "train_config": {"max_len": 16}}))
    assert Embedder(run).window == 16 and Embedder(run, max_len=32).window == 32
    assert Embedder(tiny_model).window == 32  # no declaration: the model's position table


def test_weightedmean_half_precision_does_not_overflow():
    """Σ i over 400 positions (80 200) is beyond float16's range; the weights are summed in float32."""
    from qkv.embeddings.pooling import pool_packed
    from qkv.nn.packed import PackedBatch

    h = torch.randn(1, 400, 8, generator=torch.Generator().manual_seed(1))
    ref = (torch.arange(1, 401.0)[:, None] * h[0]).sum(0) / (400 * 401 / 2)
    mask = torch.ones(1, 400, dtype=torch.bool)
    got = pool(h.half(), mask, "weightedmean")
    got_packed = pool_packed(h[0].half(), PackedBatch.from_sequences([list(range(400))]), "weightedmean")
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    torch.testing.assert_close(got[0].float(), ref, atol=5e-3, rtol=0)
    torch.testing.assert_close(got_packed[0].float(), ref, atol=5e-3, rtol=0)
