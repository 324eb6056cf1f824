"""Training precision: float32, or bfloat16 mixed precision with float32 master weights.

``bf16`` runs the forward pass under :func:`torch.autocast` (matrix products and attention in
bfloat16, reductions, norms, softmax and the loss in float32); the weights, their gradients and
the AdamW moments stay float32, so the update is the float32 update of a bf16-computed gradient
and no loss scaling is needed (bfloat16 has float32's exponent range).

It pays only where the processor computes bfloat16 natively: on x86, AVX512-BF16 or AMX-BF16
(Intel Cooper Lake / Sapphire Rapids and later, AMD Zen 4 and later); on CUDA, compute
capability 8.0 and up. Elsewhere torch emulates it, which is slower than float32, so ``bf16``
falls back to float32 with a message there, and ``auto`` picks bf16 only where it is native.
"""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path

import torch

from qkv.validation import check_choice

__all__ = ["PRECISIONS", "bf16_support", "resolve_precision", "autocast"]

PRECISIONS = ("auto", "fp32", "bf16")
_NATIVE_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def bf16_support(device: torch.device | str = "cpu") -> tuple[bool, str]:
    """Whether ``device`` computes bfloat16 natively, and a sentence saying why (not)."""
    device = torch.device(device)
    if device.type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, "CUDA device with bf16 support" if ok else "this CUDA device has no bf16 support"
    flags = _cpu_flags()
    native = [f for f in _NATIVE_FLAGS if f in flags]
    if native:
        return True, f"CPU has {' and '.join(f.upper() for f in native)}"
    if not flags:
        return False, f"cannot read the CPU flags on {platform.system() or 'this system'}"
    best = "AVX512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return False, f"CPU has {best} but neither AVX512-BF16 nor AMX-BF16 (bf16 would be emulated, slower)"


def resolve_precision(requested: str, device: torch.device | str = "cpu") -> tuple[str, str | None]:
    """The precision a run uses, and a message when it differs from the request.

    ``fp32`` → fp32. ``bf16`` → bf16 where native, else fp32 with a message. ``auto`` → bf16 where
    native, else fp32 (no message: that is what auto means).
    """
    check_choice("precision", requested, PRECISIONS)
    if requested == "fp32":
        return "fp32", None
    ok, why = bf16_support(device)
    if ok:
        return "bf16", None
    if requested == "bf16":
        return "fp32", f"bf16 requested, but {why}; training in fp32"
    return "fp32", None


def autocast(precision: str, device: torch.device | str = "cpu"):
    """The context a forward pass runs in: bf16 autocast, or nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    if precision != "fp32":
        raise ValueError(f"precision={precision!r}: expected a resolved precision, fp32 or bf16")
    return contextlib.nullcontext()
