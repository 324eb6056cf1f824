"""The KV cache: cached logits equal a full recomputation for every position scheme; the
end-aligned offset bias equals the dense rows; the buffer grows."""

import pytest
import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_causal_lm
from qkv.nn.kv_cache import KVCache, LayerCache, end_aligned_bias
from qkv.nn.position_bias import ALiBiBias, RelativePositionBias, T5RelativeBias

SCHEMES = [dict(position="none"), dict(position="learned"), dict(position="sinusoidal"),
           dict(position="learned", position_qk_only=True), dict(position="relative"),
           dict(position="relative-alibi"), dict(position="t5"), dict(position="alibi"), dict(position="rope"),
           dict(position="rope", n_kv_heads=1), dict(position="learned", n_kv_heads=1),
           dict(position="rope", local_window=4), dict(position="alibi", local_window=2),
           dict(position="rope", qk_norm="layernorm")]


def _model(**kw):
    torch.manual_seed(0)
    kw = dict(dict(norm="pre", dropout=0.0, max_len=40), **kw)
    return build_causal_lm(ModelConfig.preset("tiny", **kw)).eval()


def _full(model, ids, mask=None):
    pos = None
    if mask is not None:
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (B,T) counted from the first real token
    with torch.no_grad():
        return model(ids, mask, position_ids=pos).logits  # (B,T,V)


@pytest.mark.parametrize("kw", SCHEMES, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_prefix_then_token_by_token_equals_full_recompute(kw):
    model = _model(**kw)
    ids = torch.randint(1, 97, (2, 14))
    full = _full(model, ids)
    cache = KVCache(len(model.decoder.layers), capacity=4)  # small: the buffer must grow
    with torch.no_grad():
        got = [model(ids[:, :6], cache=cache).logits]
        for t in range(6, 14):
            got.append(model(ids[:, t : t + 1], cache=cache).logits)
    assert cache.seen == 14 and cache.layers[0].length == 14
    torch.testing.assert_close(torch.cat(got, 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", SCHEMES, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_left_padded_batch_with_cache_equals_full_recompute(kw):
    model = _model(**kw)
    ids = torch.randint(1, 97, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :5] = 0
    ids[mask == 0] = 0
    full = _full(model, ids, mask)
    with torch.no_grad():
        out = model(ids[:, :7], mask[:, :7], use_cache=True)
        got = [out.logits]
        for t in range(7, 12):
            got.append(model(ids[:, t : t + 1], mask[:, : t + 1], cache=out.cache).logits)
    got = torch.cat(got, 1)
    real = mask.bool()
    torch.testing.assert_close(got[real], full[real], rtol=1e-5, atol=1e-5)


def test_chunks_of_several_tokens_after_the_prefix():
    model = _model(position="t5")
    ids = torch.randint(1, 97, (2, 13))
    cache = KVCache()
    with torch.no_grad():
        got = torch.cat([model(ids[:, a:b], cache=cache).logits for a, b in ((0, 5), (5, 8), (8, 13))], 1)
    torch.testing.assert_close(got, _full(model, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("module", [RelativePositionBias(3, 4), T5RelativeBias(3, 8, 16), ALiBiBias(3)])
@pytest.mark.parametrize("T,S", [(1, 1), (1, 9), (3, 9), (9, 9)])
def test_end_aligned_offset_bias_is_the_last_rows_of_the_dense_bias(module, T, S):
    dense = module(S, S).dense()  # (1,H,S,S)
    cut = end_aligned_bias(module(S, S), T, S)
    assert (cut.q_len, cut.k_len) == (T, S)
    torch.testing.assert_close(cut.dense(), dense[:, :, S - T :])


def test_dense_bias_keeps_its_last_rows():
    full = torch.randn(2, 7, 7)
    torch.testing.assert_close(end_aligned_bias(full, 3, 7), full[:, 4:])


def test_layer_cache_grows_and_keeps_contents():
    c = LayerCache(2)
    k = torch.randn(1, 2, 9, 4)
    v = torch.randn(1, 2, 9, 3)
    for a, b in ((0, 1), (1, 4), (4, 9)):
        ks, vs = c.append(k[:, :, a:b], v[:, :, a:b])
    assert c.length == 9 and c.capacity >= 9
    assert torch.equal(ks, k) and torch.equal(vs, v)
    with pytest.raises(ValueError, match="one cache serves one batch"):
        c.append(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 3))


def test_cache_refuses_bidirectional_stacks_and_too_long_input():
    model = _model(position="learned", max_len=8)
    cache = KVCache()
    with torch.no_grad():
        model(torch.randint(1, 97, (1, 6)), cache=cache)
        with pytest.raises(ValueError, match="exceeds max_len=8"):
            model(torch.randint(1, 97, (1, 3)), cache=cache)
        with pytest.raises(ValueError, match=r"\(B, P\+T\)"):
            model(torch.randint(1, 97, (1, 1)), torch.ones(1, 1), cache=cache)
    from qkv.models.builders import build_encoder

    enc = build_encoder(ModelConfig.preset("tiny")).eval()
    with pytest.raises(ValueError, match="causal"):
        enc(torch.randint(1, 97, (1, 3)), cache=KVCache())


class _PlainTransform(torch.nn.Module):
    """A qk transform qkv does not know (the generic cache path): rotary through forward only."""

    def __init__(self, rope):
        super().__init__()
        self.rope = rope

    def forward(self, q, k):
        return self.rope(q, k)


def test_an_unknown_qk_transform_gets_all_keys_each_step():
    model = _model(position="rope")
    for layer in model.decoder.layers:
        layer.attention.qk_transform = _PlainTransform(layer.attention.qk_transform)
    ids = torch.randint(1, 97, (2, 10))
    cache = KVCache()
    with torch.no_grad():
        got = torch.cat([model(ids[:, :4], cache=cache).logits]
                        + [model(ids[:, t : t + 1], cache=cache).logits for t in range(4, 10)], 1)
    torch.testing.assert_close(got, _full(model, ids), rtol=1e-5, atol=1e-5)


def test_need_weights_with_a_cache_is_refused():
    att = _model().decoder.layers[0].attention
    with pytest.raises(ValueError, match="need_weights is not available with a cache"):
        att(torch.randn(1, 2, 24), need_weights=True, cache=LayerCache())


def test_narrow_window_over_many_cached_keys():
    """S > 8·window: the chunked backend's band path, one query over its band of the cache."""
    model = _model(position="rope", local_window=2, max_len=64)
    ids = torch.randint(1, 97, (2, 40))
    cache = KVCache()
    with torch.no_grad():
        got = torch.cat([model(ids[:, :20], cache=cache).logits]
                        + [model(ids[:, t : t + 1], cache=cache).logits for t in range(20, 40)], 1)
    torch.testing.assert_close(got, _full(model, ids), rtol=1e-5, atol=1e-5)
