"""qkv.nn.linear and qkv.nn.maps: the inference linear maps against F.linear (float32, bfloat16, int8 with
per-channel scales and smoothing), their state round trip, and how a LinearMaps makes each kind of map."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.hardware import precision_unsupported
from qkv.nn.linear import InferenceLinear, Int8Linear
from qkv.nn.maps import INT8_KINDS, LinearMaps, linear_shape

CPU = torch.device("cpu")
BF16 = precision_unsupported("bf16", CPU)
INT8 = precision_unsupported("int8", CPU)
needs_bf16 = pytest.mark.skipif(BF16 is not None, reason=f"bf16 not offered here: {BF16}")
needs_int8 = pytest.mark.skipif(INT8 is not None, reason=f"int8 not offered here: {INT8}")


@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "relu", "silu"])
@pytest.mark.parametrize("shape", [(7, 24), (2, 5, 24)])
def test_inference_linear_fp32_equals_f_linear(activation, shape):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    x = torch.randn(*shape)
    ref = F.linear(x, lin.weight, lin.bias)
    ref = {None: lambda y: y, "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
           "relu": F.relu, "silu": F.silu}[activation](ref)
    out = InferenceLinear.of(lin, torch.float32, activation)(x)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # a strided (non-contiguous) input gives the same
    xt = torch.randn(24, *shape[:-1]).movedim(0, -1)
    torch.testing.assert_close(InferenceLinear.of(lin)(xt), F.linear(xt, lin.weight, lin.bias), atol=1e-5, rtol=1e-5)


def test_inference_linear_without_bias_and_bad_arguments():
    lin = nn.Linear(24, 40, bias=False)
    x = torch.randn(3, 24)
    torch.testing.assert_close(InferenceLinear.of(lin)(x), x @ lin.weight.T, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        InferenceLinear.of(lin, torch.float16)
    with pytest.raises(ValueError, match="cannot fuse activation 'tanh'"):
        InferenceLinear.of(lin, torch.float32, "tanh")


@needs_bf16
def test_inference_linear_bf16_is_f_linear_on_bf16_inputs():
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    x = torch.randn(9, 24)
    out = InferenceLinear.of(lin, torch.bfloat16, "gelu")(x)
    assert out.dtype == torch.bfloat16
    # reference: the same rounded inputs and weights, float32 arithmetic
    ref = F.gelu(F.linear(x.bfloat16().float(), lin.weight.bfloat16().float(), lin.bias.bfloat16().float()))
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=1e-2)


@needs_int8
def test_int8_linear_is_close_to_f_linear_and_per_channel():
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    with torch.no_grad():
        lin.weight[:20] *= 100  # rows of very different size: per-channel scales keep the small ones
    x = torch.randn(9, 24)
    q = Int8Linear.of(lin)
    ref = F.linear(x, lin.weight, lin.bias)
    out = q(x)
    assert out.dtype == torch.float32
    small = slice(20, 40)
    rel = (out[:, small] - ref[:, small]).norm() / ref[:, small].norm()
    assert rel < 0.02, rel
    # the dequantised weight is within half a step of each row's scale
    step = lin.weight.abs().amax(1, keepdim=True) / 127
    assert ((q.weight - lin.weight).abs() <= step * 0.51).all()


@needs_int8
def test_int8_linear_with_smoothing_computes_the_same_product():
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    x = torch.randn(50, 24)
    x[:, 3] *= 60  # one outlier channel, as in a transformer's norm output
    plain = Int8Linear.of(lin)
    s = torch.ones(24)
    s[3] = 60.0 ** 0.7
    smooth = Int8Linear.of(lin, input_scale=s)
    with torch.no_grad():
        ref = F.linear(x, lin.weight, lin.bias)
        err = lambda m: float((m(x) - ref).norm() / ref.norm())  # noqa: E731
        assert err(smooth) < 0.5 * err(plain) and err(smooth) < 0.01, (err(smooth), err(plain))
        scaled = lin.weight * s  # (O,I): W·diag(s), what is stored in int8 steps of each row
        step = scaled.abs().amax(1, keepdim=True) / 127
        assert ((smooth.weight * s - scaled).abs() <= step * 0.51).all()
    with pytest.raises(ValueError, match="input_scale must hold 24 positive"):
        Int8Linear.of(lin, input_scale=torch.zeros(24))

def test_inference_linear_is_filled_by_load_state_dict():
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    empty = InferenceLinear(24, 40)
    assert torch.count_nonzero(empty.weight) == 0
    empty.load_state_dict(lin.state_dict())
    x = torch.randn(3, 24)
    torch.testing.assert_close(empty(x), lin(x), atol=1e-5, rtol=1e-5)
    assert linear_shape(empty) == linear_shape(lin) == (40, 24)


@needs_int8
def test_int8_linear_state_round_trips_through_the_float_weight():
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    s = torch.rand(24) + 0.5
    q = Int8Linear.of(lin, input_scale=s)
    state = q.state_dict()
    assert set(state) == {"weight", "bias"}  # what an nn.Linear holds
    again = Int8Linear(24, 40)
    again.load_state_dict({**state, "input_scale": s})
    x = torch.randn(6, 24)
    # quantised again from the float weight it stands for: within one int8 step of each row
    step = (q.weight * s).abs().amax(1, keepdim=True) / 127
    assert (((again.weight - q.weight) * s).abs() <= step * 1.01).all()
    torch.testing.assert_close(again.bias, q.bias)
    ref = lin(x)
    assert float((again(x) - ref).detach().norm() / ref.detach().norm()) < 0.02
    with pytest.raises(RuntimeError, match="size mismatch"):
        Int8Linear(24, 41).load_state_dict(state)


@pytest.mark.parametrize("precision", [None, "fp32", "bf16", "int8"])
def test_linear_maps_make_each_kind(precision):
    maps = LinearMaps(precision)
    made = {kind: maps.linear(24, 40, kind=kind, activation="gelu") for kind in ("qkv", "out", "ffn_in", "ffn_out", None)}
    if precision is None:
        assert all(type(m) is nn.Linear for m in made.values()) and not maps.fuses("gelu")
        return
    want = {kind: Int8Linear if precision == "int8" and kind in INT8_KINDS else InferenceLinear for kind in made}
    assert {k: type(m) for k, m in made.items()} == want
    assert all(m.activation == "gelu" for m in made.values()) and maps.fuses("gelu") and not maps.fuses("tanh")
    with pytest.raises(ValueError, match="precision='fp16' is not allowed"):
        LinearMaps("fp16")
    with pytest.raises(ValueError, match="int8_kinds \\['attention'\\] unknown"):
        LinearMaps("int8", int8_kinds=("attention",))
