"""Linear maps for inference: weights stored once in the precision they run in, the activation fused.

Legend: N rows (tokens), I input width, O output width.

Both are built empty (``InferenceLinear(I, O)``, ``Int8Linear(I, O)``) by
:class:`~qkv.nn.maps.LinearMaps` and filled by ``load_state_dict`` from a float model's ``weight``
and ``bias`` (``of(linear)`` makes one from an ``nn.Linear``). No autograd: they hold buffers, not
parameters, and are for inference only.

:class:`InferenceLinear` calls oneDNN's linear kernel on a CPU (``torch.ops.mkldnn._linear_pointwise``,
the kernel ``torch.compile`` uses on CPU), which chooses its micro-kernels by the CPU's instruction
sets and applies the activation inside the GEMM; elsewhere (CUDA, a build without oneDNN) it is
``F.linear`` followed by the activation.

* float32: the same function as ``nn.Linear`` up to float rounding (the order of the sums).
* bfloat16: weights stored in bfloat16, the input rounded to bfloat16, float32 accumulation, a
  bfloat16 output. The residual stream stays float32: ``x + out`` promotes to float32, and the norms
  run in float32.

:class:`Int8Linear` stores the weight as int8 with one scale per output row (per-channel) and, at
each call, quantises its input with one scale for the whole input (dynamic: measured from the
values), multiplies in integers (PyTorch's x86 / fbgemm kernels) and returns float32.

* Per-channel weight scales: one scale for a whole weight matrix lets its largest row set the step
  of every row.
* Smoothing (Xiao et al. 2023, "SmoothQuant"): a transformer's activations have a few input
  channels far larger than the rest, and one 8-bit scale for the input lets them set the step of
  every channel. With ``input_scale`` s (one positive number per input channel, a state entry beside
  the weight) the layer computes ``(x / s)(W·diag(s))ᵀ`` — the same product — so the large channels
  are divided down and the weight columns that meet them take the scale instead, where per-channel
  weight scales absorb it. :func:`smoothing_scale` gives ``s_j = max|x_j|^α / max|W_·j|^(1-α)``.
* 8-bit inputs where the CPU has VNNI (AVX-512 VNNI or AVX-VNNI); without it PyTorch's AVX2 kernel
  sums pairs of u8×s8 products in 16 bits, which can overflow, and the input is quantised to 7 bits
  (PyTorch's ``reduce_range``) — less accurate.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.hardware import cpu_features, onednn_linear_available
from qkv.nn.activations import ACTIVATIONS

__all__ = ["InferenceLinear", "Int8Linear", "FUSED_ACTIVATIONS", "smoothing_scale", "full_range_inputs"]

#: activation name → (oneDNN post-op, its algorithm): what can be fused into the GEMM.
FUSED_ACTIVATIONS: dict[str, tuple[str, str]] = {
    "gelu": ("gelu", "none"),  # exact erf form
    "gelu_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
}


def _check(in_features: int, out_features: int, activation: str | None) -> None:
    for name, n in (("in_features", in_features), ("out_features", out_features)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    if activation is not None and activation not in FUSED_ACTIVATIONS:
        raise ValueError(f"cannot fuse activation {activation!r}; fusable: {', '.join(FUSED_ACTIVATIONS)}")


class InferenceLinear(nn.Module):
    """``act(x Wᵀ + b)`` for inference, in float32 or bfloat16 (see the module docstring).

    Args:
        in_features: I. out_features: O. bias: a bias b.
        dtype: ``torch.float32`` or ``torch.bfloat16``.
        activation: ``None`` or a name in :data:`FUSED_ACTIVATIONS`, applied to the output.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 dtype: torch.dtype = torch.float32, activation: str | None = None):
        super().__init__()
        _check(in_features, out_features, activation)
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"InferenceLinear runs in float32 or bfloat16, not {dtype}")
        self.in_features, self.out_features = in_features, out_features
        self.dtype, self.activation = dtype, activation
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=dtype))  # (O,I)
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype) if bias else None)  # (O,)

    @classmethod
    def of(cls, linear: nn.Linear, dtype: torch.dtype = torch.float32, activation: str | None = None) -> InferenceLinear:
        """One holding ``linear``'s weights (cast to ``dtype``)."""
        out = cls(linear.in_features, linear.out_features, linear.bias is not None, dtype=dtype, activation=activation)
        out.load_state_dict(linear.state_dict())
        return out

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

    Built empty; ``load_state_dict`` quantises the float ``weight`` it is given (smoothed by an
    ``input_scale`` entry when there is one), and ``state_dict`` gives back what a float model holds:
    the weight the int8 one stands for (smoothing undone) and the bias.

    Args:
        in_features: I. out_features: O. bias: a bias b.
        activation: ``None`` or ``"gelu"``, ``"gelu_tanh"``, ``"relu"``, ``"silu"``, applied after.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, activation: str | None = None):
        super().__init__()
        _check(in_features, out_features, activation)
        self.in_features, self.out_features, self.activation = in_features, out_features, activation
        self.has_bias = bias
        self.reduce_range = not full_range_inputs()
        self.register_buffer("inv_scale", None)  # (I,): 1 / s, once smoothed
        self._quantise(torch.zeros(out_features, in_features), torch.zeros(out_features) if bias else None, None)

    @classmethod
    def of(cls, linear: nn.Module, activation: str | None = None, *, input_scale: Tensor | None = None) -> Int8Linear:
        """One quantising ``linear``'s weights (an ``nn.Linear`` or a module with ``weight`` and ``bias``)."""
        out = cls(linear.in_features, linear.out_features, linear.bias is not None, activation=activation)
        out._quantise(linear.weight.detach().float(), None if linear.bias is None else linear.bias.detach().float(),
                      input_scale)
        return out

    def _quantise(self, weight: Tensor, bias: Tensor | None, input_scale: Tensor | None) -> None:
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear  # noqa: PLC0415 - torch.ao loads slowly
        from torch.ao.quantization import per_channel_dynamic_qconfig  # noqa: PLC0415

        torch.backends.quantized.engine = _engine()
        weight = weight.float()  # (O,I)
        if input_scale is not None:
            input_scale = input_scale.detach().float().reshape(-1)  # (I,)
            if input_scale.numel() != self.in_features or not bool((input_scale > 0).all()):
                raise ValueError(f"input_scale must hold {self.in_features} positive numbers, got "
                                 f"{tuple(input_scale.shape)}")
            weight = weight * input_scale[None, :]  # (O,I) · (1,I): W·diag(s)
        self.inv_scale = None if input_scale is None else 1.0 / input_scale
        source = nn.Linear(self.in_features, self.out_features, bias=bias is not None)
        with torch.no_grad():
            source.weight.copy_(weight)
            if bias is not None:
                source.bias.copy_(bias.float())
        source.qconfig = per_channel_dynamic_qconfig
        with warnings.catch_warnings():  # PyTorch's notice that torch.ao quantised tensors are deprecated
            warnings.filterwarnings("ignore", message=r".*quantize_per_(tensor|channel).*deprecated")
            inner = DynamicLinear.from_float(source)
        self.__dict__["_inner"] = inner  # not a child module: the state holds the float weight instead

    @property
    def weight(self) -> Tensor:
        """``(O,I)`` the dequantised weight (what the int8 weight stands for, smoothing undone), float32."""
        w = self._inner.weight().dequantize()  # (O,I) = W·diag(s) in int8 steps
        return w if self.inv_scale is None else w * self.inv_scale[None, :]

    @property
    def bias(self) -> Tensor | None:
        """``(O,)`` float32, or ``None``."""
        return self._inner.bias() if self.has_bias else None

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # what a float model holds: a saved int8 model loads as an ordinary one (qkv.save, qkv.load)
        destination[prefix + "weight"] = self.weight
        if self.has_bias:
            destination[prefix + "bias"] = self.bias.detach().clone()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        names = ["weight"] + (["bias"] if self.has_bias else [])
        missing = [prefix + n for n in names if prefix + n not in state_dict]
        if missing:
            missing_keys.extend(missing)
            return
        weight = state_dict[prefix + "weight"]
        if tuple(weight.shape) != (self.out_features, self.in_features):
            error_msgs.append(f"size mismatch for {prefix}weight: {tuple(weight.shape)} in the state, "
                              f"{(self.out_features, self.in_features)} here")
            return
        self._quantise(weight, state_dict.get(prefix + "bias"), state_dict.get(prefix + "input_scale"))

    def forward(self, x: Tensor) -> Tensor:
        """``(…,I)`` → ``(…,O)`` float32."""
        x = x.float()
        if self.inv_scale is not None:
            x = x * self.inv_scale  # (…,I): x / s
        y = torch.ops.quantized.linear_dynamic(x.contiguous(), self._inner._packed_params._packed_params,
                                               reduce_range=self.reduce_range)
        return y if self.activation is None else ACTIVATIONS[self.activation](y)

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation else ""
        smooth = ", smoothed" if self.inv_scale is not None else ""
        bits = 7 if self.reduce_range else 8
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel{smooth}, "
                f"{bits}-bit inputs{act}")
