"""Feed-forward and transformer layer against torch.nn.TransformerEncoderLayer (weights copied)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.models.builders import build_attention
from qkv.nn.layer import FeedForward, TransformerLayer

B, T, C, H, FF = 5, 7, 24, 3, 40


def _layer(norm, activation="gelu", dropout=0.0):
    att = build_attention(C, H)
    return TransformerLayer(att, FeedForward(C, FF, activation=activation), norm1=nn.LayerNorm(C, eps=1e-5),
                            norm2=nn.LayerNorm(C, eps=1e-5), norm=norm, dropout=dropout)


def _randomise(module):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.3)


def _torch_reference(layer, norm, activation):
    ref = nn.TransformerEncoderLayer(C, H, FF, dropout=0.0, activation=activation, layer_norm_eps=1e-5,
                                     batch_first=True, norm_first=norm == "pre")
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(layer.attention.qkv_proj.weight)  # same [q; k; v] rows
        ref.self_attn.in_proj_bias.copy_(layer.attention.qkv_proj.bias)
        ref.self_attn.out_proj.weight.copy_(layer.attention.out_proj.weight)
        ref.self_attn.out_proj.bias.copy_(layer.attention.out_proj.bias)
        for ours, theirs in ((layer.feed_forward.linear1, ref.linear1), (layer.feed_forward.linear2, ref.linear2),
                             (layer.norm1, ref.norm1), (layer.norm2, ref.norm2)):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)
    return ref.eval()


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_feed_forward_matches_formula(activation):
    ff = FeedForward(C, FF, activation=activation)
    x = torch.randn(B, T, C)
    act = F.gelu if activation == "gelu" else F.relu
    want = act(x @ ff.linear1.weight.T + ff.linear1.bias) @ ff.linear2.weight.T + ff.linear2.bias
    torch.testing.assert_close(ff(x), want, atol=1e-6, rtol=1e-6)


def test_unknown_activation():
    with pytest.raises(ValueError, match="unknown activation 'swish'; allowed: gelu, gelu_tanh, relu"):
        FeedForward(C, FF, activation="swish")


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_layer_matches_torch_encoder_layer(norm, activation):
    layer = _layer(norm, activation).eval()
    _randomise(layer)
    ref = _torch_reference(layer, norm, activation)
    x = torch.randn(B, T, C)
    real = torch.ones(B, T, dtype=torch.bool)
    real[1, 4:] = False
    real[3, 2:] = False
    got = layer(x, real).output
    with torch.no_grad():
        want = ref(x, src_key_padding_mask=~real)
    ok = real[..., None]  # torch's fast path may zero padded rows: compare real positions
    torch.testing.assert_close(got * ok, want * ok, atol=1e-5, rtol=1e-5)
    got_all = layer(x).output
    torch.testing.assert_close(got_all, ref(x), atol=1e-5, rtol=1e-5)


def test_layer_returns_exact_weights_only_when_asked():
    layer = _layer("post").eval()
    x = torch.randn(B, T, C)
    assert layer(x).attention_weights is None
    out = layer(x, need_weights=True)
    assert out.attention_weights.shape == (B, H, T, T)
    torch.testing.assert_close(out.output, layer(x).output, atol=1e-6, rtol=1e-6)


def test_bert_dropout_placement():
    """Dropout acts on the attention output and on the FFN output, before each residual sum."""
    layer = _layer("post", dropout=0.1).train()
    seen = []
    layer.dropout.register_forward_hook(lambda m, inp, out: seen.append(inp[0].detach()))
    x = torch.randn(B, T, C)
    layer(x)
    assert len(seen) == 2
    with torch.no_grad():
        torch.testing.assert_close(seen[0], layer.attention(x).output)
    assert not any(isinstance(m, nn.Dropout) for m in layer.feed_forward.modules())


def test_dropout_off_in_eval_and_active_in_train():
    layer = _layer("post", dropout=0.5)
    x = torch.randn(B, T, C)
    layer.eval()
    torch.testing.assert_close(layer(x).output, layer(x).output)
    layer.train()
    assert not torch.allclose(layer(x).output, layer(x).output)


def test_unknown_norm():
    with pytest.raises(ValueError, match="unknown norm placement 'mid'; allowed: post, pre"):
        TransformerLayer(build_attention(C, H), FeedForward(C, FF), norm1=nn.LayerNorm(C), norm2=nn.LayerNorm(C),
                         norm="mid")
