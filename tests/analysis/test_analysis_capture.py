"""Batched capture: windows for long texts, clear errors, outputs equal to an unbatched pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from analysis_support import MAX_LEN, N_HEADS, N_LAYERS, pydoc_texts, qkv_load_unavailable

from qkv.analysis.capture import forward, iter_captures, tokenize_corpus
from qkv.analysis.inputs import AnalysisInputError


def test_long_texts_are_split_into_windows_with_special_tokens(tiny_tokenizer):
    text = pydoc_texts(1)[0]
    pieces = tiny_tokenizer.encode([text])[0].tolist()
    assert len(pieces) > 3 * MAX_LEN
    ctx = tokenize_corpus([text, "short one"], tiny_tokenizer, max_len=MAX_LEN)
    room = MAX_LEN - 2
    n_windows = -(-len(pieces) // room)
    assert len(ctx) == n_windows + 1
    assert (ctx.doc == [0] * n_windows + [1]).all()
    assert all(len(x) <= MAX_LEN for x in ctx.ids)
    assert all(x[0] == tiny_tokenizer.cls_id and x[-1] == tiny_tokenizer.sep_id for x in ctx.ids)
    body = np.concatenate([x[1:-1] for x in ctx.ids[:n_windows]])
    assert body.tolist() == pieces  # nothing lost, nothing repeated
    assert not any(w[0] or w[-1] for w in ctx.whole_word)  # specials are never "words"

    trunc = tokenize_corpus([text], tiny_tokenizer, max_len=MAX_LEN, long_text="truncate")
    assert len(trunc) == 1 and trunc.ids[0][1:-1].tolist() == pieces[:room]
    capped = tokenize_corpus([text], tiny_tokenizer, max_len=MAX_LEN, max_windows_per_doc=2)
    assert len(capped) == 2


def test_bad_corpus_input_gives_clear_errors(tiny_tokenizer):
    text = pydoc_texts(1)[0]
    with pytest.raises(AnalysisInputError, match=r"text 0 .* word pieces, more than the window of 40"):
        tokenize_corpus([text], tiny_tokenizer, max_len=MAX_LEN, long_text="error")
    with pytest.raises(AnalysisInputError, match="empty"):
        tokenize_corpus([], tiny_tokenizer, max_len=MAX_LEN)
    with pytest.raises(AnalysisInputError, match="no tokens"):
        tokenize_corpus(["", "   "], tiny_tokenizer, max_len=MAX_LEN)
    with pytest.raises(AnalysisInputError, match="long_text must be one of"):
        tokenize_corpus(["a"], tiny_tokenizer, max_len=MAX_LEN, long_text="wrap")


def test_batched_padded_capture_equals_one_text_at_a_time(tiny_hf_model, tiny_tokenizer):
    texts = [t[:300] for t in pydoc_texts(12)]
    ctx = tokenize_corpus(texts, tiny_tokenizer, max_len=MAX_LEN)
    assert len(set(ctx.lengths.tolist())) > 1  # padding happens
    seen = []
    for cap in iter_captures(tiny_hf_model, ctx, batch_size=5, pad_id=tiny_tokenizer.pad_id):
        b, t = cap.input_ids.shape
        assert b <= 5
        assert cap.hidden_states.shape == (N_LAYERS + 1, b, t, 24)
        assert cap.attentions.shape == (N_LAYERS, b, N_HEADS, t, t)
        for row, c in enumerate(cap.context):
            n = len(ctx.ids[c])
            ids = torch.from_numpy(ctx.ids[c])[None]
            ref_h, ref_a = forward(tiny_hf_model, ids, torch.ones_like(ids, dtype=torch.bool))
            np.testing.assert_allclose(cap.hidden_states[:, row, :n], ref_h[:, 0].numpy(), atol=1e-5)
            np.testing.assert_allclose(cap.attentions[:, row, :, :n, :n], ref_a[:, 0].numpy(), atol=1e-5)
            assert cap.attentions[:, row, :, :n, n:].max(initial=0) < 1e-6  # no weight on padding
            seen.append(int(c))
    assert sorted(seen) == list(range(len(ctx)))


def test_a_model_without_attentions_in_its_output_is_a_clear_error(tiny_tokenizer):
    class NoAttention(torch.nn.Module):
        def forward(self, input_ids, **kwargs):
            from types import SimpleNamespace

            return SimpleNamespace(hidden_states=(torch.zeros(*input_ids.shape, 4),), attentions=None)

    ctx = tokenize_corpus(["a b c"], tiny_tokenizer, max_len=MAX_LEN)
    with pytest.raises(AnalysisInputError, match="no attentions"):
        next(iter_captures(NoAttention(), ctx))


@pytest.mark.skipif(qkv_load_unavailable() is not None, reason=str(qkv_load_unavailable()))
def test_a_qkv_model_is_captured_on_the_packed_path_equal_to_transformers_padded(tiny_hf_folder, tiny_hf_model,
                                                                                tiny_tokenizer):
    import qkv
    from qkv.analysis.capture import _encoder_of

    model = qkv.load(tiny_hf_folder).model
    calls = []
    stack = _encoder_of(model)
    stack.register_forward_hook(lambda *a: calls.append("padded"))  # forward_packed runs no forward hook
    texts = [t[:300] for t in pydoc_texts(12)]
    ctx = tokenize_corpus(texts, tiny_tokenizer, max_len=MAX_LEN)
    got = list(iter_captures(model, ctx, batch_size=5, pad_id=tiny_tokenizer.pad_id))
    want = list(iter_captures(tiny_hf_model, ctx, batch_size=5, pad_id=tiny_tokenizer.pad_id))
    assert calls == [] and len(got) == len(want)
    for g, w in zip(got, want):
        real = g.mask  # (B,T)
        np.testing.assert_allclose(g.hidden_states[:, real], w.hidden_states[:, real], atol=1e-5)
        keep = real[:, None, :, None] & real[:, None, None, :]  # (B,1,T,T) real query × key
        keep = np.broadcast_to(keep, g.attentions.shape[1:])
        np.testing.assert_allclose(g.attentions[:, keep], w.attentions[:, keep], atol=1e-5)
        assert not g.attentions[:, ~keep].any() and not g.hidden_states[:, ~real].any()


def test_a_model_without_segment_embeddings_is_captured():
    """``type_vocab_size=0``: no token_type_ids are passed; the maps equal the model's own."""
    from qkv.config import ModelConfig
    from qkv.models.builders import build_masked_lm

    cfg = ModelConfig.from_flat(vocab_size=29, d_model=24, n_heads=3, d_ff=40, n_layers=2, max_len=16,
                      type_vocab_size=0, dropout=0.0)
    model = build_masked_lm(cfg).eval()
    ids = torch.randint(1, 29, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    hidden, attn = forward(model, ids, mask)
    assert hidden.shape == (3, 2, 7, 24) and attn.shape == (2, 2, 3, 7, 7)
    with torch.no_grad():
        want = model.encoder(ids, mask, output_attentions=True).attentions
    keep = (mask[:, None, :, None] & mask[:, None, None, :]).expand(-1, 3, -1, -1)  # (B,H,T,T) real query × key
    for a, w in zip(attn, want):
        torch.testing.assert_close(a[keep], w[keep])
        assert not a[~keep].any()  # the packed path computes no padded position
