"""Long documents: overlapping windows averaged by token count, never dropped (the windows
themselves: tests/data/test_data_windows.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkv
from qkv.data.windows import window_starts  # checked against a hand-written reference in tests/data
from qkv.embeddings.embedder import Embedder
from qkv.embeddings.errors import EmbeddingError

WORDS = ("the cat sat on a mat and the dog ran to the house by the river in the park with a "
         "ball then they slept under old tree").split()


def _long_doc(tokenizer_view, n_tokens: int) -> str:
    words = [WORDS[i % len(WORDS)] for i in range(n_tokens)]
    text = " ".join(words)
    assert len(tokenizer_view.encode([text])[0]) == n_tokens, "each word must be one token"
    return text


def test_long_document_is_token_weighted_mean_of_windows_minilm(minilm):
    from transformers import BertModel, BertTokenizerFast

    window, stride = 64, 31
    span = window - 2
    hf = BertModel.from_pretrained(str(minilm), attn_implementation="sdpa").eval()
    tok = BertTokenizerFast.from_pretrained(str(minilm))
    emb = Embedder(minilm, max_len=window, stride=stride)
    text = _long_doc(emb.tokenizer, 4 * span)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 4 * span
    total, weight = torch.zeros(384, dtype=torch.float64), 0
    for a in window_starts(len(ids), span, stride):
        win = torch.tensor([[tok.cls_token_id, *ids[a:a + span], tok.sep_token_id]])
        with torch.no_grad():
            vec = hf(input_ids=win).last_hidden_state[0].mean(0).double()  # this window's mean
        total += win.shape[1] * vec
        weight += win.shape[1]
    ref = torch.nn.functional.normalize(total / weight, dim=0).numpy()
    got = emb.embed([text, "a short one"])
    np.testing.assert_allclose(got[0], ref, atol=1e-5, rtol=0)
    assert emb.stats.long_documents == 1 and emb.stats.windows == 7 + 1 and emb.stats.truncated == 0


def test_long_document_tiny_model_and_truncate(tiny_model):
    pretrained = qkv.load(tiny_model)
    model = pretrained.model
    emb = Embedder(pretrained, stride=10)  # window 32: span 30
    # the tiny tokenizer has its own vocabulary: build a document from its own tokens
    vocab = sorted(t for t in pretrained.tokenizer.get_vocab() if t.isalpha() and len(t) > 2)[:40]
    text = " ".join(vocab[i % len(vocab)] for i in range(120))
    ids = emb.tokenizer.encode([text])[0]
    n = len(ids)
    assert n >= 4 * 30
    cls, sep = emb.tokenizer.cls_id, emb.tokenizer.sep_id
    total, weight = torch.zeros(24, dtype=torch.float64), 0
    for a in window_starts(n, 30, 10):
        win = torch.tensor([[cls, *ids[a:a + 30].tolist(), sep]])
        with torch.no_grad():
            total += win.shape[1] * model(win).last_hidden_state[0].mean(0).double()
        weight += win.shape[1]
    ref = torch.nn.functional.normalize(total / weight, dim=0).numpy()
    np.testing.assert_allclose(emb.embed([text])[0], ref, atol=1e-5, rtol=0)
    trunc = Embedder(model, truncate=True, tokenizer=pretrained.tokenizer)
    first = torch.tensor([[cls, *ids[:30].tolist(), sep]])
    with torch.no_grad():
        ref_first = torch.nn.functional.normalize(model(first).last_hidden_state[0].mean(0), dim=0).numpy()
    np.testing.assert_allclose(trunc.embed([text, "x"])[0], ref_first, atol=1e-5, rtol=0)
    assert trunc.stats.truncated == 1


def test_chunking_and_grouping_do_not_change_vectors(tiny_model, pydoc_texts):
    texts = [t[:400] for t in pydoc_texts[:12]] + ["short", "a bit longer text here"]
    whole = Embedder(tiny_model, batch_size=64).embed(texts)
    small = Embedder(tiny_model, batch_size=3, chunk_size=4)
    chunks = list(small.embed_stream(enumerate(texts)))
    assert len(chunks) == 4 and [i for ids, _ in chunks for i in ids] == list(range(len(texts)))
    np.testing.assert_allclose(np.concatenate([v for _, v in chunks]), whole, atol=1e-5, rtol=0)


def test_bad_options(tiny_model):
    with pytest.raises(EmbeddingError, match="stride"):
        Embedder(tiny_model, stride=31)
    with pytest.raises(EmbeddingError, match="max_len"):
        Embedder(tiny_model, max_len=33)
    with pytest.raises(EmbeddingError, match="pooling"):
        Embedder(tiny_model, pooling="median")
    with pytest.raises(EmbeddingError, match="out of range"):
        Embedder(tiny_model, layers=(5,))
