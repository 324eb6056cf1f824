"""Train a masked-LM-headed encoder on a synthetic per-position task (:mod:`qkv.lab.synthetic`) on
CPU and measure what it learned.

:func:`train_on_task` builds the model of :class:`EncoderTaskConfig` (vocabulary = the task's, a
position table long enough for the longest evaluation row), measures the gradient norms at
initialisation on one batch, trains with AdamW and a warm-up then linear or cosine decay
(:mod:`qkv.training.optim`) on the task's stream ``seed``, and scores token and sequence exact match
on held-out batches of another stream (:data:`EVAL_SEED`, never trained on) at the training
distribution and at each evaluation length, plus every head's attention entropy on one held-out
batch. A non-finite loss or gradient stops training and is reported (``diverged``), not raised.

Legend: L layers, H heads, C model width, G key/value heads, D head width.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from qkv.config import ModelConfig
from qkv.lab.streams import IGNORE, PAD, SEP
from qkv.lab.synthetic import SYNTHETIC_TASKS, get_synthetic_task
from qkv.training.optim import SCHEDULES, build_optimizer, build_scheduler
from qkv.validation import check_choice, check_int, check_positive, check_range

__all__ = ["EncoderTaskConfig", "EncoderTaskResult", "LengthScore", "train_on_task", "evaluate",
           "init_grad_norms", "attention_entropy", "EVAL_SEED", "MODEL_DEFAULTS"]

#: The held-out stream: a seed no training run may use.
EVAL_SEED = 2**31 - 1

#: The model unless ``EncoderTaskConfig.model`` says otherwise (vocab_size and max_len come from the task).
MODEL_DEFAULTS: dict[str, Any] = dict(d_model=64, n_heads=4, d_ff=256, n_layers=2, norm="pre", dropout=0.0,
                                      position="learned", type_vocab_size=0, pad_token_id=PAD,
                                      layer_norm_eps=1e-5)


@dataclass(frozen=True)
class EncoderTaskConfig:
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

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if isinstance(self.model, ModelConfig):
            out["model"] = self.model.to_dict()
        out["eval_lengths"] = list(self.eval_lengths)
        return out


@dataclass(frozen=True)
class LengthScore:
    """Held-out exact match at one length (``None``: the training distribution of lengths)."""

    length: int | None
    token_accuracy: float
    sequence_accuracy: float
    n_tokens: int
    n_rows: int


@dataclass(frozen=True)
class EncoderTaskResult:
    """What :func:`train_on_task` measured. Timings and the model are left out of ``==``.

    Attributes:
        chance: the task's chance level (token exact match of the best input-blind guess).
        steps_done: optimiser steps taken (< ``steps`` when it diverged).
        diverged: a non-finite loss or gradient stopped training before its step; the weights
            as they were are evaluated (after an absurd step they may be non-finite themselves).
        loss_curve: ``(step, loss)`` every ``log_every`` steps, the step counted from 1; a
            diverged run's ends with the loss of the step that stopped it.
        train_eval: held-out exact match at the training distribution. length_evals: at each
            ``eval_lengths`` entry.
        attention_entropy: ``(L,H)`` mean entropy (nats) of each head's attention over the real
            queries of one held-out batch; ``uniform_entropy`` what uniform attention would have.
        init_attention_entropy: ``(L,H)`` the same entropy at initialisation (before any step).
        init_loss: the loss of the initialisation-probe batch.
        init_layer_grad_norms: ``(L,)`` gradient norm of each layer's parameters at
            initialisation; ``init_q_grad_norms`` / ``init_k_grad_norms`` ``(L,)`` of its query
            and key maps (empty without ``qkv_proj``).
        seconds: training wall time; steps_per_s.
    """

    task: str
    chance: float
    steps_done: int
    diverged: bool
    final_loss: float
    loss_curve: tuple[tuple[int, float], ...]
    train_eval: LengthScore
    length_evals: tuple[LengthScore, ...]
    attention_entropy: tuple[tuple[float, ...], ...]
    uniform_entropy: float
    init_attention_entropy: tuple[tuple[float, ...], ...]
    init_loss: float
    init_layer_grad_norms: tuple[float, ...]
    init_q_grad_norms: tuple[float, ...]
    init_k_grad_norms: tuple[float, ...]
    n_parameters: int
    config: EncoderTaskConfig
    seconds: float = field(compare=False)
    steps_per_s: float = field(compare=False)
    model: nn.Module | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Every field but the model, JSON-ready."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}
        out["train_eval"] = dataclasses.asdict(self.train_eval)
        out["length_evals"] = [dataclasses.asdict(s) for s in self.length_evals]
        out["config"] = self.config.to_dict()
        return out


def _grad_norm(tensors) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors if t is not None))


def init_grad_norms(model, batch) -> tuple[float, list[float], list[float], list[float]]:
    """The loss and gradient norms of one batch at the model's present weights (no step; the
    gradients are cleared again): per layer, and of each layer's query and key maps."""
    model.zero_grad(set_to_none=True)
    loss = model(batch.input_ids, batch.attention_mask, labels=batch.labels).loss
    loss.backward()
    layers, q_norms, k_norms = [], [], []
    for layer in model.encoder.layers:
        layers.append(_grad_norm(p.grad for p in layer.parameters()))
        proj = layer.attention.qkv_proj
        if proj is None:
            continue
        C, qk = proj.in_features, layer.attention.qk_rows  # rows [0:C] queries, [C:qk] keys (none if shared)
        w, b = proj.weight.grad, proj.bias.grad if proj.bias is not None else None
        q_norms.append(_grad_norm([w[:C], None if b is None else b[:C]]))
        k_rows = slice(0, C) if layer.attention.shared_qk else slice(C, qk)  # shared: the keys' map is the queries'
        k_norms.append(_grad_norm([w[k_rows], None if b is None else b[k_rows]]))
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), layers, q_norms, k_norms


@torch.no_grad()
def evaluate(model, task, *, batches: int, batch_size: int, length: int | None = None) -> LengthScore:
    """Token and sequence exact match on ``batches`` held-out batches (:data:`EVAL_SEED`)."""
    was = model.training
    model.eval()
    tok = seq = n_tok = n_rows = 0
    for i in range(batches):
        b = task.batch(i, batch_size, EVAL_SEED) if length is None else \
            task.batch(i, batch_size, EVAL_SEED, length=length)
        logits = model(b.input_ids, b.attention_mask, labels=b.labels).logits  # (N,V) at the scored places
        scored = b.labels != IGNORE  # (B,T)
        n, rows = int(scored.sum()), int(scored.any(dim=1).sum())
        tok += task.accuracy(logits, b.labels) * n
        seq += task.sequence_accuracy(logits, b.labels) * rows
        n_tok, n_rows = n_tok + n, n_rows + rows
    model.train(was)
    return LengthScore(length, tok / n_tok, seq / n_rows, n_tok, n_rows)


def attention_entropy(model, batch) -> tuple[list[list[float]], float]:
    """``(L,H)`` mean attention entropy (nats) over the real queries of ``batch``, and the entropy of
    uniform attention over the real keys (:mod:`qkv.analysis.heads`)."""
    from qkv.analysis.capture import forward
    from qkv.analysis.heads import head_statistics

    was = model.training
    model.eval()
    _, attn = forward(model, batch.input_ids, batch.attention_mask)  # (L,B,H,T,T)
    model.train(was)
    stats = head_statistics(attn, batch.attention_mask, batch.input_ids, cls_id=-1, sep_id=SEP)
    return stats.entropy.tolist(), float(stats.uniform_entropy)


def _progress_bar(progress, steps: int):
    """``(update(step, loss), close())`` for ``progress``: falsy, ``True`` (a tqdm bar) or a callable."""
    if callable(progress):
        return progress, lambda: None
    if not progress:
        return (lambda step, loss: None), lambda: None
    from tqdm.auto import tqdm

    bar = tqdm(total=steps, unit="step", dynamic_ncols=True, leave=False)

    def update(step: int, loss: float) -> None:
        bar.n = step
        bar.set_postfix(loss=f"{loss:.3f}")

    return update, bar.close


def train_on_task(config: EncoderTaskConfig,
                  progress: bool | Callable[[int, float], None] | None = None) -> EncoderTaskResult:
    """Train, then evaluate (see the module docstring).

    Args:
        config: the run.
        progress: ``True`` shows a progress bar; a callable gets ``(step, loss)`` every
            ``log_every`` steps; ``None``/``False``: silent.

    Returns:
        :class:`EncoderTaskResult` (its ``model`` the trained model).
    """
    from qkv.models.builders import build_masked_lm

    if not isinstance(config, EncoderTaskConfig):
        raise ValueError(f"config must be an EncoderTaskConfig, got {type(config).__name__}")
    task, model_cfg = config.build_task(), config.model_config()
    torch.manual_seed(config.seed)
    model = build_masked_lm(model_cfg)
    model.train()
    init_loss, layer_norms, q_norms, k_norms = init_grad_norms(model, task.batch(0, config.batch_size,
                                                                               config.seed))
    eval_bs = config.eval_batch_size or config.batch_size
    init_entropy, _ = attention_entropy(model, task.batch(0, eval_bs, EVAL_SEED))
    opt = build_optimizer(model, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98))
    sched = build_scheduler(opt, warmup_steps=config.warmup_steps, total_steps=config.steps,
                            schedule=config.schedule)
    update, close = _progress_bar(progress, config.steps)
    curve: list[tuple[int, float]] = []
    loss_v, done, diverged = float("nan"), 0, False
    t0 = time.perf_counter()
    for step in range(config.steps):
        b = task.batch(step, config.batch_size, config.seed)
        loss = model(b.input_ids, b.attention_mask, labels=b.labels).loss
        loss_v = float(loss.detach())
        if not math.isfinite(loss_v):
            diverged = True
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = config.clip_norm if config.clip_norm is not None else math.inf
        if not math.isfinite(float(nn.utils.clip_grad_norm_(model.parameters(), max_norm))):
            diverged = True  # stop before a step with a non-finite gradient
            break
        opt.step()
        sched.step()
        done = step + 1
        if done % config.log_every == 0 or done == config.steps:
            curve.append((done, loss_v))
            update(done, loss_v)
    seconds = time.perf_counter() - t0
    close()
    if diverged:
        curve.append((done + 1, loss_v))
    model.zero_grad(set_to_none=True)
    train_eval = evaluate(model, task, batches=config.eval_batches, batch_size=eval_bs)
    lengths = tuple(evaluate(model, task, batches=config.eval_batches, batch_size=eval_bs, length=n)
                    for n in config.eval_lengths)
    entropy, uniform = attention_entropy(model, task.batch(0, eval_bs, EVAL_SEED))
    model.eval()
    return EncoderTaskResult(
        task=task.name, chance=task.chance, steps_done=done, diverged=diverged, final_loss=loss_v,
        loss_curve=tuple(curve), train_eval=train_eval, length_evals=lengths,
        attention_entropy=tuple(tuple(row) for row in entropy), uniform_entropy=uniform,
        init_attention_entropy=tuple(tuple(row) for row in init_entropy),
        init_loss=init_loss, init_layer_grad_norms=tuple(layer_norms), init_q_grad_norms=tuple(q_norms),
        init_k_grad_norms=tuple(k_norms), n_parameters=sum(p.numel() for p in model.parameters()),
        config=config, seconds=seconds, steps_per_s=done / seconds if seconds > 0 else 0.0, model=model)
