"""The training loop's settings as the run configurations hold them, written once.

* :func:`check_loop_values`: the one check of the loop's values (steps, batch size, accumulation,
  learning rate, schedule, clipping, weight decay, evaluation and checkpoint intervals, time budget)
  that every run configuration holding them calls — pretraining, fine-tuning, image and captioning
  runs. The settings a run shares with the engine's process (precision, device, threads, batch
  tokens) are checked by ``RunConfig.check_loop_fields`` in :mod:`qkv.training.config`.
* :class:`RecipeLoopFields`: the fields themselves for the runs whose unset (``None``) settings come
  from a recipe (image classification, captioning), with :meth:`~RecipeLoopFields.recipe_changes`.

The text runs (:class:`qkv.training.config.TrainConfig`, ``qkv.finetune.FinetuneConfig``) declare
their own fields: their defaults differ (a text run has no recipe) and their ``run.json`` keeps its
order of keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qkv.training.optim import SCHEDULES
from qkv.validation import check_choice, check_int, check_positive, check_range

__all__ = ["RecipeLoopFields", "check_loop_values", "RECIPE_LOOP_SETTINGS"]

#: The loop settings counted in steps or examples: ints ≥ 1 where set.
_COUNTS = ("steps", "batch_size", "grad_accum", "eval_every", "save_every", "log_every")
#: The loop settings a recipe fills in when a run leaves them unset (and ``steps``/``time_budget``).
RECIPE_LOOP_SETTINGS = ("batch_size", "lr", "weight_decay", "warmup_steps", "schedule")


def check_loop_values(cfg: Any, *, minutes: str = " of minutes (e.g. 10)") -> None:
    """``ValueError`` naming the field and what it must be, for a bad value of ``cfg``'s loop settings:
    ``steps``, ``batch_size``, ``grad_accum``, ``eval_every``, ``save_every``, ``log_every`` (ints
    ≥ 1), ``warmup_steps`` (≥ 0), ``schedule``, ``lr`` and ``clip_norm`` (> 0), ``weight_decay``
    (≥ 0), ``time_budget`` (minutes > 0; ``minutes`` ends its message). An unset (``None``) value
    passes: ``check_field_types`` has said which fields may be unset."""
    for name in _COUNTS:
        check_int(name, getattr(cfg, name), low=1, optional=True)
    check_int("warmup_steps", cfg.warmup_steps, low=0, optional=True)
    check_choice("schedule", cfg.schedule, SCHEDULES, optional=True)
    for name in ("lr", "clip_norm"):
        check_range(name, getattr(cfg, name), 0, bounds="(", optional=True)
    check_range("weight_decay", cfg.weight_decay, 0, optional=True)
    check_positive("time_budget", cfg.time_budget, unit=minutes, optional=True)


@dataclass(frozen=True, kw_only=True)
class RecipeLoopFields:
    """The training loop's fields of a run whose recipe fills in what is unset (``None``).

    Keyword-only, so that a subclass's own fields (``out`` first) keep their places in its
    constructor. The subclass validates them with :func:`check_loop_values` and
    ``RunConfig.check_loop_fields``.

    Attributes:
        steps, time_budget: optimiser steps or minutes; neither set: the recipe's.
        batch_size, lr, weight_decay, warmup_steps, schedule: ``None``: the recipe's.
        grad_accum: micro-batches per optimiser step. clip_norm: gradient-norm clip.
        eval_every, save_every: steps between held-out evaluations / checkpoints (``None``: at the end).
        seed, device, precision, threads, progress, log_every: as every training run's
            (:class:`~qkv.training.config.LoopConfig`).
    """

    steps: int | None = None
    time_budget: float | None = None
    batch_size: int | None = None
    grad_accum: int = 1
    lr: float | None = None
    weight_decay: float | None = None
    warmup_steps: int | None = None
    schedule: str | None = None
    clip_norm: float = 1.0
    eval_every: int | None = None
    save_every: int | None = None
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    threads: int | str | None = None
    progress: bool = True
    log_every: int = 20

    def recipe_changes(self, recipe: dict[str, Any], names: tuple[str, ...] = ()) -> dict[str, Any]:
        """The recipe's values of ``names`` and of :data:`RECIPE_LOOP_SETTINGS` that are unset here, and
        its ``steps``/``time_budget`` when neither is set."""
        changes = {k: recipe[k] for k in (*names, *RECIPE_LOOP_SETTINGS) if getattr(self, k) is None}
        if self.steps is None and self.time_budget is None:
            changes.update({k: recipe[k] for k in ("steps", "time_budget") if k in recipe})
        return changes
