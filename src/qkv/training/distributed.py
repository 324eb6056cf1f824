"""Process-group set-up for ``torchrun``: rank, world size, device, and sum-reductions.

Under ``torchrun --nproc_per_node=K`` the environment carries ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK``; we initialise ``torch.distributed`` with gloo on CPU and NCCL on CUDA. A plain
``python`` run is a world of one and never touches ``torch.distributed``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistInfo", "setup", "teardown", "all_sum", "gather_lists", "resolve_device", "refuse_world", "DEVICES",
           "STRATEGIES", "per_process_batch"]

DEVICES = ("auto", "cpu", "cuda")
#: How a run is spread over processes (:mod:`qkv.training.strategy`): ``ddp`` (whole model in every
#: process) or ``fsdp`` (weights, gradients and optimiser state sharded, FSDP2).
STRATEGIES = ("ddp", "fsdp")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: ``rank`` of ``world_size``, its ``device``; rank 0 writes files."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``"auto"`` → CUDA when available else CPU; ``"cuda"`` without a GPU is an error."""
    if name not in DEVICES:
        raise ValueError(f"unknown device {name!r}; allowed: {', '.join(DEVICES)}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for, but torch sees no CUDA device; use cpu or auto")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def setup(device: str = "auto") -> DistInfo:
    """Initialise the process group when launched by torchrun; otherwise a world of one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if world > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank, world, local_rank, dev)


def refuse_world(message: str, error: type[Exception] = ValueError) -> None:
    """Raise ``error(message)`` when launched by torchrun with more than one process (for runs that
    train in one process: ``message`` says why and how to run them)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise error(message)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over all ranks (``t`` itself in a world of one)."""
    if dist.is_available() and dist.is_initialized():
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def gather_lists(items: list) -> list[list]:
    """Every rank's ``items`` (picklable), in rank order, on every rank (``[items]`` in a world of one)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [items]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, items)
    return out


def per_process_batch(batch_size: int, started_world: int, world: int) -> int:
    """The batch per process that keeps a run's global batch when it continues on ``world``
    processes after starting on ``started_world`` with ``batch_size`` per process.

    Raises:
        ValueError: the global batch does not split evenly over ``world`` processes (the message
            names the numbers of processes that keep it).
    """
    total = batch_size * started_world
    if total % world:
        fits = [k for k in range(1, total + 1) if total % k == 0]
        raise ValueError(f"the run's global batch is {total} ({batch_size} per process × {started_world}); it does "
                         f"not split over {world} processes: continue it on {', '.join(map(str, fits))} processes")
    return total // world
