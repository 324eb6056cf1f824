"""Inference: a model built to run fast in float32, bfloat16 or int8 (:func:`for_inference`).

``for_inference(model, "bf16")`` returns a new model of the same kind (the original is left as it
is), built by the same builders from the same config with inference linear maps
(:class:`~qkv.nn.maps.LinearMaps`), filled with the model's weights, in eval mode, without
gradients — an ordinary qkv model to every API (``qkv.embed``, ``qkv.save``, the analysis tools):

* ``"fp32"``: every linear map an :class:`~qkv.nn.linear.InferenceLinear` in float32 (oneDNN on
  CPU, the activation of a feed-forward block fused into its first map): the same function up to
  float rounding.
* ``"bf16"``: the same in bfloat16 (weights stored in bfloat16, float32 accumulation); embeddings,
  norms, softmax statistics and the residual stream stay float32. Offered where the CPU has
  bfloat16 instructions (AVX-512 BF16 or AMX) or on a GPU with bf16.
* ``"int8"``: the maps of the kinds in :data:`~qkv.nn.maps.INT8_KINDS` are
  :class:`~qkv.nn.linear.Int8Linear` (int8 weights with per-channel scales, dynamic input
  quantisation, inputs smoothed with scales from calibration: ``calibration=`` token sequences,
  e.g. :func:`~qkv.inference.calibration.calibration_sequences`, run through the float32 model
  first); the others float32 InferenceLinear. CPU only.

The kinds of linear map in a layer: ``"qkv"`` (the attention's query/key/value maps), ``"out"``
(its output map), ``"ffn_in"`` and ``"ffn_out"`` (the feed-forward block's first and second maps).
Maps outside the layers (pooler, task heads, ELECTRA's embedding projection) stay float32 in int8
mode. The output map of a head tied to the token embeddings (a masked LM's, a causal LM's: ``h · Eᵀ``
over the whole vocabulary, the largest single product of a decode step) gets its own copy of E in
bf16 (bfloat16) and in int8 (int8 with one scale per row, unsmoothed), made from the table as the
state loads; the embedding lookup keeps the float32 table (:meth:`qkv.nn.maps.LinearMaps.vocab_proj`). :func:`inference_precision` reads a model's precision off its maps.

Raises :class:`~qkv.errors.QkvError` for a precision that is unknown or not offered on the device
(:func:`check_precision`: one line saying why).
"""

from __future__ import annotations

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.hardware import precision_unsupported
from qkv.inference.calibration import calibration_sequences, input_maxima
from qkv.models.kinds import build_kind, encoder_of, model_kind
from qkv.nn.linear import InferenceLinear, Int8Linear, smoothing_scale
from qkv.nn.maps import INT8_KINDS, LINEAR_KINDS, PRECISIONS, VOCAB_PROJ, LinearMaps
from qkv.validation import check_choice

__all__ = ["SMOOTHING", "for_inference", "for_inference_calibrated", "check_precision", "inference_precision"]

#: The smoothing exponent α int8 mode uses (0: no smoothing; measured best of 0.5 and 0.7).
SMOOTHING = 0.7


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
    """The precision ``model``'s linear maps run in (``"int8"`` when any is an int8 map, else
    ``"bf16"`` / ``"fp32"`` of its inference maps), or ``None`` for a trainable model."""
    precision = None
    for module in model.modules():
        if isinstance(module, Int8Linear):
            return "int8"
        if isinstance(module, InferenceLinear):
            precision = "bf16" if module.dtype == torch.bfloat16 else precision or "fp32"
    return precision


def _device_of(model: nn.Module, device) -> torch.device:
    if device is not None:
        return torch.device(device)
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def for_inference(model: nn.Module, precision: str = "fp32", *, device=None,
                  int8_kinds: tuple[str, ...] = INT8_KINDS, calibration=None,
                  smoothing: float | None = SMOOTHING) -> nn.Module:
    """``model`` built again for inference in ``precision`` (see the module docstring).

    Args:
        model: a qkv model (``Encoder``, ``MaskedLM``, a task model, ``CausalLM``, …; what
            :func:`qkv.load` or the builders give).
        precision: ``"fp32"``, ``"bf16"`` or ``"int8"``.
        device: where it will run (default: where its parameters are); decides what is offered.
        int8_kinds: with ``"int8"``, the kinds of layer map to quantise (a subset of
            :data:`~qkv.nn.maps.LINEAR_KINDS`).
        calibration: with ``"int8"``, token id sequences the float32 model runs on to measure each
            quantised map's input (:func:`~qkv.inference.calibration.calibration_sequences` gives
            the standard set for a tokenizer).
        smoothing: with ``"int8"``, the smoothing exponent α in [0, 1]; ``None`` quantises without
            smoothing and needs no calibration (less accurate, see docs/inference.md).

    Returns:
        The new model, in eval mode, on the same device, for inference only (no gradients).

    Raises:
        QkvError: an unknown precision, one not offered on the device, bad ``int8_kinds``, a model
            already prepared, one that is not a qkv model, or int8 with smoothing but no calibration.
    """
    if inference_precision(model) is not None:
        raise QkvError(f"this model is already prepared for inference ({inference_precision(model)}); "
                       "prepare the original model instead")
    dev = _device_of(model, device)
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
                           "qkv.inference.calibration.calibration_sequences(tokenizer, max_len), or "
                           "smoothing=None for plain dynamic quantisation (less accurate)")
    try:
        config, kind, task = model_kind(model)
    except ValueError as e:
        raise QkvError(f"for_inference prepares qkv models: {e}") from None
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if precision == "int8" and smoothing is not None:
        state.update(_input_scales(model, state, kinds, calibration, float(smoothing), dev))
    causal = bool(getattr(model, "causal", False)) and kind == "encoder"  # a decoder's stack
    maps = LinearMaps(precision, int8_kinds=kinds)
    prepared = build_kind(config, kind, task, maps=maps, causal=causal).to(dev)
    prepared.load_state_dict(state)
    return prepared.eval().requires_grad_(False)


def _input_scales(model: nn.Module, state: dict, kinds, calibration, alpha: float, device) -> dict:
    """``{"<map>.input_scale": s}`` for each map of the quantised kinds: the smoothing scale from the
    largest inputs the float32 inference model sees on ``calibration``."""
    config, kind, task = model_kind(model)
    causal = bool(getattr(model, "causal", False)) and kind == "encoder"
    fp32 = build_kind(config, kind, task, maps=LinearMaps("fp32"), causal=causal).to(device)
    fp32.load_state_dict(state)
    fp32.eval().requires_grad_(False)
    probe = build_kind(config, kind, task, maps=LinearMaps("int8", int8_kinds=kinds), causal=causal)
    # a tied head's vocab_proj is filled from the token table and not smoothed: the calibration runs
    # the encoder only, and never reaches the head
    names = [name for name, m in probe.named_modules()
             if isinstance(m, Int8Linear) and name.rpartition(".")[2] != VOCAB_PROJ]
    if not names:
        return {}
    try:
        encoder = encoder_of(fp32)
    except ValueError:
        raise QkvError(f"int8 calibration runs a qkv encoder, and {type(fp32).__name__} has none; pass "
                       "smoothing=None for plain dynamic quantisation") from None
    modules = dict(fp32.named_modules())
    targets = [modules[name] for name in names]
    maxima = input_maxima(encoder, targets, calibration)
    return {f"{name}.input_scale": smoothing_scale(m, state[f"{name}.weight"], alpha)
            for name, m in zip(names, maxima)}


def for_inference_calibrated(model: nn.Module, precision: str, tokenizer, max_len: int, *,
                             device=None) -> nn.Module:
    """:func:`for_inference`, int8 calibrated on the standard text
    (:func:`~qkv.inference.calibration.calibration_sequences` of ``tokenizer`` in windows of at most
    ``max_len`` tokens): how the embedder, ``predict`` and ``analyze`` prepare their models."""
    check_precision(precision, _device_of(model, device))
    calibration = calibration_sequences(tokenizer, max_len) if precision == "int8" else None
    return for_inference(model, precision, device=device, calibration=calibration)
