"""What the training engine (:mod:`qkv.training.engine`) carries through a run: :class:`RunState`
(the run's fixed parts — its config, model, optimiser, clocks, where records go) and
:class:`Progress` (what changes step by step). Shared by the loop and by
:mod:`qkv.training.step`, which computes one step's gradients."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from qkv.training import distributed as qdist
from qkv.training.budget import BudgetClock
from qkv.training.config import LoopConfig
from qkv.training.lifecycle import RunFolder
from qkv.training.metrics import append_metrics
from qkv.training.progress import TokenRate
from qkv.training.strategy import Strategy

__all__ = ["RunState", "Progress"]


@dataclass
class RunState:
    """A running training run's fixed parts (built once by :func:`~qkv.training.engine.run_training`)."""

    cfg: LoopConfig
    info: qdist.DistInfo
    run: RunFolder | None
    model: torch.nn.Module
    ddp: torch.nn.Module  # what the loss runs through (DistributedDataParallel, or the sharded model)
    strategy: Strategy
    objective: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precision: str
    budget: BudgetClock | None
    clock: BudgetClock  # counts training time (the budget's clock in a time-budgeted run)
    on_backward: Callable | None
    on_log: Callable | None
    divergence: str
    title: str
    history: list[dict]
    writes: bool  # this process writes the run folder

    def record(self, row: dict) -> None:
        """Keep ``row`` in the history and, where this process writes, append it to ``metrics.jsonl``."""
        self.history.append(row)
        if self.writes:
            append_metrics(self.run.out / "metrics.jsonl", row)


@dataclass
class Progress:
    """Where a run is: steps done (from ``start``), the last evaluation and loss, its status."""

    start: int
    done: int
    final_eval: dict | None
    loss: float | None
    status: str = "complete"
    aside_s: float = 0.0  # seconds of evaluations and checkpoints
    rate: TokenRate = field(default_factory=TokenRate)
