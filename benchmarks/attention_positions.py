"""Position-encoding benchmark: attention with relative, T5, ALiBi and rotary positions vs none.

Legend: B batch, N sequence length (T = S = N), H heads, D head dim, C model width (= H·D).

For each N every variant runs forward + backward in this process, interleaved (the order rotates
each repetition) after warm-up, and the median time is reported with its ratio to the no-position
run. Two scopes:

* ``layer`` — ``qkv.nn.build_attention(C, H)`` with the variant's slot (a score-bias module or
  a q/k transform from ``build_positions``), input ``x (B,N,C)`` requiring grad;
* ``core``  — only the position module and :func:`qkv.nn.attend.attend` on ``q, k, v (B,H,N,D)``
  requiring grad: no projections to dilute the ratio.

Variants: ``none`` (SDPA's fused kernel), ``relative`` (max_distance 128), ``t5`` (32 buckets,
max_distance 128), ``alibi``, ``rope``. Learned tables require grad, so their gradient is part of
the backward. Wall time is the measure; CPU time of this process is shown next to it because on a
shared machine it is the steadier of the two.

Peak memory: each (variant, N) runs once more in a fresh subprocess of this script. Inputs and
modules are allocated and a tiny warm-up call initialises the libraries; then the peak-RSS mark is
reset (``/proc/self/clear_refs`` ← 5) and the growth of ``VmHWM`` over the RSS just before the
call is reported. Where ``clear_refs`` is unavailable, ``ru_maxrss`` growth over the RSS after
the inputs are built is used (a lower bound).

Acceptance (issue 3), printed as PASS/FAIL: at N ≥ 2048 every variant's forward+backward time is
≤ 1.5 × the no-position run; at N = 8192 every variant completes forward+backward under 2 GB.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared benchmark helpers
from peak_memory import peak_rss_growth, run_in_subprocess  # noqa: E402

try:
    from qkv.nn.attend import attend
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from qkv.nn.attend import attend
from qkv.models.builders import build_attention  # noqa: E402
from qkv.nn.positional import build_positions
from qkv.nn.similarity import build_similarity

VARIANTS = ("none", "relative", "t5", "alibi", "rope")
SCOPES = ("layer", "core")
FULL_SIZES = (512, 2048, 8192)
QUICK_SIZES = (64, 128)
H, D = 8, 64
MiB, GB = 2**20, 10**9
TIME_RATIO_MAX = 1.5  # acceptance: ≤ 1.5 × the no-position run at N ≥ 2048
MEMORY_MAX = 2 * GB  # acceptance: peak RSS growth at N = 8192


def batch_for(n: int, quick: bool) -> int:
    """B = 8, and 1 at N ≥ 8192 (issue 3); 2 in quick mode."""
    return 2 if quick else (1 if n >= 8192 else 8)


class Case:
    """One variant at one size: its modules, inputs and a fixed output gradient."""

    def __init__(self, variant: str, scope: str, n: int, b: int, seed: int = 0):
        torch.manual_seed(seed)
        c = H * D
        slots = build_positions(variant, d_model=c, n_heads=H, max_len=max(n, 8))
        self.scope, self.n = scope, n
        self.transform, self.score_bias = slots.make_qk_transform(), slots.make_score_bias()
        if scope == "layer":
            self.module = build_attention(c, H, qk_transform=self.transform, score_bias=self.score_bias)
            self.inputs = [torch.randn(b, n, c, requires_grad=True)]
            self.grad_out = torch.randn(b, n, c)
        else:
            self.similarity = build_similarity("scaled_dot", n_heads=H, d_head=D)
            self.inputs = [torch.randn(b, H, n, D, requires_grad=True) for _ in range(3)]
            self.grad_out = torch.randn(b, H, n, D)

    def forward(self) -> torch.Tensor:
        if self.scope == "layer":
            return self.module(self.inputs[0]).output
        q, k, v = self.inputs
        if self.transform is not None:
            q, k = self.transform(q, k)
        bias = self.score_bias(self.n, self.n) if self.score_bias is not None else None
        return attend(q, k, v, similarity=self.similarity, bias=bias).output

    def step(self) -> None:
        """Forward + backward; gradients are dropped afterwards."""
        self.forward().backward(self.grad_out)
        for t in self.params():
            t.grad = None

    def params(self):
        mods = [m for m in (getattr(self, "module", None), self.transform, self.score_bias) if m is not None]
        return self.inputs + [p for m in mods for p in m.parameters()]


def time_size(n: int, b: int, scope: str, variants, reps: int, warmup: int) -> dict:
    """Median wall and CPU seconds of forward+backward per variant, interleaved."""
    cases = {v: Case(v, scope, n, b) for v in variants}
    for case in cases.values():
        for _ in range(warmup):
            case.step()
    wall = {v: [] for v in variants}
    cpu = {v: [] for v in variants}
    for r in range(reps):
        order = list(variants[r % len(variants):]) + list(variants[: r % len(variants)])
        for v in order:
            gc.collect()
            t0, c0 = time.perf_counter(), time.process_time()
            cases[v].step()
            wall[v].append(time.perf_counter() - t0)
            cpu[v].append(time.process_time() - c0)
    return {v: {"wall": statistics.median(wall[v]), "cpu": statistics.median(cpu[v]),
                "wall_all": wall[v], "cpu_all": cpu[v]} for v in variants}


# ----------------------------------------------------------------------------------------------
# Peak memory (each measurement in a fresh subprocess)
# ----------------------------------------------------------------------------------------------
def _memory_child(spec: dict) -> dict:
    small = Case(spec["variant"], spec["scope"], 16, 1)
    small.step()  # initialise libraries and kernels outside the measurement
    case = Case(spec["variant"], spec["scope"], spec["n"], spec["b"])
    del small
    gc.collect()
    peak, method, _ = peak_rss_growth(case.step)
    return {"peak_bytes": peak, "method": method}


def measure_memory(spec: dict, timeout: float | None = None) -> dict:
    """Run ``spec`` in a fresh subprocess of this script and return its result dict."""
    return run_in_subprocess(__file__, "--child", spec, timeout)


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=(
            "Time forward+backward of attention with each position encoding (relative, t5, alibi, "
            "rope) against no positions, interleaved, medians and ratios; measure peak memory per "
            "(variant, N) in fresh subprocesses; print PASS/FAIL for the acceptance checks of issue 3."
        )
    )
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: N in {QUICK_SIZES}, B=2, 2 repetitions, 1 warm-up (about a minute)")
    p.add_argument("--sizes", type=int, nargs="+", default=None,
                   help=f"sequence lengths N (default {FULL_SIZES}; B=8, B=1 at N ≥ 8192)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                   help="variants to run; 'none' (the baseline of the ratios) is always added")
    p.add_argument("--scopes", nargs="+", default=list(SCOPES), choices=SCOPES,
                   help="layer: MultiHeadAttention with projections; core: position module + attend() only")
    p.add_argument("--reps", type=int, default=None,
                   help="timed repetitions per variant (default 5; quick 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls per variant first (default 1)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--memory-scope", choices=SCOPES, default="layer",
                   help="scope of the peak-memory runs (default layer)")
    p.add_argument("--json", type=Path, default=None, help="also write all figures to this JSON file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: one memory measurement
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child is not None:
        print(json.dumps(_memory_child(json.loads(args.child))))
        return 0
    quick = args.quick
    sizes = tuple(args.sizes) if args.sizes else (QUICK_SIZES if quick else FULL_SIZES)
    variants = ["none"] + [v for v in args.variants if v != "none"]
    reps = args.reps or (2 if quick else 5)
    warmup = args.warmup if args.warmup is not None else 1
    model = next((line.split(":", 1)[1].strip() for line in _lscpu() if line.startswith("Model name")), "?")
    info = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{model}, {torch.get_num_threads()} threads, {platform.platform()}",
        "torch": torch.__version__,
        "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
        "H": H, "D": D, "reps": reps, "warmup": warmup,
    }
    print(f"# {info['date']}  {info['machine']}  torch {info['torch']}")
    print(f"# H={H} D={D} C={H * D}; forward+backward; median of {reps} interleaved reps "
          f"after {warmup} warm-up")
    results, checks = {"info": info, "time": {}, "memory": {}}, []
    for scope in args.scopes:
        head = f"{'N':>5} {'B':>2} {'variant':>9} {'wall s':>8} {'ratio':>6} {'cpu s':>8} {'ratio':>6}"
        print(f"\n[{scope}] {head}")
        for n in sizes:
            b = batch_for(n, quick)
            res = time_size(n, b, scope, variants, reps, warmup)
            results["time"][f"{scope}/{n}"] = {"B": b, **res}
            base = res["none"]
            for v in variants:
                rw, rc = res[v]["wall"] / base["wall"], res[v]["cpu"] / base["cpu"]
                wall, cpu = res[v]["wall"], res[v]["cpu"]
                row = f"{n:>5} {b:>2} {v:>9} {wall:>8.3f} {rw:>6.2f} {cpu:>8.3f} {rc:>6.2f}"
                print(f"[{scope}] {row}", flush=True)
                if v != "none" and n >= 2048:
                    checks.append((rw <= TIME_RATIO_MAX,
                                   f"time [{scope}] N={n} {v}: {rw:.2f}x the no-position run "
                                   f"(wall; cpu {rc:.2f}x) <= {TIME_RATIO_MAX}x"))
    if not args.no_memory:
        scope = args.memory_scope
        print(f"\nPeak RSS growth of one forward+backward, MiB [{scope}] (fresh subprocess each)")
        for n in sizes:
            b = batch_for(n, quick)
            for v in variants:
                r = measure_memory({"variant": v, "scope": scope, "n": n, "b": b})
                results["memory"][f"{scope}/{n}/{v}"] = r
                text = r["error"] if "error" in r else f"{r['peak_bytes'] / MiB:9.1f}"
                print(f"  N={n:>5} B={b} {v:>9} {text}", flush=True)
                if n >= 8192:
                    ok = "error" not in r and r["peak_bytes"] < MEMORY_MAX
                    checks.append((ok, f"memory N={n} {v}: {text.strip()} MiB < 2 GB"))
        method = next((r["method"] for r in results["memory"].values() if "method" in r), "?")
        print(f"  ({method})")
    if checks:
        print("\nAcceptance (issue 3)")
        for ok, text in checks:
            print(f"  {'PASS' if ok else 'FAIL'}  {text}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _lscpu() -> list[str]:
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return []


if __name__ == "__main__":
    sys.exit(main())
