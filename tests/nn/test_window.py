"""Sliding-window (local) attention: ``window=W`` lets query i see key j iff ``|i - j| ≤ W // 2``.

* the band against a hand-made mask and against transformers' ModernBERT mask
  (``create_bidirectional_sliding_window_mask``), padding included;
* ``MultiHeadAttention(window=…)`` with rotary positions against transformers'
  ``ModernBertAttention`` (a local layer) with copied weights;
* every backend against ``explicit`` with a window (padding, causal, bias, grouped keys, gradients);
* the chunked windowed path: blocks see only their band, so its work memory does not grow with T;
* the packed path against the padded batch.
"""

from __future__ import annotations

import logging

import pytest
import torch

from qkv.models.builders import build_attention
from qkv.nn import stages
from qkv.nn.attend import attend
from qkv.nn.backends import chunked
from qkv.nn.positional import ALiBiBias, RotaryEmbedding
from qkv.nn.similarity import build_similarity
from qkv.nn.stages import block_mask

B, H, T, D = 3, 4, 11, 6


def _qkv(seed=0, b=B, h=H, g=H, t=T, d=D, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, t, d, generator=gen, dtype=dtype), torch.randn(b, g, t, d, generator=gen, dtype=dtype),
            torch.randn(b, g, t, d, generator=gen, dtype=dtype))


def _hand_band(t, window):
    """The band written out with loops: key j visible from query i iff |i - j| ≤ window // 2."""
    band = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        for j in range(t):
            band[i, j] = abs(i - j) <= window // 2
    return band


@pytest.mark.parametrize("window", [1, 2, 3, 6, 7, 40])
def test_band_mask_is_the_hand_band(window):
    got = block_mask(None, False, 0, T, T, T, "cpu", window=window)
    assert torch.equal(got, _hand_band(T, window))


def test_windowed_attend_equals_explicit_mask_by_hand():
    q, k, v = _qkv()
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    want = attend(q, k, v, similarity=sim, mask=_hand_band(T, 5), backend="explicit", need_weights=True)
    for backend in ("explicit", "chunked", "sdpa", "inplace"):
        got = attend(q, k, v, similarity=sim, window=5, backend=backend, chunk_size=3,
                     need_weights=backend != "sdpa")
        torch.testing.assert_close(got.output, want.output, atol=1e-5, rtol=1e-5)
        if got.weights is not None:
            torch.testing.assert_close(got.weights, want.weights, atol=1e-6, rtol=1e-6)
            assert (got.weights[..., ~_hand_band(T, 5)] == 0).all()


def _modernbert_config(window=6, h=3, c=24):
    from transformers import ModernBertConfig

    logging.getLogger("transformers").setLevel(logging.ERROR)
    return ModernBertConfig(vocab_size=97, hidden_size=c, num_attention_heads=h, num_hidden_layers=3,
                            intermediate_size=40, local_attention=window, global_attn_every_n_layers=3,
                            attention_bias=True, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                            sep_token_id=2, attn_implementation="eager")


@pytest.mark.parametrize("window", [2, 6, 7])
def test_band_matches_transformers_modernbert_mask_with_padding(window):
    from transformers.masking_utils import create_bidirectional_sliding_window_mask

    cfg = _modernbert_config(window)
    x = torch.randn(2, T, 24)
    am = torch.ones(2, T, dtype=torch.long)
    am[1, 7:] = 0
    hf = create_bidirectional_sliding_window_mask(config=cfg, inputs_embeds=x, attention_mask=am)  # (B,1,T,T) additive
    ours = block_mask(am.bool()[:, None, None, :], False, 0, T, T, T, "cpu", window=window)  # (B,1,T,T)
    assert torch.equal(ours, hf == 0)


@pytest.mark.parametrize("backend", ["auto", "explicit", "chunked"])
def test_local_layer_matches_transformers_modernbert_attention(backend):
    from transformers.masking_utils import create_bidirectional_sliding_window_mask
    from transformers.models.modernbert.modeling_modernbert import ModernBertAttention, ModernBertRotaryEmbedding

    torch.manual_seed(0)
    cfg = _modernbert_config(window=6, h=3, c=24)
    hf = ModernBertAttention(cfg, layer_idx=1).eval()  # layer 1: sliding_attention
    rope = ModernBertRotaryEmbedding(cfg)
    base = cfg.rope_parameters["sliding_attention"]["rope_theta"]
    ours = build_attention(24, 3, qk_transform=RotaryEmbedding(8, base), window=cfg.local_attention,
                           backend=backend, chunk_size=4).eval()
    with torch.no_grad():
        ours.qkv_proj.load_state_dict(hf.Wqkv.state_dict())  # rows [q; k; v], as ours
        ours.out_proj.load_state_dict(hf.Wo.state_dict())
    x = torch.randn(2, T, 24)
    am = torch.ones(2, T, dtype=torch.long)
    am[1, 8:] = 0
    mask = create_bidirectional_sliding_window_mask(config=cfg, inputs_embeds=x, attention_mask=am)
    pos = rope(x, torch.arange(T)[None].expand(2, T), layer_type="sliding_attention")
    with torch.no_grad():
        want = hf(x, position_embeddings=pos, attention_mask=mask)[0]
        got = ours(x, am.bool())
        got_w = ours(x, am.bool(), need_weights=True)
    real = am.bool()
    torch.testing.assert_close(got.output[real], want[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w.output[real], want[real], atol=1e-5, rtol=1e-5)


CASES = {
    "plain": {},
    "padding": {"pad": True},
    "causal": {"causal": True},
    "bias": {"bias": True},
    "grouped": {"g": 2},
    "all": {"pad": True, "bias": True, "g": 1},
}


def _case(name, seed=0):
    c = CASES[name]
    q, k, v = _qkv(seed, g=c.get("g", H))
    kw = {"causal": c.get("causal", False)}
    if c.get("pad"):
        keep = torch.ones(B, T, dtype=torch.bool)
        keep[1, 6:] = False
        keep[2, 9:] = False
        kw["mask"] = keep[:, None, None, :]  # (B,1,1,S)
    if c.get("bias"):
        kw["bias"] = ALiBiBias(H)(T, T)  # an OffsetBias: row blocks on chunked
    return q, k, v, kw


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("window", [3, 8])
@pytest.mark.parametrize("backend", ["sdpa", "chunked", "inplace"])
def test_every_backend_matches_explicit_with_a_window(case, window, backend):
    q, k, v, kw = _case(case)
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    want = attend(q, k, v, similarity=sim, window=window, backend="explicit", need_weights=True, **kw)
    need = backend != "sdpa"
    got = attend(q, k, v, similarity=sim, window=window, backend=backend, need_weights=need, chunk_size=3, **kw)
    torch.testing.assert_close(got.output, want.output, atol=1e-5, rtol=1e-5)
    if need:
        torch.testing.assert_close(got.weights, want.weights, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("case", ["padding", "grouped", "all"])
def test_windowed_gradients_match_explicit(case):
    q, k, v, kw = _case(case, seed=1)
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    grads = {}
    for backend in ("explicit", "sdpa", "chunked"):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = attend(qq, kk, vv, similarity=sim, window=5, backend=backend, chunk_size=4, **kw).output
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        grads[backend] = (qq.grad, kk.grad, vv.grad)
    for backend in ("sdpa", "chunked"):
        for got, want in zip(grads[backend], grads["explicit"]):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_additive_similarity_with_a_window_on_chunked():
    q, k, v, kw = _case("padding")
    sim = build_similarity("additive", n_heads=H, d_head=D)
    want = attend(q, k, v, similarity=sim, window=4, backend="explicit", **kw)
    got = attend(q, k, v, similarity=sim, window=4, backend="chunked", chunk_size=2, **kw)
    torch.testing.assert_close(got.output, want.output, atol=1e-5, rtol=1e-5)


def _largest_key_block(t, window, monkeypatch, grad=False):
    """Keys the chunked backend hands one block at most, for length t (auto-sized blocks, a small budget)."""
    seen = []
    real = stages.staged_attention

    def spy(q, k, v, *a, **kw):
        seen.append(q.shape[2] * k.shape[2])  # scores of the block: t·s'
        return real(q, k, v, *a, **kw)

    monkeypatch.setattr(chunked, "staged_attention", spy)
    q, k, v = _qkv(t=t, b=1, h=2, g=2)
    if grad:
        q.requires_grad_()
    sim = build_similarity("scaled_dot", n_heads=2, d_head=D)
    out = attend(q, k, v, similarity=sim, window=window, backend="auto", budget=4096)
    if grad:
        out.output.sum().backward()
    return max(seen), len(seen)


@pytest.mark.parametrize("grad", [False, True])
def test_chunked_window_block_memory_does_not_grow_with_length(monkeypatch, grad):
    sizes = {t: _largest_key_block(t, 16, monkeypatch, grad) for t in (256, 512, 1024, 2048)}
    largest = {t: s[0] for t, s in sizes.items()}
    assert len(set(largest.values())) == 1  # the same block of scores at every length: memory linear in T
    assert 1 * 2 * largest[256] <= 4096  # within the budget: B·H·t·s' with B=1, H=2
    blocks = {t: s[1] for t, s in sizes.items()}
    assert blocks[2048] >= 7 * blocks[256]  # the number of blocks grows with T instead


def test_auto_picks_chunked_for_long_windowed_calls():
    from qkv.nn.attend import choose_backend, features_of
    from qkv.nn.backends.base import AttendCall

    q, k, v = _qkv(t=64, b=1, h=2, g=2)
    sim = build_similarity("scaled_dot", n_heads=2, d_head=D)
    call = AttendCall(q, k, v, sim, None, None, False, 0.0, False, None, 1024, None, 8)
    assert features_of(call).window and not features_of(call).small
    assert choose_backend("auto", features_of(call)) == "chunked"
    wide = AttendCall(q, k, v, sim, None, None, False, 0.0, False, None, 2**24, None, 8)  # fits; S = 64 = 8·W
    assert features_of(wide).small and not features_of(wide).band_narrow
    assert choose_backend("auto", features_of(wide)) == "sdpa"  # a dense band on the fused kernel
    narrow = AttendCall(q, k, v, sim, None, None, False, 0.0, False, None, 2**24, None, 7)  # S > 8·W
    assert features_of(narrow).band_narrow and choose_backend("auto", features_of(narrow)) == "chunked"


@pytest.mark.parametrize("g", [4, 2])
def test_packed_windowed_attention_matches_padded_batch(g):
    torch.manual_seed(0)
    attn = build_attention(24, 4, n_kv_heads=g, window=5, qk_transform=RotaryEmbedding(6), qk_norm="rmsnorm").eval()
    lengths = [9, 9, 4, 0, 7]
    x = torch.randn(len(lengths), max(lengths), 24)
    keep = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    with torch.no_grad():
        padded = attn(x, keep).output
        packed = attn.forward_packed(x[keep], lengths).output
    torch.testing.assert_close(packed, padded[keep], atol=1e-5, rtol=1e-5)


def test_window_must_be_a_positive_int():
    q, k, v = _qkv()
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    with pytest.raises(ValueError, match="window must be a positive int"):
        attend(q, k, v, similarity=sim, window=0)
    with pytest.raises(ValueError, match="window must be a positive int"):
        build_attention(24, 4, window=True)


def test_windowed_weights_under_autograd_on_chunked_match_explicit():
    q, k, v, kw = _case("padding", seed=2)
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    res = {}
    for backend in ("explicit", "chunked"):
        qq = q.clone().requires_grad_()
        r = attend(qq, k, v, similarity=sim, window=4, backend=backend, need_weights=True, chunk_size=3, **kw)
        (r.output.sum() + (r.weights * torch.linspace(0, 1, r.weights.numel()).view(r.weights.shape)).sum()).backward()
        res[backend] = (r.output, r.weights, qq.grad)
    for got, want in zip(res["chunked"], res["explicit"]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_window_with_more_keys_than_queries_is_aligned_at_the_end():
    gen = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(2, H, 5, D, generator=gen), torch.randn(2, H, 9, D, generator=gen), torch.randn(2, H, 9, D,
                                                                                                        generator=gen)
    sim = build_similarity("scaled_dot", n_heads=H, d_head=D)
    band = torch.tensor([[abs(i + 4 - j) <= 1 for j in range(9)] for i in range(5)])  # query i sits at key i + S - T
    want = attend(q, k, v, similarity=sim, mask=band, backend="explicit").output
    for backend in ("explicit", "chunked", "sdpa", "inplace"):
        got = attend(q, k, v, similarity=sim, window=3, backend=backend, chunk_size=2).output
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
