"""One optimiser step's gradients — the only module of qkv that calls ``backward``.

:func:`train_step` takes micro-batch(es) from the run's objective, runs the forward pass under the
run's precision, normalises the loss by the unit count over every rank and micro-batch, runs
backward and clips: what the engine's loop (:mod:`qkv.training.engine`) then turns into an update.
Every random draw of a step is seeded from ``(seed, step, micro-batch, rank)`` (:func:`seed_for`),
so a resumed run repeats the uninterrupted one bit for bit. :func:`gradients` is the same backward
pass outside a run (the lab's measurements of gradients).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch

from qkv._faults import fault_point
from qkv.training import distributed as qdist
from qkv.training.objective import move_batch
from qkv.training.precision import autocast
from qkv.training.run_state import RunState
from qkv.training.sharding import local_value

__all__ = ["seed_for", "gradients", "train_step", "throughput_units"]


def seed_for(seed: int, step: int, micro: int, rank: int) -> int:
    """The seed of micro-batch ``micro`` of optimiser step ``step`` on ``rank`` (dropout)."""
    return (seed * 1_000_003 + step * 1009 + micro * 31 + rank * 7919) % (2**63 - 1)


def gradients(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor], *, precision: str = "fp32",
              device: torch.device | str = "cpu") -> float:
    """The loss ``loss_fn()`` at the model's present weights, its gradients left in each
    parameter's ``.grad`` (cleared first) — one backward pass, no optimiser step. The caller reads
    the gradients, then clears them (``model.zero_grad(set_to_none=True)``)."""
    model.zero_grad(set_to_none=True)
    with autocast(precision, device):
        loss = loss_fn()
    loss.float().backward()
    return float(loss.detach())


def train_step(r: RunState, step: int) -> tuple[float, float, float]:
    """One optimiser step up to (not including) the update: ``(loss, grad norm, tokens)``."""
    fault_point("train.step")
    cfg, info = r.cfg, r.info
    if cfg.grad_accum == 1 and not info.distributed:
        loss, micro = _one_batch(r, step)
    else:
        loss, micro = _accumulate(r, step)
    if r.on_backward is not None:
        r.on_backward(step + 1, r.model)
    clip = cfg.clip_norm if cfg.clip_norm is not None else math.inf
    grad_norm = local_value(torch.nn.utils.clip_grad_norm_(r.model.parameters(), clip)).item()
    tokens = sum(throughput_units(r.objective, b) for b in micro)
    if info.distributed:
        tokens = qdist.all_sum(torch.tensor(tokens, dtype=torch.float64)).item()
    return loss, grad_norm, tokens


def throughput_units(objective, batch) -> float:
    """What a batch counts for the logged rate: the objective's ``rate_count`` (e.g. images), else the
    real tokens of its ``attention_mask`` (none: 0)."""
    count = getattr(objective, "rate_count", None)
    if count is not None:
        return float(count(batch))
    mask = getattr(batch, "attention_mask", None)
    return float(mask.sum()) if mask is not None else 0.0


def _units(r: RunState, batch) -> torch.Tensor:
    units = getattr(r.objective, "units", None)
    return units(batch) if units is not None else torch.ones(())


def _one_batch(r: RunState, step: int) -> tuple[float, list]:
    """One micro-batch in one process: what :func:`_accumulate` computes (the scale n / n is 1,
    exactly), without its bookkeeping — a step of a tiny lab model is ~2 ms."""
    b = move_batch(r.objective.batch(step), r.info.device)
    n = float(_units(r, b))
    _seed(seed_for(r.cfg.seed, step, 0, r.info.rank), r.info.device)  # dropout
    with autocast(r.precision, r.info.device):
        loss = r.objective.loss(r.ddp, b)
    (loss.float() if n > 0 else loss.float() * 0.0).backward()
    return float(loss.detach()) * n / max(n, 1.0), [b]


def _accumulate(r: RunState, step: int) -> tuple[float, list]:
    """``grad_accum`` micro-batches on every rank, the loss normalised by the global unit count."""
    cfg, info, obj = r.cfg, r.info, r.objective
    micro = [move_batch(obj.batch(step * cfg.grad_accum + m), info.device) for m in range(cfg.grad_accum)]
    counts = [_units(r, b) for b in micro]
    n_global = qdist.all_sum(torch.stack(counts).sum().double().cpu()).item()
    loss_sum = torch.zeros((), dtype=torch.float64)
    for m, b in enumerate(micro):
        _seed(seed_for(cfg.seed, step, m, info.rank), info.device)  # dropout
        last = m == cfg.grad_accum - 1
        sync = contextlib.nullcontext() if last else r.strategy.no_sync(r.ddp)
        with sync:
            with autocast(r.precision, info.device):
                loss = obj.loss(r.ddp, b)
            n = counts[m].item()
            # DDP averages gradients over ranks: scale so the sum is the global unit mean
            (loss.float() * (n * info.world_size / max(n_global, 1.0))).backward()
        loss_sum += loss.detach().double().cpu() * n
    return (qdist.all_sum(loss_sum) / max(n_global, 1.0)).item(), micro


def _seed(seed: int, device: torch.device) -> None:
    """Seed the generators a step draws from: the CPU's, and the run's GPU (``torch.manual_seed``
    would also queue a seed for every CUDA device, with a stack trace each time — 0.3 ms a step)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)
