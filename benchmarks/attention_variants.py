"""Attention-variant benchmark: grouped-query (GQA), multi-query (MQA), qk-norm and sliding-window
attention against plain multi-head attention, forward + backward time and peak memory.

Legend: B batch, N sequence length (T = S = N), H heads, G key/value heads, D head dim,
C model width (= H·D), W window.

Variants, each a ``qkv.models.builders.build_attention(C, H, …)`` layer (scaled dot, backend
"auto"), input ``x (B,N,C)`` requiring grad, ``out.sum().backward()``:

* ``plain``   — H key/value heads (SDPA's fused kernel);
* ``gqa``     — G = H/4 key/value heads (``--kv-heads``), SDPA with ``enable_gqa``;
* ``mqa``     — one key/value head;
* ``qk_norm`` — RMSNorm of each head's q and k over D (learned scale);
* ``window``  — a sliding window of W = 128 (``--window``): a dense band in SDPA's mask while the
  scores fit the budget, then the chunked backend over each query block's band (memory linear in N).

Timing: for each N all variants run in this process, interleaved (the order rotates each
repetition) after warm-up; the median is reported with its ratio to ``plain``. Peak memory: each
(variant, N) runs once more in a fresh subprocess (``benchmarks/peak_memory.py``: growth of
``VmHWM`` over the RSS before the call), with its ratio to ``plain`` and, for each N after the
first, the growth factor over the previous N (≈ N's factor when memory is linear in N).

Run it directly or as ``benchmarks/attention.py --variants`` (which passes ``--quick``,
``--sizes``, ``--batch``, ``--heads``, ``--d-head``, ``--reps``, ``--warmup``, ``--json`` on).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared benchmark helpers
from peak_memory import peak_rss_growth, run_in_subprocess  # noqa: E402

try:
    from qkv.models.builders import build_attention
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from qkv.models.builders import build_attention

VARIANTS = ("plain", "gqa", "mqa", "qk_norm", "window")
FULL_SIZES = (512, 1024, 2048, 4096, 8192)
QUICK_SIZES = (32, 64)
MiB = 2**20


def build_variant(name: str, c: int, h: int, *, kv_heads: int, window: int, seed: int = 0):
    """The attention layer of variant ``name`` (one of :data:`VARIANTS`)."""
    torch.manual_seed(seed)
    kw = {"gqa": {"n_kv_heads": kv_heads}, "mqa": {"n_kv_heads": 1}, "qk_norm": {"qk_norm": "rmsnorm"},
          "window": {"window": window}}.get(name, {})
    return build_attention(c, h, **kw)


def fwd_bwd(mod, x: torch.Tensor) -> None:
    for p in mod.parameters():
        p.grad = None
    x.grad = None
    mod(x).output.sum().backward()


def time_size(n: int, b: int, h: int, d: int, reps: int, warmup: int, *, variants=VARIANTS,
              kv_heads: int = 2, window: int = 128) -> dict:
    """Median forward+backward seconds of each variant at N = n, and the ratio to ``plain``."""
    mods = {v: build_variant(v, h * d, h, kv_heads=kv_heads, window=window) for v in variants}
    x = torch.randn(b, n, h * d, requires_grad=True)
    for _ in range(warmup):
        for v in variants:
            fwd_bwd(mods[v], x)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(reps):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for v in order:
            t0 = time.perf_counter()
            fwd_bwd(mods[v], x)
            times[v].append(time.perf_counter() - t0)
    res = {v: {"median_s": statistics.median(ts), "all_s": ts} for v, ts in times.items()}
    if "plain" in res:
        for v in variants:
            res[v]["ratio_plain"] = res[v]["median_s"] / res["plain"]["median_s"]
    return res


def _memory_child(spec: dict) -> dict:
    """Runs in a fresh process: the peak RSS growth of one forward+backward."""
    c = spec["H"] * spec["d_head"]
    mod = build_variant(spec["variant"], c, spec["H"], kv_heads=spec["kv_heads"], window=spec["window"])
    fwd_bwd(mod, torch.randn(1, 8, c, requires_grad=True))  # initialise kernels and thread pools
    x = torch.randn(spec["B"], spec["N"], c, requires_grad=True)
    gc.collect()
    peak, method, _ = peak_rss_growth(lambda: fwd_bwd(mod, x))
    return {**spec, "peak_bytes": peak, "method": method}


def measure_memory(spec: dict, timeout: float | None = None) -> dict:
    r = run_in_subprocess(__file__, "--_memory-child", spec, timeout)
    return {**spec, **r} if "error" in r else r


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Time and measure GQA, MQA, qk-norm and sliding-window attention "
                                            "against plain multi-head attention (forward+backward), with ratios.")
    p.add_argument("--quick", action="store_true", help=f"smoke run: sizes {list(QUICK_SIZES)}, B=1, 1 rep")
    p.add_argument("--sizes", type=int, nargs="+", default=None, help=f"N (default {list(FULL_SIZES)})")
    p.add_argument("--batch", type=int, default=None, help="B (default 4; --quick: 1)")
    p.add_argument("--heads", type=int, default=8, help="H (default 8)")
    p.add_argument("--d-head", type=int, default=64, help="D (default 64)")
    p.add_argument("--kv-heads", type=int, default=None, help="G of the gqa variant (default H/4)")
    p.add_argument("--window", type=int, default=128, help="W of the window variant (default 128)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="variants to run")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions (default 3; --quick: 1)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls per variant (default 1; --quick: 0)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--json", metavar="OUT", default=None, help="write the results to this JSON file")
    p.add_argument("--_memory-child", dest="memory_child", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.memory_child is not None:
        print(json.dumps(_memory_child(json.loads(args.memory_child))))
        return 0
    q = args.quick
    sizes, b = args.sizes or list(QUICK_SIZES if q else FULL_SIZES), args.batch or (1 if q else 4)
    h, d = args.heads, args.d_head
    kv = args.kv_heads or max(1, h // 4)
    reps, warmup = args.reps or (1 if q else 3), args.warmup if args.warmup is not None else (0 if q else 1)
    variants = tuple(["plain"] + [v for v in args.variants if v != "plain"])
    print(f"# attention variants: B={b} H={h} D={d} C={h * d} G={kv} W={args.window}  torch {torch.__version__}")
    print("\nforward+backward: median seconds (ratio to plain)")
    print(f"{'N':>6} | " + " | ".join(f"{v:>16}" for v in variants))
    results: dict = {"config": {"B": b, "H": h, "d_head": d, "kv_heads": kv, "window": args.window}, "timing": [],
                     "memory": []}
    for n in sizes:
        res = time_size(n, b, h, d, reps, warmup, variants=variants, kv_heads=kv, window=args.window)
        results["timing"].append({"N": n, **res})
        print(f"{n:>6} | " + " | ".join(f"{res[v]['median_s']:>8.4f} ({res[v]['ratio_plain']:4.2f})" for v in variants))
    if not args.no_memory:
        print("\nforward+backward peak memory: MiB (ratio to plain; ×growth over the previous N)")
        print(f"{'N':>6} | " + " | ".join(f"{v:>20}" for v in variants))
        prev: dict = {}
        for n in sizes:
            row = {v: measure_memory({"variant": v, "N": n, "B": b, "H": h, "d_head": d, "kv_heads": kv,
                                      "window": args.window}, timeout=1800) for v in variants}
            results["memory"].append({"N": n, **row})
            cells = []
            for v in variants:
                r = row[v]
                if "peak_bytes" not in r:
                    cells.append(f"{'error':>20}")
                    continue
                ratio = r["peak_bytes"] / max(1, row["plain"].get("peak_bytes", 0))
                grow = f"×{r['peak_bytes'] / prev[v]:.1f}" if prev.get(v) else "  —"
                cells.append(f"{r['peak_bytes'] / MiB:>7.0f} ({ratio:4.2f}; {grow:>5})")
                prev[v] = r["peak_bytes"] or None
            print(f"{n:>6} | " + " | ".join(cells))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
