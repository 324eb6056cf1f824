"""The configuration of a lab encoder run (:func:`qkv.lab.encoder_run.train_on_task`): the task, the
model sized for it, the recipe."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from qkv.config import ModelConfig
from qkv.lab.streams import PAD
from qkv.lab.synthetic import SYNTHETIC_TASKS, get_synthetic_task
from qkv.training.config import RunConfig
from qkv.training.optim import SCHEDULES
from qkv.training.precision import PRECISIONS
from qkv.validation import check_choice, check_int, check_positive, check_range, check_run_length

__all__ = ["EncoderTaskConfig", "EVAL_SEED", "MODEL_DEFAULTS"]

#: The held-out stream: a seed no training run may use.
EVAL_SEED = 2**31 - 1

#: The model unless ``EncoderTaskConfig.model`` says otherwise (vocab_size and max_len come from the task).
MODEL_DEFAULTS: dict[str, Any] = dict(d_model=64, n_heads=4, d_ff=256, n_layers=2, norm="pre", dropout=0.0,
                                      position="learned", type_vocab_size=0, pad_token_id=PAD,
                                      layer_norm_eps=1e-5)


@dataclass(frozen=True)
class EncoderTaskConfig(RunConfig):
    """One run.

    Attributes:
        task: a name in :data:`qkv.lab.synthetic.SYNTHETIC_TASKS`.
        task_options: the task's options (e.g. ``{"shift": 2}`` for ``copy_offset``).
        model: :class:`~qkv.config.ModelConfig` field overrides over :data:`MODEL_DEFAULTS`, or a
            whole ``ModelConfig`` (its ``vocab_size`` must be the task's, its ``max_len`` long
            enough). ``vocab_size`` is always the task's; ``max_len`` defaults to the longest row.
        steps: optimiser steps. batch_size: training rows per step.
        lr: peak learning rate. warmup_steps: linear warm-up. schedule: ``"linear"``,
            ``"cosine"`` or ``"constant"`` after the warm-up. weight_decay: AdamW's (matrices only).
        clip_norm: gradient-norm clip, or ``None`` for none.
        seed: initialisation and the training stream (≠ :data:`EVAL_SEED`).
        eval_lengths: extra evaluation lengths for the length tasks (``copy``, ``reverse``,
            ``copy_offset``: a source of exactly that many symbols), e.g. ``(64, 128)``.
        eval_batches: held-out batches per evaluation (of ``eval_batch_size`` rows, default
            ``batch_size``).
        log_every: the loss curve keeps the loss of every ``log_every``-th step (and the last).
        time_budget: train for this many minutes instead of ``steps`` (the learning rate reaches
            zero at the deadline; :mod:`qkv.training.budget`). ``None``: a step-count run.
        precision: ``fp32``, ``bf16`` (mixed precision; fp32 where the CPU has no native bf16) or
            ``auto`` (:mod:`qkv.training.precision`).
    """

    task: str = "copy_offset"
    task_options: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] | ModelConfig = field(default_factory=dict)
    steps: int = 300
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 30
    schedule: str = "linear"
    weight_decay: float = 0.01
    clip_norm: float | None = 1.0
    seed: int = 0
    eval_lengths: tuple[int, ...] = ()
    eval_batches: int = 4
    eval_batch_size: int | None = None
    log_every: int = 10
    time_budget: float | None = None
    precision: str = "fp32"

    def __post_init__(self) -> None:
        check_choice("task", self.task, tuple(SYNTHETIC_TASKS))
        if not isinstance(self.task_options, dict):
            raise ValueError(f"task_options must be a dict of the task's options, got {self.task_options!r}")
        for name in ("steps", "batch_size", "eval_batches", "log_every"):
            check_int(name, getattr(self, name), low=1)
        check_int("warmup_steps", self.warmup_steps, low=0)
        check_int("eval_batch_size", self.eval_batch_size, low=1, optional=True)
        check_int("seed", self.seed, low=0)
        if self.seed >= EVAL_SEED:
            raise ValueError(f"seed={self.seed} must be < {EVAL_SEED} (that stream is the held-out set)")
        check_positive("lr", self.lr)
        check_range("weight_decay", self.weight_decay, 0, number=True)
        check_positive("clip_norm", self.clip_norm, optional=True)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_positive("time_budget", self.time_budget, unit=" of minutes (e.g. 0.5)", optional=True)
        check_run_length(self)
        check_choice("precision", self.precision, PRECISIONS)
        if not isinstance(self.eval_lengths, tuple):
            raise ValueError(f"eval_lengths must be a tuple of ints, got {self.eval_lengths!r}")
        task = self.build_task()  # refuses unknown or bad task options
        if self.eval_lengths and not hasattr(task, "seq_len"):
            length_tasks = [n for n, c in SYNTHETIC_TASKS.items() if hasattr(c, "seq_len")]
            raise ValueError(f"eval_lengths={self.eval_lengths} need a length task "
                             f"({', '.join(length_tasks)}); {self.task!r} rows have one fixed layout")
        for length in self.eval_lengths:
            task.batch(0, 1, length=length)  # refuses a length out of range, naming it
        if not isinstance(self.model, (dict, ModelConfig)):
            raise ValueError(f"model must be a dict of ModelConfig overrides or a ModelConfig, got "
                             f"{type(self.model).__name__}")
        self.model_config()  # refuses bad overrides

    def build_task(self):
        """The task of ``task`` and ``task_options``."""
        return get_synthetic_task(self.task, **self.task_options)

    def longest_row(self) -> int:
        """T of the longest row trained or evaluated on."""
        task = self.build_task()
        return max([task.max_len] + [task.seq_len(n) for n in self.eval_lengths])

    def model_config(self) -> ModelConfig:
        """The :class:`ModelConfig` of the run, sized for the task."""
        task, need = self.build_task(), self.longest_row()
        if isinstance(self.model, ModelConfig):
            cfg = self.model
        else:
            if "vocab_size" in self.model:
                raise ValueError("model: vocab_size is the task's; leave it out of the overrides")
            cfg = ModelConfig.from_dict({**MODEL_DEFAULTS, "max_len": need, **self.model,
                                         "vocab_size": task.vocab_size})
        if cfg.vocab_size != task.vocab_size:
            raise ValueError(f"model.vocab_size={cfg.vocab_size} must be the task's {task.vocab_size}")
        if cfg.max_len < need:
            raise ValueError(f"model.max_len={cfg.max_len} is shorter than the longest row ({need} tokens)")
        return cfg

    def tokens_per_example(self, model: ModelConfig | None = None) -> int | None:
        """A row's tokens: at most ``model``'s ``max_len`` (``None`` before the model is sized for the
        task's longest row)."""
        return None if model is None else model.max_len

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields; ``time_budget`` and ``precision`` only when set, so that results stored
        before they existed still name this configuration (``qkv ablate`` compares them)."""
        out = dataclasses.asdict(self)
        if isinstance(self.model, ModelConfig):
            out["model"] = self.model.to_dict()
        out["eval_lengths"] = list(self.eval_lengths)
        for name, default in _LATER_FIELDS.items():
            if out[name] == default:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderTaskConfig:
        """The config of :meth:`to_dict`'s dict (a stored result's ``config``)."""
        cls.check_keys(data)
        data = dict(data)
        data["eval_lengths"] = tuple(data.get("eval_lengths", ()))
        model = data.get("model")
        if isinstance(model, dict) and "vocab_size" in model:  # a whole ModelConfig (overrides never hold it)
            data["model"] = ModelConfig.from_dict(model)
        return cls(**data)


#: Fields added after results were first stored, with their defaults (left out of ``to_dict``).
_LATER_FIELDS = {"time_budget": None, "precision": "fp32"}
