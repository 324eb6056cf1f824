"""all-MiniLM-L6-v2 through qkv.embed against Hugging Face BertModel + pooling computed by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkv

SENTENCES = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog near the river bank.",
    "Hello",
    "Transformers turn text into vectors.",
    "Paris is the capital of France.",
    "I like pizza with extra cheese and olives, but not anchovies; my sister likes them.",
    "What time is it?",
    "Quantum computers use qubits, which can be in superposition.",
    "Éléphant, café, naïve — accents and punctuation!",
    "stock markets fell sharply on tuesday after the central bank raised interest rates",
]


@pytest.fixture(scope="module")
def models(minilm):
    from transformers import BertModel, BertTokenizerFast

    hf = BertModel.from_pretrained(str(minilm), attn_implementation="sdpa").eval()
    tok = BertTokenizerFast.from_pretrained(str(minilm))
    return qkv.load(minilm), hf, tok


def _hf_hidden(models, texts):
    _, hf, tok = models
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = hf(**batch, output_hidden_states=True)
    return out, batch["attention_mask"]


def _unit(x: torch.Tensor) -> np.ndarray:
    return torch.nn.functional.normalize(x, dim=-1).numpy()


def test_mean_normalised_equals_hf(models, minilm):
    out, mask = _hf_hidden(models, SENTENCES)
    m = mask[..., None].float()
    ref = _unit((out.last_hidden_state * m).sum(1) / m.sum(1))
    got = qkv.embed(minilm, SENTENCES)  # from the folder: mean pooling, normalised
    assert got.shape == (len(SENTENCES), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_alone_equals_batched(models):
    model = models[0]
    batched = qkv.embed(model, SENTENCES, batch_size=4)
    alone = np.stack([qkv.embed(model, [s])[0] for s in SENTENCES])
    np.testing.assert_allclose(alone, batched, atol=1e-6, rtol=0)
    reversed_ = qkv.embed(model, SENTENCES[::-1], batch_size=3)[::-1]  # input order is kept
    np.testing.assert_allclose(reversed_, batched, atol=1e-6, rtol=0)


@pytest.mark.parametrize("pooling", ["cls", "max", "mean_sqrt_len"])
def test_pooling_modes_match_hand_computation(models, pooling):
    out, mask = _hf_hidden(models, SENTENCES)
    h, m = out.last_hidden_state, mask[..., None].float()
    if pooling == "cls":
        ref = h[:, 0]
    elif pooling == "max":
        ref = h.masked_fill(m == 0, -1e9).max(dim=1).values
    else:
        ref = (h * m).sum(1) / m.sum(1).sqrt()
    got = qkv.embed(models[0], SENTENCES, pooling=pooling, normalize=False)
    np.testing.assert_allclose(got, ref.numpy(), atol=2e-5, rtol=1e-5)


def test_layer_average_matches_hand_computation(models):
    out, mask = _hf_hidden(models, SENTENCES)
    m = mask[..., None].float()
    h = torch.stack(out.hidden_states[-4:]).mean(0)  # (B,T,C) average of the last four layers
    ref = _unit((h * m).sum(1) / m.sum(1))
    got = qkv.embed(models[0], SENTENCES, layers=(-4, -3, -2, -1))
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    h0 = out.hidden_states[0]  # the embedding output alone
    ref0 = _unit((h0 * m).sum(1) / m.sum(1))
    np.testing.assert_allclose(qkv.embed(models[0], SENTENCES, layers=0), ref0, atol=1e-5, rtol=0)


def test_folder_defaults_from_sentence_transformers_config(minilm):
    from qkv.embeddings.embedder import Embedder

    emb = Embedder(minilm)
    assert emb.pooling == "mean" and emb.window == 256  # sentence_bert_config.json's max_seq_length
