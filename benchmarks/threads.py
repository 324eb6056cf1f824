"""Training step time with 1 and with all intra-op threads, on an idle machine and beside one
other CPU-bound process (which this script starts and stops itself).

    python benchmarks/threads.py                 # cpu-small, batch 32 × 128, 25 % masking
    python benchmarks/threads.py --steps 12 --preset cpu-small

Prints the median step time of each (threads, load) pair and the ratios that
``--threads adaptive`` (qkv.training.threads) acts on. Each measurement runs in a fresh
subprocess, since the OpenMP thread pool is set up once per process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

_CHILD = r"""
import json, sys, time, torch
from qkv.config import ModelConfig
from qkv.models.builders import build_masked_lm
from qkv.training.optim import build_optimizer
threads, steps, preset, batch, length, rate = json.loads(sys.argv[1])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = build_masked_lm(ModelConfig.preset(preset, vocab_size=8192)).train()
opt = build_optimizer(model, lr=1e-3, weight_decay=0.01)
ids = torch.randint(5, 8192, (batch, length))
labels = torch.where(torch.rand(batch, length) < rate, ids, torch.full_like(ids, -100))
mask = torch.ones(batch, length, dtype=torch.bool)
times = []
for _ in range(steps + 2):
    t0 = time.perf_counter()
    model(ids, mask, labels=labels).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
print(json.dumps(times[2:]))
"""


def step_times(threads: int, args) -> list[float]:
    spec = json.dumps([threads, args.steps, args.preset, args.batch_size, args.max_len, args.select_rate])
    out = subprocess.run([sys.executable, "-c", _CHILD, spec], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--preset", default="cpu-small")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--select-rate", type=float, default=0.25)
    p.add_argument("--threads", type=int, default=None, help="the 'all threads' count (default: torch's)")
    a = p.parse_args(argv)
    import torch

    most = a.threads or torch.get_num_threads()
    counts = sorted({most, 1}, reverse=True)
    med = {}
    for load in ("idle", "busy"):
        hog = None
        if load == "busy":
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(0.5)
        try:
            for n in counts:
                med[(load, n)] = statistics.median(step_times(n, a))
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    print(f"{a.preset}, batch {a.batch_size} × {a.max_len}, {a.select_rate:.0%} masking, median of {a.steps} steps")
    print("| machine | " + " | ".join(f"{n} thread{'s' if n > 1 else ''}" for n in counts) + " |")
    print("|---|" + "---|" * len(counts))
    for load, label in (("idle", "idle"), ("busy", "one other CPU-bound process")):
        print(f"| {label} | " + " | ".join(f"{med[(load, n)] * 1e3:,.0f} ms" for n in counts) + " |")
    if len(counts) == 2:
        print(f"idle: {most} threads are {med[('idle', 1)] / med[('idle', most)]:.2f}× as fast as 1; "
              f"busy: 1 thread is {med[('busy', most)] / med[('busy', 1)]:.2f}× as fast as {most}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
