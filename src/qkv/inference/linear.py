"""Linear maps for inference: weights stored once in the precision they run in, the activation fused.

Legend: N rows (tokens), I input width, O output width.

:class:`InferenceLinear` replaces an ``nn.Linear`` (and, in a feed-forward block, the activation
after it) in a model prepared by :func:`qkv.inference.for_inference`. On a CPU it calls oneDNN's
linear kernel (``torch.ops.mkldnn._linear_pointwise``, the kernel ``torch.compile`` uses on CPU),
which chooses its micro-kernels by the CPU's instruction sets and applies the activation inside the
GEMM; elsewhere (CUDA, a build without oneDNN) it is ``F.linear`` followed by the activation.

* float32: the same function as ``nn.Linear`` up to float rounding (the order of the sums).
* bfloat16: weights stored in bfloat16, the input rounded to bfloat16, float32 accumulation, a
  bfloat16 output. The residual stream stays float32: ``x + out`` promotes to float32, and the norms
  run in float32.

No autograd: the module holds plain tensors (buffers), not parameters, and is for inference only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.inference.support import onednn_linear_available
from qkv.nn.layer import ACTIVATIONS

__all__ = ["InferenceLinear", "FUSED_ACTIVATIONS"]

#: activation name → (oneDNN post-op, its algorithm): what can be fused into the GEMM.
FUSED_ACTIVATIONS: dict[str, tuple[str, str]] = {
    "gelu": ("gelu", "none"),  # exact erf form
    "gelu_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
}


class InferenceLinear(nn.Module):
    """``act(x Wᵀ + b)`` for inference, in float32 or bfloat16.

    Args:
        linear: the ``nn.Linear`` whose weights are copied (cast to ``dtype``).
        dtype: ``torch.float32`` or ``torch.bfloat16``.
        activation: ``None`` or a name in :data:`FUSED_ACTIVATIONS`, applied to the output.
    """

    def __init__(self, linear: nn.Linear, dtype: torch.dtype = torch.float32, activation: str | None = None):
        super().__init__()
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"InferenceLinear runs in float32 or bfloat16, not {dtype}")
        if activation is not None and activation not in FUSED_ACTIVATIONS:
            raise ValueError(f"cannot fuse activation {activation!r}; fusable: {', '.join(FUSED_ACTIVATIONS)}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype, self.activation = dtype, activation
        self.register_buffer("weight", linear.weight.detach().to(dtype).contiguous())  # (O,I)
        bias = None if linear.bias is None else linear.bias.detach().to(dtype).contiguous()  # (O,)
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        """``(…,I)`` → ``(…,O)`` in this module's dtype."""
        x = x.to(self.dtype)
        if x.device.type == "cpu" and onednn_linear_available():
            attr, algorithm = FUSED_ACTIVATIONS.get(self.activation, ("none", ""))
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, attr, [], algorithm)
        y = F.linear(x, self.weight, self.bias)
        return y if self.activation is None else ACTIVATIONS[self.activation](y)

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"dtype={str(self.dtype).replace('torch.', '')}{act}")
