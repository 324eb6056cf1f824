"""Training to a wall-clock budget: a clock that counts training time, and a learning-rate
schedule that is a function of the share of the budget spent.

A step-count run knows its length in advance; a time-budgeted run does not — a machine that gets
busier or quieter mid-run changes how many steps fit. So the schedule is tied to elapsed time,
not to a predicted step count (as Geiping & Goldstein's "Cramming" ties its schedule to the
budget): at the start of every optimiser step the loop asks the :class:`BudgetClock` what share
``p`` of the budget has gone, trains that step at ``lr · timed_lr_factor(step, p, …)`` and stops
once ``p ≥ 1``. Whatever the speed, the learning rate reaches zero at the deadline.

The factor is ``min(warm-up(step), decay(p))``: the warm-up counts optimiser steps (the
instability it prevents is a matter of updates, not seconds), the decay counts time —
``1 - p`` (linear), ``(1 + cos πp) / 2`` (cosine) or ``1`` (constant, no decay).

What counts as training time: everything from the first step of the loop to the deadline,
periodic held-out evaluations and checkpoints included; data preparation before the loop and the
final evaluation after it are not. A resumed run continues the clock from the value stored in its
checkpoint (the time between that checkpoint and the interruption is spent again).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from qkv.training.optim import SCHEDULES

__all__ = ["BudgetClock", "TimedScheduler", "timed_lr_factor"]


def timed_lr_factor(step: int, progress: float, *, warmup_steps: int, schedule: str) -> float:
    """Multiplier of the peak learning rate at optimiser step ``step`` (0-based) when a share
    ``progress`` of the time budget is spent: ``min(warm-up, decay)``; exactly 0 at ``progress ≥ 1``.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    p = min(max(float(progress), 0.0), 1.0)
    warm = (step + 1) / warmup_steps if warmup_steps > 0 and step < warmup_steps else 1.0
    if p >= 1.0:
        return 0.0
    if schedule == "linear":
        decay = 1.0 - p
    elif schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * p))
    else:
        decay = 1.0
    return min(warm, decay)


class BudgetClock:
    """Counts training seconds against a budget.

    Args:
        budget_s: the budget in seconds (> 0).
        elapsed_s: seconds already spent (a resumed run passes the value from its checkpoint).
        clock: a monotonic time source in seconds (tests pass a fake one).

    Call :meth:`start` when the loop starts, then :meth:`progress` at the start of each step.
    """

    def __init__(self, budget_s: float, *, elapsed_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        if not (isinstance(budget_s, (int, float)) and math.isfinite(budget_s) and budget_s > 0):
            raise ValueError(f"time budget must be a positive number of seconds, got {budget_s!r}")
        self.budget_s, self._clock = float(budget_s), clock
        self._base, self._t0 = float(elapsed_s), None

    def start(self) -> None:
        self._t0 = self._clock()

    @property
    def elapsed_s(self) -> float:
        """Training seconds spent so far (the base from a checkpoint included)."""
        if self._t0 is None:
            return self._base
        return self._base + (self._clock() - self._t0)

    def progress(self) -> float:
        """Share of the budget spent (may exceed 1 after the deadline)."""
        return self.elapsed_s / self.budget_s


class TimedScheduler:
    """The learning rate of a time-budgeted run (:func:`timed_lr_factor`),
    with the scheduler interface the loop and checkpoints use. Its state: the optimiser steps
    taken and the training seconds spent."""

    def __init__(self, optimizer, clock: BudgetClock, *, warmup_steps: int, schedule: str):
        self.optimizer, self.clock = optimizer, clock
        self.warmup_steps, self.schedule = warmup_steps, schedule
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.steps = 0

    def set_lr(self, progress: float) -> None:
        """Set the learning rate of the next step from the share ``progress`` of the budget spent."""
        f = timed_lr_factor(self.steps, progress, warmup_steps=self.warmup_steps,
                            schedule=self.schedule)
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            g["lr"] = base * f

    def step(self) -> None:
        self.steps += 1

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {"steps": self.steps, "elapsed_s": self.clock.elapsed_s, "base_lrs": self.base_lrs}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self.base_lrs = int(state["steps"]), list(state["base_lrs"])
