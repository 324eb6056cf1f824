"""The embedder's precision modes and token-count batching: the packed embedder against the padded
transformers model (float32, to 1e-5), bf16 and int8 against float32 within their stated bounds on
the real MiniLM checkpoint, batching by tokens, and a model trained between calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.data.windows import length_batches
from qkv.embeddings.embedder import Embedder
from qkv.embeddings.errors import EmbeddingError
from qkv.hardware import precision_unsupported

CPU = torch.device("cpu")
#: the bounds docs/inference.md states (worst cosine of a vector to its float32 vector)
BOUNDS = {"bf16": 0.999, "int8": 0.99}


def test_length_batches_by_tokens():
    lengths = np.array([5, 300, 40, 40, 7, 120, 300, 1])
    batches = length_batches(lengths, batch_size=3, max_tokens=350)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(8))  # every window once
    assert [lengths[b].tolist() for b in batches] == [[300], [300], [120, 40, 40], [7, 5, 1]]
    for b in batches:  # within both limits, or one window alone
        assert len(b) <= 3 and (lengths[b].sum() <= 350 or len(b) == 1)
    assert [b.tolist() for b in length_batches(lengths, 3)] == [[1, 6, 5], [2, 3, 4], [0, 7]]


def _hf_padded(folder, texts, max_len):
    from transformers import BertModel, BertTokenizerFast

    model = BertModel.from_pretrained(str(folder)).eval()
    tok = BertTokenizerFast.from_pretrained(str(folder))
    b = tok(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    with torch.inference_mode():
        h = model(**b).last_hidden_state  # (B,T,C)
    m = b["attention_mask"].unsqueeze(-1).float()  # (B,T,1)
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()


@pytest.fixture(scope="module")
def texts(pydoc_texts):
    from qkv.inference.calibration import HELD_OUT

    return pydoc_texts[:HELD_OUT] + ["short", "a few words here"]  # texts int8 was not calibrated on


@pytest.fixture(scope="module")
def fp32_vectors(minilm, texts):
    return Embedder(minilm, max_len=128, truncate=True, device="cpu").embed(texts)


def test_packed_fp32_equals_the_padded_transformers_model(minilm, texts, fp32_vectors):
    ref = _hf_padded(minilm, texts, 128)
    assert np.abs(fp32_vectors - ref).max() <= 1e-5
    for batch_size, batch_tokens in [(1, None), (3, None), (256, 300), (256, 100_000)]:
        v = Embedder(minilm, max_len=128, truncate=True, device="cpu", batch_size=batch_size,
                     batch_tokens=batch_tokens).embed(texts)
        assert np.abs(v - ref).max() <= 1e-5, (batch_size, batch_tokens)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_precision_within_its_bound(minilm, texts, fp32_vectors, precision):
    why = precision_unsupported(precision, CPU)
    if why is not None:
        with pytest.raises(EmbeddingError, match=f"precision '{precision}' is not offered"):
            Embedder(minilm, precision=precision, device="cpu")
        pytest.skip(f"{precision} not offered here: {why}")
    v = Embedder(minilm, max_len=128, truncate=True, device="cpu", precision=precision).embed(texts)
    cos = (v * fp32_vectors).sum(1)
    assert cos.min() >= BOUNDS[precision], cos.min()
    assert cos.max() < 1.0 - 1e-7  # it really ran in reduced precision


def test_a_model_trained_between_calls_is_prepared_again(tiny_model, pydoc_texts):
    import qkv

    model, tok = qkv.load(tiny_model)
    e = Embedder(model, tokenizer=tok, device="cpu")
    before = e.embed(pydoc_texts[:4])
    again = e.embed(pydoc_texts[:4])
    np.testing.assert_array_equal(before, again)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # an optimiser step: in place
    after = e.embed(pydoc_texts[:4])
    fresh = Embedder(model, tokenizer=tok, device="cpu").embed(pydoc_texts[:4])
    np.testing.assert_allclose(after, fresh, atol=1e-6)
    assert np.abs(after - before).max() > 1e-3
