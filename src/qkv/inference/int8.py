"""int8 dynamic quantisation of linear maps: per-channel weight scales, smoothed inputs.

Legend: N rows (tokens), I input width, O output width.

:class:`Int8Linear` stores the weight as int8 with one scale per output row (per-channel) and, at
each call, quantises its input with one scale for the whole input (dynamic: measured from the
values), multiplies in integers (PyTorch's x86 / fbgemm kernels) and returns float32.

* Per-channel weight scales: one scale for a whole weight matrix lets its largest row set the step
  of every row.
* Smoothing (Xiao et al. 2023, "SmoothQuant"): a transformer's activations have a few input
  channels far larger than the rest, and one 8-bit scale for the input lets them set the step of
  every channel. With ``input_scale`` s (one positive number per input channel) the layer computes
  ``(x / s)(W·diag(s))ᵀ`` — the same product — so the large channels are divided down and the
  weight columns that meet them take the scale instead, where per-channel weight scales absorb it.
  :func:`smoothing_scale` gives ``s_j = max|x_j|^α / max|W_·j|^(1-α)`` from calibration maxima.
* 8-bit inputs where the CPU has VNNI (AVX-512 VNNI or AVX-VNNI); without it PyTorch's AVX2 kernel
  sums pairs of u8×s8 products in 16 bits, which can overflow, and the input is quantised to 7 bits
  (PyTorch's ``reduce_range``) — less accurate.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from qkv.inference.support import cpu_features
from qkv.nn.layer import ACTIVATIONS

__all__ = ["Int8Linear", "smoothing_scale", "full_range_inputs"]


def full_range_inputs() -> bool:
    """Whether inputs are quantised to 8 bits (the CPU has VNNI) rather than 7 (``reduce_range``)."""
    f = cpu_features()
    return bool(f["avx512_vnni"] or f["avx_vnni"])


def smoothing_scale(input_max: Tensor, weight: Tensor, alpha: float) -> Tensor:
    """``s_j = max|x_j|^α / max_o |W_oj|^(1-α)``, ``(I,)``, from the calibration maxima ``(I,)`` of the
    input and the weight ``(O,I)``; channels never seen non-zero get s = 1."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    a = input_max.float().clamp(min=1e-5)  # (I,)
    w = weight.float().abs().amax(dim=0).clamp(min=1e-5)  # (O,I) -> (I,)
    s = a.pow(alpha) / w.pow(1.0 - alpha)  # (I,)
    return torch.where(input_max > 0, s, torch.ones_like(s)).clamp(min=1e-5)


def _engine() -> str:
    engines = torch.backends.quantized.supported_engines
    return "x86" if "x86" in engines else "fbgemm"


class Int8Linear(nn.Module):
    """``act(x Wᵀ + b)`` with W in int8 (per-channel scales) and x quantised dynamically; float32 out.

    Args:
        linear: the ``nn.Linear`` (or a module with ``weight (O,I)``, ``bias``, ``in_features``,
            ``out_features``) to quantise; its float weights are not kept.
        activation: ``None`` or ``"gelu"``, ``"gelu_tanh"``, ``"relu"``, ``"silu"``, applied after.
        input_scale: ``(I,)`` positive smoothing scales s (see the module docstring), or ``None``.
    """

    def __init__(self, linear: nn.Module, activation: str | None = None, *, input_scale: Tensor | None = None):
        super().__init__()
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
        from torch.ao.quantization import per_channel_dynamic_qconfig

        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; allowed: {', '.join(ACTIVATIONS)}")
        torch.backends.quantized.engine = _engine()
        weight = linear.weight.detach().float()  # (O,I)
        if input_scale is not None:
            input_scale = input_scale.detach().float().reshape(-1)  # (I,)
            if input_scale.numel() != linear.in_features or not bool((input_scale > 0).all()):
                raise ValueError(f"input_scale must hold {linear.in_features} positive numbers, got "
                                 f"{tuple(input_scale.shape)}")
            weight = weight * input_scale[None, :]  # (O,I) · (1,I): W·diag(s)
        self.register_buffer("inv_scale", None if input_scale is None else 1.0 / input_scale)  # (I,)
        self.reduce_range = not full_range_inputs()
        source = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
        with torch.no_grad():
            source.weight.copy_(weight)
            if linear.bias is not None:
                source.bias.copy_(linear.bias.float())
        source.qconfig = per_channel_dynamic_qconfig
        with warnings.catch_warnings():  # PyTorch's notice that torch.ao quantised tensors are deprecated
            warnings.filterwarnings("ignore", message=r".*quantize_per_(tensor|channel).*deprecated")
            self.inner = DynamicLinear.from_float(source)
        self.in_features, self.out_features, self.activation = linear.in_features, linear.out_features, activation

    @property
    def weight(self) -> Tensor:
        """``(O,I)`` the dequantised weight (what the int8 weight stands for, smoothing undone), float32."""
        w = self.inner.weight().dequantize()  # (O,I) = W·diag(s) in int8 steps
        return w if self.inv_scale is None else w * self.inv_scale[None, :]

    def forward(self, x: Tensor) -> Tensor:
        """``(…,I)`` → ``(…,O)`` float32."""
        x = x.float()
        if self.inv_scale is not None:
            x = x * self.inv_scale  # (…,I): x / s
        y = torch.ops.quantized.linear_dynamic(x.contiguous(), self.inner._packed_params._packed_params,
                                               reduce_range=self.reduce_range)
        return y if self.activation is None else ACTIVATIONS[self.activation](y)

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation else ""
        smooth = ", smoothed" if self.inv_scale is not None else ""
        bits = 7 if self.reduce_range else 8
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel{smooth}, "
                f"{bits}-bit inputs{act}")
