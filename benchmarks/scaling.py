"""Scaling from one process to two: tokens per second of ``qkv pretrain`` with the same global batch.

    python benchmarks/scaling.py                  # cpu-small on pydoc, 30 steps per arm
    python benchmarks/scaling.py --preset mini --steps 20

Arms, run one after the other, each a real ``qkv pretrain`` (the machine's cores shared out so that
every arm uses all of them):

* 1 process, all threads, batch 2B;
* 1 process, 1 thread, batch 2B (what one of two processes has);
* 2 processes (``torchrun --nproc-per-node 2``, gloo on 127.0.0.1), 1 thread each, batch B each:
  ``--strategy ddp`` and ``--strategy fsdp``;
* 2 "nodes" on the loopback (``torchrun --nnodes 2`` twice, a c10d rendezvous), 1 thread each, fsdp.

Reported: the median of the logged global tokens per second over the steps after the fifth, its
ratio to the first arm, and the last training loss (the arms train on the same global batches, so
the losses agree to float rounding), with the 1-minute load average at the arm's end. The arms run
with ``OMP_WAIT_POLICY=PASSIVE`` unless it is set (on a shared machine the default spinning policy
stalls a multi-threaded process whenever a spinning worker is descheduled: see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(out: Path, a, batch: int, strategy: str) -> list[str]:
    return ["pretrain", "--corpus", a.corpus, "--out", str(out), "--preset", a.preset, "--vocab-size", "4000",
            "--max-len", str(a.max_len), "--batch-size", str(batch), "--steps", str(a.steps), "--warmup-steps", "5",
            "--eval-every", str(a.steps), "--eval-batches", "2", "--save-every", str(a.steps), "--log-every", "1",
            "--no-progress", "--device", "cpu", "--strategy", strategy] + (["--model", a.model] if a.model else [])


def _rates(out: Path) -> tuple[float, float]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "tokens_per_s" in r]
    return statistics.median(r["tokens_per_s"] for r in train if r["step"] > 5), train[-1]["loss"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu-small")
    p.add_argument("--corpus", default="dataset:pydoc")
    p.add_argument("--batch", type=int, default=8, help="blocks per process of the two-process arms (B)")
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--model", default=None, help="model settings as JSON, passed to qkv pretrain --model (e.g. "
                   "'{\"dropout\": 0.0}' for a preset with dropout: the arms' losses agree only without it)")
    a = p.parse_args(argv)
    cores = os.cpu_count() or 1
    load0 = os.getloadavg()[0]
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = dict(os.environ, QKV_CACHE_DIR=str(tmp / "cache"), CUDA_VISIBLE_DEVICES="")
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        one = ["--nproc-per-node", "1"]
        arms = [
            (f"1 process, {cores} threads", [[py, "-m", "qkv", *_args(tmp / "a", a, 2 * a.batch, "ddp")]], cores, "a"),
            ("1 process, 1 thread", [[py, "-m", "qkv", *_args(tmp / "b", a, 2 * a.batch, "ddp")]], 1, "b"),
            ("2 processes (ddp), 1 thread each", [[py, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                                  "--master-addr", "127.0.0.1", "--master-port", str(_port()), "-m",
                                                  "qkv", *_args(tmp / "c", a, a.batch, "ddp")]], 1, "c"),
            ("2 processes (fsdp), 1 thread each", [[py, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                                   "--master-addr", "127.0.0.1", "--master-port", str(_port()), "-m",
                                                   "qkv", *_args(tmp / "d", a, a.batch, "fsdp")]], 1, "d"),
        ]
        endpoint = f"127.0.0.1:{_port()}"
        node = [py, "-m", "torch.distributed.run", "--nnodes", "2", *one, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                endpoint, "--rdzv-id", "scaling", "--local-addr", "127.0.0.1", "-m", "qkv",
                *_args(tmp / "e", a, a.batch, "fsdp")]
        arms.append(("2 nodes on the loopback (fsdp), 1 thread each", [node, node], 1, "e"))
        results = []
        for name, cmds, threads, folder in arms:
            t0 = time.perf_counter()
            procs = [subprocess.Popen(c, env=dict(env, OMP_NUM_THREADS=str(threads)), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True) for c in cmds]
            for pr in procs:
                _, err = pr.communicate()
                if pr.returncode:
                    print(f"{name}: failed\n{err[-3000:]}", file=sys.stderr)
                    return 1
            rate, loss = _rates(tmp / folder)
            results.append((name, rate, loss, os.getloadavg()[0]))
            print(f"{name}: {rate:,.0f} tokens/s, last loss {loss:.5f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    base = results[0][1]
    print(f"\n{a.preset}, global batch {2 * a.batch} × {a.max_len} tokens, {a.steps} steps, {cores} cores, "
          f"{time.strftime('%Y-%m-%d')}; OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}; load average (1 min) {load0:.2f} "
          "before")
    print("\n| arm | tokens/s | vs first | last loss | load average after |")
    print("|---|---:|---:|---:|---:|")
    for name, rate, loss, load in results:
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f}× | {loss:.5f} | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
