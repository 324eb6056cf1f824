"""The fused backend: ``torch.nn.functional.scaled_dot_product_attention`` on the similarity's
dot-product form.

Legend: B batch, H heads, T query length, S key length, E value head dim.

Additive score biases go in as the kernel's float ``attn_mask``; on CPU torch runs a flash kernel
here whose memory is linear in T (any dropout drops it to the quadratic math path). It cannot
return weights. Fewer key/value heads than query heads (grouped-query attention) run with the
kernel's ``enable_gqa`` (no copy of k or v; torch < 2.5, which lacks it, gets them expanded); a sliding window goes in as a ``(T,S)`` band in the
boolean mask (quadratic in T: :func:`~qkv.nn.attend.choose_backend` sends long windowed calls to
the chunked backend). A query whose keys are all masked attends everywhere inside the kernel and gets
its output zeroed afterwards, as on every backend.

On CPU, a bf16 call that will be differentiated runs the kernel in float32 and casts the output back
(:func:`_kernel_dtype`): torch's CPU flash-attention backward in bf16 took 3.2× its float32 time
(443 against 138 ms of a MiniLM fine-tuning step, ``benchmarks/profile_step.py``), while the forward
costs the same in both.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from qkv.nn.backends.base import AttendCall, Backend, Features, Supports
from qkv.nn.stages import AttendOutput, bias_rows, block_mask, expand_kv

__all__ = ["SdpaBackend"]

#: torch ≥ 2.5 runs grouped keys/values inside the kernel (``enable_gqa``).
KERNEL_GQA = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def _grouped(kd, v, n_heads: int):
    """``(k, v, kernel kwargs)`` for G key/value heads: the kernel's ``enable_gqa``, or k, v expanded."""
    if kd.shape[1] == n_heads:
        return kd, v, {}
    if KERNEL_GQA:
        return kd, v, {"enable_gqa": True}  # query head i reads k/v head i // (H/G)
    return expand_kv(kd, n_heads), expand_kv(v, n_heads), {}  # (B,G,S,·) -> (B,H,S,·)


def _kernel_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """``(q, k, v, dtype to return, context)``: float32 copies and autocast off for a CPU bf16 call whose
    backward will run (see the module docstring); the inputs unchanged otherwise."""
    if (q.device.type != "cpu" or q.dtype != torch.bfloat16 or not torch.is_grad_enabled()
            or not (q.requires_grad or k.requires_grad or v.requires_grad)):
        return q, k, v, None, contextlib.nullcontext()
    return q.float(), k.float(), v.float(), torch.bfloat16, torch.autocast("cpu", enabled=False)


class SdpaBackend(Backend):
    """torch's fused kernel (see the module docstring)."""

    supports = Supports(weights=False, offset_as_dense=True, window=True, window_as_mask=True, grouped_kv=True,
                        memory="linear")

    def speed(self, f: Features) -> float:
        return 1.0 if f.offset_bias else 0.0  # an offset bias made dense: the offset kernel is faster

    def run(self, call: AttendCall) -> AttendOutput:
        q, k, v, bias, mask = call.q, call.k, call.v, call.bias, call.mask
        qd, kd, scale = call.similarity.as_dot(q, k)  # (B,H,T,D'), (B,H,S,D')
        _, h, t, s = call.shape
        kd, v, gqa = _grouped(kd, v, h)
        qd, kd, v, back, kernel_dtype = _kernel_dtype(qd, kd, v)
        row_ok = None
        with kernel_dtype:  # the kernel called here directly: one frame from the layer (a test counts them)
            if call.causal and mask is None and bias is None and t == s and call.window is None:
                out = F.scaled_dot_product_attention(qd, kd, v, dropout_p=call.dropout_p, is_causal=True, scale=scale,
                                                     **gqa)  # (B,H,T,E)
            else:
                m = block_mask(mask, call.causal, 0, t, t, s, q.device, window=call.window)
                if m is not None:
                    row_ok = m.any(dim=-1, keepdim=True)  # (B?,H?,T?,1)
                    m = m | ~row_ok  # a row with no key attends everywhere; its output is zeroed below
                attn_mask = m
                if bias is not None:
                    b = bias_rows(bias, 0, t).to(qd.dtype)  # (B?,H?,T,S)
                    attn_mask = b if m is None else b.masked_fill(~m, float("-inf"))
                out = F.scaled_dot_product_attention(qd, kd, v, attn_mask=attn_mask, dropout_p=call.dropout_p,
                                                     scale=scale, **gqa)  # (B,H,T,E)
        if back is not None:
            out = out.to(back)
        if row_ok is not None:
            out = out * row_ok  # (B,H,T,E) * (B?,H?,T?,1)
        return AttendOutput(out)
