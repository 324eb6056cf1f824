"""What this machine can run fast: the CPU's instruction sets and the precisions they make worth it.

Read at run time (the same code runs on CPUs with and without AVX-512, BF16 or VNNI), from PyTorch's
own CPU probes, so that a mode is offered only where it is native:

* ``bf16`` on a CPU needs bfloat16 dot-product instructions (AVX-512 BF16 or AMX-BF16); without them
  PyTorch emulates bfloat16 and it is slower than float32. On CUDA it needs a GPU that has bf16.
* ``int8`` (dynamic quantisation) needs PyTorch's x86 / fbgemm quantised engine (AVX2 or AVX-512;
  VNNI makes it faster) and runs on the CPU only.
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = ["cpu_features", "onednn_linear_available", "precision_unsupported", "threads_per_job"]


@functools.cache
def cpu_features() -> dict[str, bool]:
    """``{"avx2", "avx512", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16"}`` → whether this CPU has it.

    The flags of ``/proc/cpuinfo`` where there is one (Linux); elsewhere only what PyTorch's own
    dispatch level tells (AVX2 / AVX-512), so the bf16 and VNNI flags read False there.
    """
    flags = _cpuinfo_flags()
    level = torch.backends.cpu.get_cpu_capability()  # "DEFAULT", "AVX2", "AVX512", …
    return {
        "avx2": "avx2" in flags or level in ("AVX2", "AVX512"),
        "avx512": "avx512f" in flags or level == "AVX512",
        "avx512_bf16": "avx512_bf16" in flags,
        "avx512_vnni": "avx512_vnni" in flags,
        "avx_vnni": "avx_vnni" in flags,
        "amx_bf16": "amx_bf16" in flags,
    }


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


@functools.cache
def onednn_linear_available() -> bool:
    """Whether PyTorch's oneDNN linear kernel (``torch.ops.mkldnn._linear_pointwise``) can run here.

    oneDNN picks its kernels by the CPU's instruction sets (AVX-512 where present), where the default
    float32 GEMM may not; it also fuses the activation into the GEMM.
    """
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        x, w = torch.ones(2, 3), torch.ones(4, 3)
        out = torch.ops.mkldnn._linear_pointwise(x, w, torch.zeros(4), "none", [], "")
        return bool(torch.allclose(out, torch.full((2, 4), 3.0)))
    except (RuntimeError, NotImplementedError):  # pragma: no cover - a build without the kernel
        return False


def precision_unsupported(precision: str, device: torch.device) -> str | None:
    """Why ``precision`` is not offered on ``device`` (one sentence), or ``None`` when it is."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        if device.type == "cuda":
            return None if torch.cuda.is_bf16_supported() else "this GPU has no bfloat16 support"
        if device.type != "cpu":
            return f"bf16 inference is offered on cpu and cuda, not {device.type}"
        f = cpu_features()
        if not (f["avx512_bf16"] or f["amx_bf16"]):
            return ("this CPU has no bfloat16 instructions (AVX-512 BF16 or AMX): PyTorch would emulate "
                    "bfloat16, slower than float32")
        if not onednn_linear_available():
            return "this PyTorch build has no oneDNN linear kernel for bfloat16"
        return None
    if precision == "int8":
        if device.type != "cpu":
            return f"int8 dynamic quantisation runs on the CPU only, not {device.type}"
        engines = torch.backends.quantized.supported_engines
        if not any(e in engines for e in ("x86", "fbgemm")):
            return f"this PyTorch build has no x86/fbgemm quantised engine (it has {', '.join(engines)})"
        if not cpu_features()["avx2"]:
            return "this CPU has no AVX2, which PyTorch's int8 kernels need"
        return None
    raise ValueError(f"unknown precision {precision!r}")


def threads_per_job(jobs: int) -> int:
    """Torch threads for each of ``jobs`` concurrent runs: the cores this process may use, divided
    among the jobs, and never more than ``OMP_NUM_THREADS`` when the user set it (a limit the user
    set for every process is kept, not multiplied)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    threads = max(1, cores // max(1, jobs))
    limit = os.environ.get("OMP_NUM_THREADS", "").strip()
    if limit.isdigit() and int(limit) > 0:
        threads = min(threads, int(limit))
    return threads
