"""Feed-forward and transformer layer against torch.nn.TransformerEncoderLayer (weights copied)."""

import pytest
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from qkv.models.builders import build_attention
from qkv.nn.feed_forward import FEED_FORWARDS, FeedForward, GatedFeedForward
from qkv.nn.layer import TransformerLayer
from qkv.nn.norms import RMSNorm

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


def _randomised_glu(activation, bias=True):
    torch.manual_seed(2)
    ff = GatedFeedForward(C, FF, activation=activation, bias=bias)
    _randomise(ff)
    return ff


@pytest.mark.parametrize("bias", [True, False])
def test_geglu_matches_modernbert_mlp(bias):
    from transformers import ModernBertConfig
    from transformers.models.modernbert.modeling_modernbert import ModernBertMLP

    ff = _randomised_glu("gelu", bias)
    ref = ModernBertMLP(ModernBertConfig(hidden_size=C, intermediate_size=FF, hidden_activation="gelu",
                                         mlp_bias=bias, num_attention_heads=H)).eval()
    with torch.no_grad():
        ref.Wi.weight.copy_(ff.linear1.weight)  # (2F,C): [input; gate] rows, ModernBERT's order
        ref.Wo.weight.copy_(ff.linear2.weight)
        if bias:
            ref.Wi.bias.copy_(ff.linear1.bias)
            ref.Wo.bias.copy_(ff.linear2.bias)
    x = torch.randn(B, T, C)
    with torch.no_grad():
        want = ref(x)
    torch.testing.assert_close(ff(x), want, atol=1e-5, rtol=1e-5)  # autograd path
    with torch.no_grad():
        torch.testing.assert_close(ff(x), want, atol=1e-5, rtol=1e-5)  # in-place path
    assert (ff.linear1.bias is None) == (not bias) and (ff.linear2.bias is None) == (not bias)


def test_swiglu_matches_llama_mlp():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    ff = _randomised_glu("silu")
    ref = LlamaMLP(LlamaConfig(hidden_size=C, intermediate_size=FF, hidden_act="silu", mlp_bias=True,
                                   num_attention_heads=H, num_key_value_heads=H)).eval()
    with torch.no_grad():
        w, b = ff.linear1.weight, ff.linear1.bias  # (2F,C), (2F,)
        ref.gate_proj.weight.copy_(w[:FF])  # first half: through the activation
        ref.gate_proj.bias.copy_(b[:FF])
        ref.up_proj.weight.copy_(w[FF:])  # second half: the gate
        ref.up_proj.bias.copy_(b[FF:])
        ref.down_proj.weight.copy_(ff.linear2.weight)
        ref.down_proj.bias.copy_(ff.linear2.bias)
        x = torch.randn(B, T, C)
        want = ref(x)
        torch.testing.assert_close(ff(x), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ff(x), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "silu"])
def test_glu_in_place_path_equals_autograd_path(activation):
    ff = _randomised_glu(activation)
    x = torch.randn(B, T, C)
    grad = ff(x)
    assert grad.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(ff(x), grad.detach(), atol=0, rtol=0)
    grad.sum().backward()
    assert ff.linear1.weight.grad.shape == (2 * FF, C)


def test_feed_forward_forms_and_bias_free_mlp():
    assert FEED_FORWARDS == {"mlp": FeedForward, "glu": GatedFeedForward}
    ff = FeedForward(C, FF, bias=False)
    assert [n for n, _ in ff.named_parameters()] == ["linear1.weight", "linear2.weight"]
    x = torch.randn(B, T, C)
    torch.testing.assert_close(ff(x), F.gelu(x @ ff.linear1.weight.T) @ ff.linear2.weight.T)


def test_identity_first_norm_and_rmsnorm_in_a_pre_ln_layer():
    """``h = x + Att(x)`` (no first norm), ``y = h + FFN(RMSNorm(h))``, by hand."""
    att = build_attention(C, H)
    norm2 = RMSNorm(C, eps=1e-6)
    layer = TransformerLayer(att, FeedForward(C, FF), norm1=nn.Identity(), norm2=norm2, norm="pre",
                             dropout=0.0).eval()
    _randomise(layer)
    x = torch.randn(B, T, C)
    with torch.no_grad():
        h = x + att(x).output
        want = h + layer.feed_forward(h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6) * norm2.weight)
        torch.testing.assert_close(layer(x).output, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="norm1=nn.Identity\\(\\) needs norm='pre'"):
        TransformerLayer(att, FeedForward(C, FF), norm1=nn.Identity(), norm2=norm2, norm="post")


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


def test_from_layer_to_kernel_is_four_qkv_frames(monkeypatch):
    """layer.forward → attention.forward → the plan the module was built with → the backend → the
    kernel: the backend is decided when the module is built, not re-decided through string lookups
    (torch's own ``Module.__call__`` frames between the modules are not counted)."""
    import inspect

    import torch.nn.functional as F

    from qkv.config import ModelConfig
    from qkv.models.builders import build_encoder

    kernel, seen = F.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        frames = [(f.function, Path(f.filename)) for f in inspect.stack()[1:]]
        ours = [(fn, path.parent.name + "/" + path.name) for fn, path in frames if "qkv" in path.parts]
        seen.append(ours[: [p for _, p in ours].index("nn/layer.py") + 1])
        return kernel(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    enc = build_encoder(ModelConfig.preset("tiny", dropout=0.0)).eval()
    with torch.no_grad():
        enc(torch.randint(1, 97, (2, 7)))
    assert seen[0] == [("run", "backends/sdpa.py"), ("run", "nn/attend.py"), ("forward", "nn/attention.py"),
                       ("forward", "nn/layer.py")], seen[0]
