"""Norm registry: RMSNorm against transformers' LlamaRMSNorm, LayerNorm with and without β."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.nn.norms import NORM_TYPES, RMSNorm, build_norm, register_norm

B, T, C = 5, 7, 24


def _llama_rms_norm(width, eps):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm(width, eps=eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_llama_rmsnorm(dtype):
    torch.manual_seed(0)
    ours = build_norm("rmsnorm", C, eps=1e-5)
    ref = _llama_rms_norm(C, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(C))
        ref.weight.copy_(ours.weight)
    ours, ref = ours.to(dtype), ref.to(dtype)
    x = (torch.randn(B, T, C) * 3 + 1).to(dtype)
    got = ours(x)
    assert got.dtype == dtype
    torch.testing.assert_close(got, ref(x), atol=1e-6, rtol=1e-6)


def test_rmsnorm_formula_and_unit_start():
    x = torch.randn(B, T, C)
    norm = RMSNorm(C, eps=1e-6)
    assert torch.equal(norm.weight, torch.ones(C))
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), want, atol=1e-6, rtol=1e-6)
    assert RMSNorm(C, scale=False).weight is None
    assert list(dict(RMSNorm(C).named_parameters())) == ["weight"]


def test_rmsnorm_ignores_the_bias_option():
    assert not any("bias" in n for n, _ in build_norm("rmsnorm", C, eps=1e-6, bias=True).named_parameters())


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_with_and_without_beta(bias):
    norm = build_norm("layernorm", C, eps=1e-5, bias=bias)
    assert isinstance(norm, nn.LayerNorm) and (norm.bias is not None) == bias
    with torch.no_grad():
        norm.weight.copy_(torch.randn(C))
    x = torch.randn(B, T, C)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    want = (x - mean) / torch.sqrt(var + 1e-5) * norm.weight + (norm.bias if bias else 0)
    torch.testing.assert_close(norm(x), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(norm(x), F.layer_norm(x, (C,), norm.weight, norm.bias, 1e-5))


def test_unknown_and_duplicate_norm():
    with pytest.raises(ValueError, match="unknown norm 'batchnorm'; allowed: layernorm, rmsnorm"):
        build_norm("batchnorm", C, eps=1e-5)
    with pytest.raises(ValueError, match="norm 'rmsnorm' is already registered"):
        register_norm("rmsnorm")(lambda width, *, eps, bias: None)
    assert set(NORM_TYPES) >= {"layernorm", "rmsnorm"}
