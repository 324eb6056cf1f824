"""AdamW with decay / no-decay parameter groups, and warm-up followed by linear or cosine decay."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["SCHEDULES", "ADAMW_IMPLS", "param_groups", "build_optimizer", "lr_factor", "build_scheduler",
           "warmup_warning"]

SCHEDULES = ("linear", "cosine", "constant")


def param_groups(model: nn.Module, weight_decay: float, *, lr: float | None = None,
                 position_lr_scale: float = 1.0) -> list[dict]:
    """AdamW groups: matrices decay; biases, LayerNorm weights and 1-D tables do not.

    Embedding tables are 2-D and decay, as in BERT. Tied parameters appear once. With
    ``position_lr_scale ≠ 1`` the learned position-bias tables (``…score_bias.weight``: relative,
    relative-alibi, t5) form a third group at ``lr · position_lr_scale`` without weight decay.
    """
    if not position_lr_scale > 0:
        raise ValueError(f"position_lr_scale={position_lr_scale!r} must be > 0")
    decay, no_decay, position, seen = [], [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if position_lr_scale != 1.0 and name.endswith("score_bias.weight"):
            position.append(p)
        else:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if position:
        if lr is None:
            raise ValueError("param_groups: a position_lr_scale needs the base lr")
        groups.append({"params": position, "weight_decay": 0.0, "lr": lr * position_lr_scale})
    return groups


#: AdamW implementations: ``fused`` (one kernel per parameter: a single pass over param, grad and
#: both moments), ``foreach`` (multi-tensor kernels, one pass per arithmetic op), ``single`` (the
#: per-parameter Python loop, torch's default on CPU), ``auto`` (``fused`` where torch has it).
ADAMW_IMPLS = ("auto", "fused", "foreach", "single")
_FUSED_DEVICES = ("cpu", "cuda")


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                    impl: str = "auto", position_lr_scale: float = 1.0) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` (BERT's ε = 1e-6).

    ``impl`` picks the implementation (see :data:`ADAMW_IMPLS`); all give the same update up to
    float rounding. ``"auto"`` is ``fused`` when every parameter is a float tensor on CPU or CUDA
    (on CPU torch would otherwise default to the per-parameter loop; for the ``mini`` masked LM
    one step took 9 ms fused against 28 ms foreach or single, and 12.5 ms against 140 ms / 1.8 s
    on a loaded machine with spinning OpenMP threads — docs/benchmarks.md), else torch's default.
    """
    if impl not in ADAMW_IMPLS:
        raise ValueError(f"unknown AdamW implementation {impl!r}; allowed: {', '.join(ADAMW_IMPLS)}")
    groups = param_groups(model, weight_decay, lr=lr, position_lr_scale=position_lr_scale)
    if impl == "auto":
        params = [p for g in groups for p in g["params"]]
        ok = all(p.is_floating_point() and p.device.type in _FUSED_DEVICES for p in params)
        impl = "fused" if ok and params else "default"
    flags = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True},
             "single": {"foreach": False}}[impl]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **flags)


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


def warmup_warning(warmup_steps: int, total_steps: int | None) -> str | None:
    """The warning for a warm-up as long as the run or longer (the learning rate peaks at the last
    step at best and never decays, so runs that differ in ``lr`` or schedule can look alike), else ``None``.
    A time-budgeted run (``total_steps=None``) is not judged: its step count is unknown."""
    if total_steps is None or warmup_steps < total_steps or warmup_steps == 0:
        return None
    peak = min(total_steps, warmup_steps) / warmup_steps
    return (f"--warmup-steps {warmup_steps} ≥ --steps {total_steps}: the whole run is warm-up — the learning "
            f"rate rises to {peak:.0%} of --lr at the last step and never decays; use --warmup-steps "
            f"{max(1, total_steps // 10)} (10 % of the run) or more --steps")
