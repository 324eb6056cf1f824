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
  quantisation, inputs smoothed with scales from calibration: ``calibration=`` token sequences,
  e.g. :func:`~qkv.inference.calibration.calibration_sequences`, run through the float32 model
  first); the others stay float32 InferenceLinear. CPU only.

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

__all__ = ["PRECISIONS", "INT8_KINDS", "LINEAR_KINDS", "for_inference", "for_inference_calibrated", "check_precision",
           "inference_precision", "InferenceFeedForward"]

PRECISIONS = ("fp32", "bf16", "int8")
#: The kinds of linear map inside a transformer layer.
LINEAR_KINDS = ("qkv", "out", "ffn_in", "ffn_out")
#: The kinds int8 mode quantises, chosen by measurement (all-MiniLM-L6-v2, smoothing α = 0.7, worst
#: cosine to float32 on 26 short texts / 200 20 Newsgroups posts: qkv + out 0.9991 / 0.9993, + ffn_in
#: 0.9986 / 0.9986, + ffn_out 0.991 / 0.989; see docs/inference.md): the second feed-forward map,
#: whose input is the activation (heavy-tailed per token, not per channel), stays float32.
INT8_KINDS = ("qkv", "out", "ffn_in")
#: The smoothing exponent α int8 mode uses (0: no smoothing; measured best of 0.5 and 0.7).
SMOOTHING = 0.7
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
                  int8_kinds: tuple[str, ...] = INT8_KINDS, calibration=None,
                  smoothing: float | None = SMOOTHING) -> nn.Module:
    """A copy of ``model`` for inference in ``precision`` (see the module docstring).

    Args:
        model: a qkv model (``Encoder``, ``MaskedLM``, a task model, …) or any module with
            ``nn.Linear`` maps.
        precision: ``"fp32"``, ``"bf16"`` or ``"int8"``.
        device: where it will run (default: where its parameters are); decides what is offered.
        int8_kinds: with ``"int8"``, the kinds of layer map to quantise (a subset of
            :data:`LINEAR_KINDS`).
        calibration: with ``"int8"``, token id sequences the float32 model runs on to measure each
            quantised map's input (:func:`~qkv.inference.calibration.calibration_sequences` gives
            the standard set for a tokenizer); needs a qkv encoder.
        smoothing: with ``"int8"``, the smoothing exponent α in [0, 1]; ``None`` quantises without
            smoothing and needs no calibration (less accurate, see docs/inference.md).

    Returns:
        The prepared copy, in eval mode, on the same device, for inference only (no gradients).

    Raises:
        QkvError: an unknown precision, one not offered on the device, bad ``int8_kinds``, or int8
            with smoothing but no calibration.
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
    if precision == "int8" and smoothing is not None:
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing <= 1:
            raise QkvError(f"smoothing must be a number in [0, 1] or None, got {smoothing!r}")
        if calibration is None or len(calibration) == 0:
            raise QkvError("int8 with smoothing needs calibration token sequences: pass calibration="
                           "qkv.inference.calibration_sequences(tokenizer, max_len), or smoothing=None "
                           "for plain dynamic quantisation (less accurate)")
    prepared = copy.deepcopy(model).eval().requires_grad_(False)
    dtype = _DTYPES[precision]
    kinds_of = _replace(prepared, dtype)
    if precision == "int8":
        _quantise(prepared, kinds_of, set(kinds), calibration if smoothing is not None else None, smoothing)
    prepared._qkv_inference_precision = precision
    return prepared


def for_inference_calibrated(model: nn.Module, precision: str, tokenizer, max_len: int, *,
                             device=None) -> nn.Module:
    """:func:`for_inference`, int8 calibrated on the standard text
    (:func:`~qkv.inference.calibration.calibration_sequences` of ``tokenizer`` in windows of at most
    ``max_len`` tokens): how the embedder, ``predict`` and ``analyze`` prepare their models."""
    from qkv.inference.calibration import calibration_sequences

    params = next(iter(model.parameters()), None)
    check_precision(precision, device if device is not None else params.device if params is not None else None)
    calibration = calibration_sequences(tokenizer, max_len) if precision == "int8" else None
    return for_inference(model, precision, device=device, calibration=calibration)


def _quantise(prepared: nn.Module, kinds_of: dict, quantised: set[str], calibration, smoothing) -> None:
    """Swap the float32 inference maps of the ``quantised`` kinds for int8 ones (smoothed with scales
    from running ``calibration`` through ``prepared`` first, when given)."""
    from qkv.inference.calibration import input_maxima
    from qkv.inference.int8 import smoothing_scale

    targets = [(parent, name, child) for (parent, name), (child, kind) in kinds_of.items() if kind in quantised]
    scales = [None] * len(targets)
    if calibration is not None and targets:
        encoder = _encoder(prepared)
        maxima = input_maxima(encoder, [child for _, _, child in targets], calibration)
        scales = [smoothing_scale(m, child.weight, float(smoothing)) for m, (_, _, child) in zip(maxima, targets)]
    for (parent, name, child), s in zip(targets, scales):
        setattr(parent, name, Int8Linear(child, child.activation, input_scale=s))


def _encoder(model: nn.Module):
    from qkv.nn.encoder import Encoder

    for candidate in (model, getattr(model, "encoder", None), getattr(model, "decoder", None)):
        if isinstance(candidate, Encoder):
            return candidate
    raise QkvError(f"int8 calibration runs a qkv encoder, and {type(model).__name__} has none; pass "
                   "smoothing=None for plain dynamic quantisation")


def _replace(root: nn.Module, dtype) -> dict:
    """Swap the linear maps below ``root`` in place for :class:`InferenceLinear` in ``dtype``;
    returns ``{(parent, name): (new module, kind)}`` (kind ``None`` outside the layers)."""
    from qkv.nn.layer import FeedForward

    kinds_of: dict = {}
    replaced: set[int] = set()  # feed-forward blocks swapped out: their old maps are not visited
    for parent in list(root.modules()):
        if id(parent) in replaced:
            continue
        attention_maps = {"qkv_proj": "qkv", "out_proj": "out"} if hasattr(parent, "qkv_proj") else {}
        for name, child in list(parent.named_children()):
            if type(child) is FeedForward and child.activation_name in FUSED_ACTIVATIONS:
                ff = InferenceFeedForward(InferenceLinear(child.linear1, dtype, child.activation_name),
                                          InferenceLinear(child.linear2, dtype), child.activation_name)
                setattr(parent, name, ff)
                replaced.add(id(child))
                kinds_of[(ff, "linear1")] = (ff.linear1, "ffn_in")
                kinds_of[(ff, "linear2")] = (ff.linear2, "ffn_out")
            elif isinstance(child, nn.Linear):
                kind = attention_maps.get(name)
                if kind is None and name in ("linear1", "linear2"):  # a gated (or plugin) feed-forward
                    kind = "ffn_in" if name == "linear1" else "ffn_out"
                new = InferenceLinear(child, dtype)
                setattr(parent, name, new)
                kinds_of[(parent, name)] = (new, kind)
    return kinds_of
