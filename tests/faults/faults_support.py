"""Helpers of the fault-injection suite: tiny runs in real processes, kills, corruptions.

To add a fault: a corruption is a function ``f(path)`` (see :data:`CORRUPTIONS`); a kill point is a
name of :data:`qkv._faults.POINTS` (add a ``fault_point("…")`` call where the crash matters); a
CLI error case is a row of ``test_faults_cli.py``'s table.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

STEPS = 12
#: Subcommands whose results go to standard output or a network socket: they write no file that a full
#: disk could cut short or that could overwrite one of the user's.
WRITES_NOTHING = {
    "search": "prints results",
    "generate": "prints text",
    "caption": "prints captions",
    "fill-mask": "prints predictions",
    "serve": "answers requests",
}
TINY_ARGS = ["--corpus", "dataset:pydoc", "--preset", "tiny", "--model", json.dumps({"max_len": 40, "dropout": 0.0}),
             "--vocab-size", "300", "--max-len", "24", "--batch-size", "4", "--warmup-steps", "2",
             "--eval-every", "4", "--eval-batches", "2", "--eval-batch-size", "8", "--save-every", "3",
             "--log-every", "1", "--no-progress"]


def env(tmp: Path, **extra: str) -> dict:
    """The environment of a qkv subprocess: its own token cache, one thread, no GPU."""
    e = {**os.environ, "QKV_CACHE_DIR": str(tmp / "cache"), "OMP_NUM_THREADS": "1", **extra}
    e.pop("CUDA_VISIBLE_DEVICES", None)
    e.pop("QKV_DEBUG", None)
    return e


def pretrain_cmd(out: Path, steps: int = STEPS, *extra: str) -> list[str]:
    return [sys.executable, "-m", "qkv", "pretrain", "--out", str(out), "--steps", str(steps), *TINY_ARGS, *extra]


def resume_cmd(out: Path) -> list[str]:
    return [sys.executable, "-m", "qkv", "pretrain", "--out", str(out), "--resume", "--no-progress"]


def run(cmd: list[str], e: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)


def logged_step(out: Path) -> int:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return max((json.loads(x)["step"] for x in lines if x.endswith("}")), default=0)
    except (FileNotFoundError, ValueError):
        return 0


def kill_when(proc: subprocess.Popen, ready, timeout: float = 180) -> bool:
    """SIGKILL ``proc`` as soon as ``ready()`` holds; False if it ended first."""
    deadline = time.time() + timeout
    while not ready():
        if proc.poll() is not None:
            return False
        assert time.time() < deadline, "the process never reached the kill point"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


def kill_at_point(cmd: list[str], e: dict, point: str, mark: Path, pause: float = 3.0) -> bool:
    """Run ``cmd`` with fault point ``point`` armed and SIGKILL it while it pauses there."""
    mark.unlink(missing_ok=True)
    proc = subprocess.Popen(cmd, env={**e, "QKV_FAULT_PAUSE": f"{point}:{pause}", "QKV_FAULT_MARK": str(mark)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return kill_when(proc, mark.exists)


def kill_after(cmd: list[str], e: dict, seconds: float) -> bool:
    """Run ``cmd`` and SIGKILL it after ``seconds`` (False if it ended first)."""
    proc = subprocess.Popen(cmd, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    return kill_when(proc, lambda: time.time() - t0 >= seconds, timeout=seconds + 300)


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def run_json(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


# ---------------------------------------------------------------------------------------- corruptions


def truncate_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def truncate_empty(path: Path) -> None:
    path.write_bytes(b"")


def flip_middle(path: Path) -> None:
    """Same size, one byte changed in the middle: only a checksum can tell."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def garbage_json(path: Path) -> None:
    path.write_text("{not json", encoding="utf-8")


def delete(path: Path) -> None:
    path.unlink()


CORRUPTIONS = {"truncated": truncate_half, "empty": truncate_empty, "flipped byte": flip_middle,
               "deleted": delete}


def seeded(seed: int) -> random.Random:
    return random.Random(seed)
