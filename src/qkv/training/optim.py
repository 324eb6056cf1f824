"""AdamW with decay / no-decay parameter groups, and warm-up followed by linear or cosine decay."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["SCHEDULES", "param_groups", "build_optimizer", "lr_factor", "build_scheduler"]

SCHEDULES = ("linear", "cosine", "constant")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: matrices decay; biases, LayerNorm weights and 1-D tables do not.

    Embedding tables are 2-D and decay, as in BERT. Tied parameters appear once.
    """
    decay, no_decay, seen = [], [], set()
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` (BERT's ε = 1e-6). ``foreach`` kernels when available."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps)


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the peak learning rate at optimiser step ``step`` (0-based)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int,
                    schedule: str) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following :func:`lr_factor`; its state is the step count (checkpointed)."""
    lr_factor(0, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule)  # validate
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(s, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule),
    )
