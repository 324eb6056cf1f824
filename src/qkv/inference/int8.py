"""int8 dynamic quantisation of linear maps, per output channel.

Legend: N rows (tokens), I input width, O output width.

:class:`Int8Linear` stores the weight as int8 with one scale per output row (per-channel) and, at
each call, quantises its input to 8 bits with one scale for the whole input (dynamic: measured
from the values, no calibration), multiplies in integers (PyTorch's x86 / fbgemm kernels, VNNI
where the CPU has it) and returns float32. Per-channel weight scales matter: one scale for a whole
weight matrix lets its largest row set the step of every row.

Which linear maps are quantised is chosen by measurement (see
:data:`qkv.inference.prepare.INT8_KINDS` and ``docs/inference.md``): the maps whose *input* is
heavy-tailed — the feed-forward block's maps read the norm's output, with a few very large
channels, and the activation — lose most when their input shares one 8-bit scale, so they stay
in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkv.nn.layer import ACTIVATIONS

__all__ = ["Int8Linear"]


def _engine() -> str:
    engines = torch.backends.quantized.supported_engines
    return "x86" if "x86" in engines else "fbgemm"


class Int8Linear(nn.Module):
    """``act(x Wᵀ + b)`` with W in int8 (per-channel scales) and x quantised dynamically; float32 out.

    Args:
        linear: the ``nn.Linear`` to quantise (its float weights are not kept).
        activation: ``None`` or ``"gelu"``, ``"gelu_tanh"``, ``"relu"``, ``"silu"``, applied after.
    """

    def __init__(self, linear: nn.Linear, activation: str | None = None):
        super().__init__()
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
        from torch.ao.quantization import per_channel_dynamic_qconfig

        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; allowed: {', '.join(ACTIVATIONS)}")
        torch.backends.quantized.engine = _engine()
        source = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
        with torch.no_grad():
            source.weight.copy_(linear.weight.float())
            if linear.bias is not None:
                source.bias.copy_(linear.bias.float())
        source.qconfig = per_channel_dynamic_qconfig
        self.inner = DynamicLinear.from_float(source)
        self.in_features, self.out_features, self.activation = linear.in_features, linear.out_features, activation

    @property
    def weight(self) -> Tensor:
        """``(O,I)`` the dequantised weight (what the int8 weight stands for), float32."""
        return self.inner.weight().dequantize()

    def forward(self, x: Tensor) -> Tensor:
        """``(…,I)`` → ``(…,O)`` float32."""
        y = self.inner(x.float().contiguous())
        return y if self.activation is None else ACTIVATIONS[self.activation](y)

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel{act}"
