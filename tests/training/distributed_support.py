"""What the multi-process training tests share: tiny ``qkv pretrain`` command lines, ``torchrun`` on
the loopback address with a free port, and reading a run's metrics (a module of its own: every test
folder has a conftest.py, so ``from conftest import`` would pick whichever was imported first)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from qkv._fs import pid_alive

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on the loopback address that nothing listens on now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def env(tmp_path: Path) -> dict:
    """One thread per process (two processes share the two cores), a test-local token cache, no GPU."""
    out = dict(os.environ, QKV_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    out.pop("QKV_FAULT_PAUSE", None)
    return out


def pretrain_args(out: Path, *, steps: int = 5, batch: int = 4, save_every: int = 3, **options) -> list[str]:
    """``qkv pretrain`` of the tiny preset on pydoc's text (``options``: more ``--flag value`` pairs,
    ``strategy="fsdp"`` → ``--strategy fsdp``)."""
    args = ["pretrain", "--corpus", "dataset:pydoc", "--out", str(out), "--preset", "tiny", "--model",
            json.dumps({"max_len": 40, "dropout": 0.0}), "--vocab-size", "300", "--max-len", "24",
            "--batch-size", str(batch), "--warmup-steps", "2", "--eval-every", "4", "--eval-batches", "3",
            "--eval-batch-size", "8", "--save-every", str(save_every), "--log-every", "1", "--steps", str(steps),
            "--no-progress", "--device", "cpu"]
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return args


def qkv(*args: str) -> list[str]:
    """``python -m qkv ARGS`` (one process)."""
    return [sys.executable, "-m", "qkv", *args]


def torchrun(*args: str, nproc: int = 2) -> list[str]:
    """``torchrun --nproc-per-node NPROC`` of ``qkv ARGS`` on one machine, on the loopback address."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr", LOOPBACK,
            "--master-port", str(free_port()), "-m", "qkv", *args]


def node(*args: str, endpoint: str, run_id: str) -> list[str]:
    """One "node" of a multi-node run: ``torchrun --nnodes 2`` with one process, meeting the other
    node through a c10d rendezvous at ``endpoint`` (``127.0.0.1:PORT``)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--local-addr", LOOPBACK,
            "-m", "qkv", *args]


def records(out: Path) -> list[dict]:
    """The records of ``out/metrics.jsonl``."""
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def train_losses(out: Path) -> dict[int, float]:
    """Training loss by step."""
    return {r["step"]: r["loss"] for r in records(out) if "loss" in r}


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (torchrun starts its workers in sessions of their own, so a
    process group does not hold them), read from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_all(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (the agent first, so that it restarts nothing)."""
    below = descendants(pid)
    for p in [pid, *below]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # the ranks are the agent's children: once it is dead nobody may reap them (a zombie is not alive);
    # wait until none runs, so that what they held (a run folder's lock) is stale when the caller goes on
    deadline = time.time() + 60
    while any(pid_alive(p) for p in below):
        assert time.time() < deadline, f"processes {below} still run a minute after SIGKILL"
        time.sleep(0.05)
