"""A model prepared for inference in a chosen precision: :func:`for_inference`.

``for_inference(model, "bf16")`` returns a copy of ``model`` (the original is left as it is) in
eval mode, without gradients, whose linear maps are inference modules:

* ``"fp32"``: every ``nn.Linear`` becomes an :class:`~qkv.inference.linear.InferenceLinear` in
  float32 (oneDNN on CPU, the activation of a feed-forward block fused into its first map): the
  same function up to float rounding.
* ``"bf16"``: the same in bfloat16 (weights stored in bfloat16, float32 accumulation); embeddings,
  norms, softmax statistics and the residual stream stay float32. Offered where the CPU has
  bfloat16 instructions (AVX-512 BF16 or AMX) or on a GPU with bf16.
* ``"int8"``: the linear maps of the kinds in :data:`INT8_KINDS` become
  :class:`~qkv.inference.int8.Int8Linear` (int8 weights with per-channel scales, dynamic input
  quantisation); the others stay float32 InferenceLinear. CPU only.

The kinds of linear map in a layer: ``"qkv"`` (the fused Q/K/V map), ``"out"`` (the attention's
output map), ``"ffn_in"`` and ``"ffn_out"`` (the feed-forward block's first and second maps). Maps
outside the layers (pooler, task heads, ELECTRA's embedding projection) stay float32 in int8 mode.

Raises :class:`~qkv.errors.QkvError` for a precision that is unknown or not offered on the device
(:func:`check_precision`: one line saying why).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.inference.int8 import Int8Linear
from qkv.inference.linear import FUSED_ACTIVATIONS, InferenceLinear
from qkv.inference.support import precision_unsupported
from qkv.validation import check_choice

__all__ = ["PRECISIONS", "INT8_KINDS", "LINEAR_KINDS", "for_inference", "check_precision",
           "inference_precision", "InferenceFeedForward"]

PRECISIONS = ("fp32", "bf16", "int8")
#: The kinds of linear map inside a transformer layer.
LINEAR_KINDS = ("qkv", "out", "ffn_in", "ffn_out")
#: The kinds int8 mode quantises, chosen by measurement (all-MiniLM-L6-v2 on 200 20 Newsgroups
#: posts, worst cosine to float32 with only that kind in int8: out 0.9995, qkv 0.9948, ffn_in 0.9871,
#: ffn_out 0.9709; qkv + out 0.9945, qkv + ffn_in 0.9764): the feed-forward maps, whose inputs are
#: heavy-tailed (the activation; the norm's output with its few very large channels), stay float32.
INT8_KINDS = ("qkv", "out")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}


def check_precision(precision: str, device=None) -> str:
    """``precision`` if it is known and offered on ``device`` (default CPU), else :class:`QkvError`."""
    check_choice("precision", precision, PRECISIONS, error=QkvError)
    dev = torch.device("cpu" if device is None else device)
    why = precision_unsupported(precision, dev)
    if why is not None:
        offered = [p for p in PRECISIONS if precision_unsupported(p, dev) is None]
        raise QkvError(f"precision {precision!r} is not offered on {dev}: {why}; use one of "
                       f"{', '.join(offered)}")
    return precision


def inference_precision(model: nn.Module) -> str | None:
    """The precision :func:`for_inference` prepared ``model`` in, or ``None`` for a plain model."""
    return getattr(model, "_qkv_inference_precision", None)


class InferenceFeedForward(nn.Module):
    """``linear2(linear1(x))`` where ``linear1`` applies the activation itself (fused)."""

    def __init__(self, linear1: nn.Module, linear2: nn.Module, activation: str):
        super().__init__()
        self.linear1, self.linear2, self.activation_name = linear1, linear2, activation

    def forward(self, x: Tensor) -> Tensor:
        """``(…,C)`` → ``(…,C)``."""
        return self.linear2(self.linear1(x))  # (…,C) -> (…,F) -> (…,C)

    def extra_repr(self) -> str:
        return f"activation={self.activation_name!r} (fused)"


def for_inference(model: nn.Module, precision: str = "fp32", *, device=None,
                  int8_kinds: tuple[str, ...] = INT8_KINDS) -> nn.Module:
    """A copy of ``model`` for inference in ``precision`` (see the module docstring).

    Args:
        model: a qkv model (``Encoder``, ``MaskedLM``, a task model, …) or any module with
            ``nn.Linear`` maps.
        precision: ``"fp32"``, ``"bf16"`` or ``"int8"``.
        device: where it will run (default: where its parameters are); decides what is offered.
        int8_kinds: with ``"int8"``, the kinds of layer map to quantise (a subset of
            :data:`LINEAR_KINDS`).

    Returns:
        The prepared copy, in eval mode, on the same device, for inference only (no gradients).

    Raises:
        QkvError: an unknown precision, one not offered on the device, or bad ``int8_kinds``.
    """
    if inference_precision(model) is not None:
        raise QkvError(f"this model is already prepared for inference ({inference_precision(model)}); "
                       "prepare the original model instead")
    params = next(iter(model.parameters()), None)
    dev = torch.device(device) if device is not None else (params.device if params is not None else torch.device("cpu"))
    check_precision(precision, dev)
    kinds = tuple(int8_kinds)
    bad = [k for k in kinds if k not in LINEAR_KINDS]
    if bad:
        raise QkvError(f"int8_kinds {bad} unknown; allowed: {', '.join(LINEAR_KINDS)}")
    prepared = copy.deepcopy(model).eval().requires_grad_(False)
    quantised = set(kinds) if precision == "int8" else set()
    dtype = _DTYPES[precision]
    _replace(prepared, dtype, quantised)
    prepared._qkv_inference_precision = precision
    return prepared


def _make(linear: nn.Linear, kind: str | None, dtype, quantised: set[str], activation: str | None = None):
    if kind is not None and kind in quantised:
        return Int8Linear(linear, activation)
    return InferenceLinear(linear, dtype, activation)


def _replace(root: nn.Module, dtype, quantised: set[str]) -> None:
    """Swap the linear maps below ``root`` in place (layers' maps by kind, the rest plain)."""
    from qkv.nn.layer import FeedForward

    for parent in list(root.modules()):
        attention_maps = {"qkv_proj": "qkv", "out_proj": "out"} if hasattr(parent, "qkv_proj") else {}
        for name, child in list(parent.named_children()):
            if type(child) is FeedForward and child.activation_name in FUSED_ACTIVATIONS:
                l1, l2 = child.linear1, child.linear2
                setattr(parent, name, InferenceFeedForward(
                    _make(l1, "ffn_in", dtype, quantised, child.activation_name),
                    _make(l2, "ffn_out", dtype, quantised), child.activation_name))
            elif isinstance(child, nn.Linear):
                kind = attention_maps.get(name)
                if kind is None and name in ("linear1", "linear2"):  # a gated (or plugin) feed-forward
                    kind = "ffn_in" if name == "linear1" else "ffn_out"
                setattr(parent, name, _make(child, kind, dtype, quantised))
