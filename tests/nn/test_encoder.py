"""Encoder: output dataclass, exact attention maps, padding invariance, input checks, positions, and the
norm / feed-forward / embedding variants built from the config."""

import pytest
import torch
from torch import nn

from qkv.config import ModelConfig
from qkv.models.builders import build_encoder, build_masked_lm, init_weights
from qkv.nn.encoder import EncoderOutput
from qkv.nn.feed_forward import FeedForward, GatedFeedForward
from qkv.nn.norms import RMSNorm
from qkv.nn.packed import PackedBatch
from qkv.nn.positional import POSITIONS

B, T = 5, 7


def _encoder(**overrides):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", **overrides)
    return build_encoder(cfg).eval(), cfg


def _ids(cfg, b=B, t=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, cfg.vocab_size, (b, t), generator=g)


def test_outputs_and_shapes():
    enc, cfg = _encoder()
    ids = _ids(cfg)
    out = enc(ids)
    assert isinstance(out, EncoderOutput)
    assert out.last_hidden_state.shape == (B, T, cfg.d_model)
    assert out.hidden_states is None and out.attentions is None
    full = enc(ids, output_hidden_states=True, output_attentions=True)
    assert len(full.hidden_states) == cfg.n_layers + 1
    assert all(h.shape == (B, T, cfg.d_model) for h in full.hidden_states)
    assert len(full.attentions) == cfg.n_layers
    assert all(a.shape == (B, cfg.attention.n_heads, T, T) for a in full.attentions)
    torch.testing.assert_close(full.hidden_states[-1], full.last_hidden_state, atol=0, rtol=0)
    # the exact (explicit) path used for the maps agrees with the fused default path
    torch.testing.assert_close(full.last_hidden_state, out.last_hidden_state, atol=1e-6, rtol=1e-6)


def test_attention_maps_are_distributions_over_real_keys():
    enc, cfg = _encoder()
    ids = _ids(cfg)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[2, 3:] = 0
    out = enc(ids, mask, output_attentions=True)
    for a in out.attentions:
        torch.testing.assert_close(a.sum(-1), torch.ones(B, cfg.attention.n_heads, T))
        assert torch.all(a[2, :, :, 3:] == 0)


def test_embedding_output_is_first_hidden_state():
    enc, cfg = _encoder(dropout=0.0)
    ids = _ids(cfg)
    seg = torch.randint(0, cfg.type_vocab_size, (B, T))
    out = enc(ids, token_type_ids=seg, output_hidden_states=True)
    e = enc.embeddings
    want = e.norm(e.tokens(ids) + e.positions.weight[:T] + e.segments(seg))
    torch.testing.assert_close(out.hidden_states[0], want, atol=1e-6, rtol=1e-6)
    zero = enc(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state
    torch.testing.assert_close(enc(ids).last_hidden_state, zero, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_padding_invariance(norm):
    enc, cfg = _encoder(norm=norm)
    ids = _ids(cfg, t=6)
    lengths = torch.tensor([6, 3, 5, 1, 4])
    mask = torch.arange(6)[None, :] < lengths[:, None]  # (B,6)
    ids = ids.masked_fill(~mask, cfg.pad_token_id)
    base = enc(ids, mask, output_hidden_states=True)
    extra = 5
    ids_p = torch.cat([ids, torch.full((B, extra), cfg.pad_token_id)], dim=1)
    mask_p = torch.cat([mask, torch.zeros(B, extra, dtype=torch.bool)], dim=1)
    padded = enc(ids_p, mask_p, output_hidden_states=True)
    for h0, h1 in zip(base.hidden_states, padded.hidden_states):
        for b in range(B):
            n = int(lengths[b])
            torch.testing.assert_close(h1[b, :n], h0[b, :n], atol=1e-6, rtol=1e-6)
    # each sequence alone (no padding at all) gives the same real-position outputs
    for b in range(B):
        n = int(lengths[b])
        alone = enc(ids[b : b + 1, :n]).last_hidden_state[0]
        torch.testing.assert_close(alone, padded.last_hidden_state[b, :n], atol=1e-6, rtol=1e-6)


def test_pre_ln_has_final_norm():
    enc, _ = _encoder(norm="pre")
    assert enc.final_norm is not None
    assert _encoder(norm="post")[0].final_norm is None


def test_bad_inputs():
    enc, cfg = _encoder()
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, vocab_size=97\); found values in \[1, 97\]"):
        enc(torch.tensor([[1, 97]]))
    with pytest.raises(ValueError, match=r"found values in \[-1, 3\]"):
        enc(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match="sequence length 20 exceeds max_len=19"):
        enc(torch.ones(1, 20, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token_type_ids must lie in \[0, type_vocab_size=4\); found \[0, 4\]"):
        enc(torch.ones(1, 3, dtype=torch.long), token_type_ids=torch.tensor([[0, 4, 1]]))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, T\) = \(1, 3\), got \(1, 2\)"):
        enc(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 2))
    with pytest.raises(ValueError, match="input_ids must be an integer tensor"):
        enc(torch.ones(1, 3))


@pytest.mark.parametrize("position", POSITIONS)
def test_every_position_scheme_builds_and_trains(position):
    enc, cfg = _encoder(position=position)
    enc.train()
    ids = _ids(cfg)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 5:] = False
    out = enc(ids, mask)
    out.last_hidden_state.sum().backward()
    assert out.last_hidden_state.shape == (B, T, cfg.d_model)
    assert torch.isfinite(out.last_hidden_state).all()
    enc.eval()
    full = enc(ids, mask, output_attentions=True)
    torch.testing.assert_close(full.last_hidden_state, enc(ids, mask).last_hidden_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_positions_on_queries_and_keys_only(position):
    enc, cfg = _encoder(position=position, position_qk_only=True)
    assert enc.embeddings.positions is None and enc.qk_positions is not None
    out = enc(_ids(cfg))
    assert torch.isfinite(out.last_hidden_state).all()


@pytest.mark.parametrize("overrides", [
    dict(similarity="cosine"), dict(similarity="additive"), dict(similarity="dot", qkv_proj=False,
                                                                 out_proj=False),
    dict(activation="relu"), dict(attention_path="chunked", chunk_size=3), dict(type_vocab_size=0),
])
def test_attention_options_from_config(overrides):
    enc, cfg = _encoder(**overrides)
    out = enc(_ids(cfg), output_attentions=True)
    assert out.attentions[0].shape == (B, cfg.attention.n_heads, T, T)


# --- norm, feed-forward and embedding variants (ModelConfig → builders) ---------------------------

_MODERN = dict(norm="pre", norm_type="rmsnorm", feed_forward="glu", activation="silu", embed_scale=True,
               first_attention_norm=False, position="rope", type_vocab_size=0, dropout=0.0)


def _norms(module):
    return [m for m in module.modules() if isinstance(m, (nn.LayerNorm, RMSNorm))]


def test_rmsnorm_is_every_norm_of_the_model():
    cfg = ModelConfig.preset("tiny", norm="pre", norm_type="rmsnorm", layer_norm_eps=1e-6)
    model = build_masked_lm(cfg)
    norms = _norms(model)
    assert len(norms) == 1 + 2 * cfg.n_layers + 1 + 1  # embeddings, layers, final norm, MLM head
    assert all(isinstance(m, RMSNorm) and m.eps == 1e-6 for m in norms)
    assert isinstance(model.encoder.final_norm, RMSNorm) and isinstance(model.head.norm, RMSNorm)
    assert all(torch.equal(m.weight, torch.ones(cfg.d_model)) for m in norms)  # init_weights: γ = 1


def test_final_norm_follows_norm_type_and_norm_bias():
    enc, _ = _encoder(norm="pre", norm_bias=False)
    assert isinstance(enc.final_norm, nn.LayerNorm) and enc.final_norm.bias is None


def test_bias_free_encoder_has_no_bias_parameter():
    enc, cfg = _encoder(norm_bias=False, mlp_bias=False, attention_bias=False)
    names = [n for n, _ in enc.named_parameters()]
    assert names and not [n for n in names if "bias" in n]
    assert all(m.bias is None for m in _norms(enc))
    with_bias = [n for n, _ in _encoder()[0].named_parameters() if "bias" in n]
    assert len(with_bias) == 1 + cfg.n_layers * 6  # emb norm; qkv, out, ff1, ff2, norm1, norm2
    # init_weights on LayerNorms without β: γ = 1 after any change
    with torch.no_grad():
        for m in _norms(enc):
            m.weight.mul_(3.0)
    init_weights(enc, 0.02)
    assert all(torch.equal(m.weight, torch.ones(cfg.d_model)) for m in _norms(enc))


def test_gated_feed_forward_is_built_from_the_config():
    enc, cfg = _encoder(feed_forward="glu", activation="silu", mlp_bias=False)
    for layer in enc.layers:
        ff = layer.feed_forward
        assert isinstance(ff, GatedFeedForward) and ff.activation_name == "silu"
        assert ff.linear1.weight.shape == (2 * cfg.ffn.d_ff, cfg.d_model) and ff.linear1.bias is None
        assert ff.linear2.weight.shape == (cfg.d_model, cfg.ffn.d_ff) and ff.linear2.bias is None
    assert all(isinstance(layer.feed_forward, FeedForward) for layer in _encoder()[0].layers)


@pytest.mark.parametrize("scale", [True, False])
def test_embed_scale_multiplies_token_embeddings_by_sqrt_c(scale):
    enc, cfg = _encoder(dropout=0.0, embed_scale=scale)
    ids = _ids(cfg)
    seg = torch.randint(0, cfg.type_vocab_size, (B, T))
    e = enc.embeddings
    s = 24 ** 0.5 if scale else 1.0  # C = 24
    with torch.no_grad():
        x = e.tokens.weight[ids] * s + e.positions.weight[:T] + e.segments.weight[seg]  # by hand
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        want = (x - mean) / torch.sqrt(var + cfg.norm.eps) * e.norm.weight + e.norm.bias
        got = enc(ids, token_type_ids=seg, output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_first_attention_norm_false_skips_only_the_first_layers_attention_norm():
    enc, cfg = _encoder(norm="pre", first_attention_norm=False, n_layers=3)
    assert isinstance(enc.layers[0].norm1, nn.Identity)
    assert all(isinstance(layer.norm1, nn.LayerNorm) for layer in enc.layers[1:])
    assert all(isinstance(layer.norm2, nn.LayerNorm) for layer in enc.layers)
    assert not any(isinstance(layer.norm1, nn.Identity) for layer in _encoder(norm="pre")[0].layers)


def test_modern_variants_train_and_packed_equals_padded():
    enc, cfg = _encoder(**_MODERN)
    ids = _ids(cfg)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 4:] = False
    ids = ids.masked_fill(~mask, cfg.pad_token_id)
    want = enc(ids, mask).last_hidden_state
    packed = enc.forward_packed(PackedBatch.from_padded(ids, mask)).last_hidden_state  # (N,C)
    torch.testing.assert_close(packed, want[mask], atol=1e-5, rtol=1e-5)
    enc.train()
    enc(ids, mask).last_hidden_state.sum().backward()
    assert all(p.grad is not None for p in enc.parameters())
