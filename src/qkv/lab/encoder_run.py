"""Train a masked-LM-headed encoder on a synthetic per-position task (:mod:`qkv.lab.synthetic`) on
CPU and measure what it learned.

:func:`train_on_task` builds the model of :class:`~qkv.lab.encoder_config.EncoderTaskConfig`
(vocabulary = the task's, a position table long enough for the longest evaluation row), measures
the gradient norms and attention entropy at initialisation on one batch, trains it with the
training engine (:func:`qkv.training.engine.run_training`: AdamW with betas (0.9, 0.98), a warm-up
then linear or cosine decay, by steps or a time budget, fp32 or bf16) on the task's stream
``seed`` — the :class:`SyntheticTaskObjective` —, and scores token and sequence exact match on
held-out batches of another stream (:data:`EVAL_SEED`, never trained on) at the training
distribution and at each evaluation length, plus every head's attention entropy on one held-out
batch. A non-finite loss or gradient stops training and is reported (``diverged``), not raised.

A run is in memory (the lab grids' hundreds of small runs: no files) or, with ``out``, has a run
folder (:mod:`qkv.training.lifecycle`: ``run.json`` with the measurements at initialisation,
``metrics.jsonl``, ``curve.png``, checkpoints, the final model) that ``resume=True`` continues bit
for bit after an interruption.

Legend: L layers, H heads, C model width, G key/value heads, D head width.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qkv.analysis.capture import forward
from qkv.analysis.heads import head_statistics
from qkv.lab.encoder_config import EVAL_SEED, EncoderTaskConfig
from qkv.lab.streams import IGNORE, SEP
from qkv.models.builders import build_masked_lm
from qkv.checkpoints.io import load, save
from qkv.training.config import LoopConfig
from qkv.training.distributed import refuse_world
from qkv.training.engine import TrainResult, run_training
from qkv.training.step import gradients
from qkv.training.lifecycle import open_run
from qkv.training.metrics import read_metrics
from qkv.training.precision import resolve_precision

__all__ = ["EncoderTaskResult", "LengthScore", "SyntheticTaskObjective", "train_on_task", "evaluate",
           "init_grad_norms", "attention_entropy"]


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
        seconds: training wall time of this process (evaluations excluded); steps_per_s.
        precision: what the run trained in (``bf16`` falls back to ``fp32`` where the CPU has no
            native bf16).
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
    precision: str = "fp32"
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


def init_grad_norms(model, batch, *, precision: str = "fp32") -> tuple[float, list[float], list[float], list[float]]:
    """The loss and gradient norms of one batch at the model's present weights (no step; the
    gradients are cleared again): per layer, and of each layer's query and key maps. The gradients
    come from the training engine (:func:`qkv.training.engine.gradients`) in ``precision``."""
    loss = gradients(model, lambda: model(batch.input_ids, batch.attention_mask, labels=batch.labels).loss,
                     precision=precision)
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
    return loss, layers, q_norms, k_norms


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
    was = model.training
    model.eval()
    _, attn = forward(model, batch.input_ids, batch.attention_mask)  # (L,B,H,T,T)
    model.train(was)
    stats = head_statistics(attn, batch.attention_mask, batch.input_ids, cls_id=-1, sep_id=SEP)
    return stats.entropy.tolist(), float(stats.uniform_entropy)


class SyntheticTaskObjective:
    """Masked-LM cross-entropy over the scored positions of the task's rows (stream ``seed``); held
    out, exact match at the training distribution and each evaluation length, and the heads'
    attention entropy (JSON-ready, so that a run folder keeps it)."""

    metric, metric_label, loss_label = "token_accuracy", "held-out token exact match", "loss"

    def __init__(self, config: EncoderTaskConfig):
        self.config, self.task = config, config.build_task()
        self.eval_bs = config.eval_batch_size or config.batch_size

    def batch(self, index: int):
        return self.task.batch(index, self.config.batch_size, self.config.seed)

    def units(self, batch) -> torch.Tensor:
        return (batch.labels != IGNORE).sum()

    def loss(self, model, batch) -> torch.Tensor:
        return model(batch.input_ids, batch.attention_mask, labels=batch.labels).loss

    def evaluate(self, model) -> dict:
        cfg = self.config
        train = evaluate(model, self.task, batches=cfg.eval_batches, batch_size=self.eval_bs)
        lengths = [evaluate(model, self.task, batches=cfg.eval_batches, batch_size=self.eval_bs, length=n)
                   for n in cfg.eval_lengths]
        entropy, uniform = attention_entropy(model, self.task.batch(0, self.eval_bs, EVAL_SEED))
        return {"token_accuracy": train.token_accuracy, "sequence_accuracy": train.sequence_accuracy,
                "train_eval": dataclasses.asdict(train), "length_evals": [dataclasses.asdict(s) for s in lengths],
                "attention_entropy": entropy, "uniform_entropy": uniform}

    def describe(self, ev: dict) -> str:
        return f"held-out exact match: token {ev['token_accuracy']:.4f}, sequence {ev['sequence_accuracy']:.4f}"

    def save(self, model, out: Path) -> None:
        save(model, out)


def train_on_task(config: EncoderTaskConfig, progress: bool | Callable[[int, float], None] | None = None, *,
                  out: str | Path | None = None, resume: bool = False, save_every: int | None = None,
                  clock: Callable[[], float] = time.monotonic, on_backward=None) -> EncoderTaskResult:
    """Train, then evaluate (see the module docstring).

    Args:
        config: the run.
        progress: ``True`` shows a progress bar; a callable gets ``(step, loss)`` every
            ``log_every`` steps; ``None``/``False``: silent.
        out: the run folder (must be free, or hold this run with ``resume``); ``None``: in memory.
        resume: continue the run in ``out`` from its last checkpoint (a finished run is returned
            as it is).
        save_every: with ``out``: checkpoint every N steps (always at the end and on a stop request).
        clock: the monotonic time source of a time-budgeted run (tests pass a fake one).
        on_backward: ``f(step, model)`` after each backward pass (:func:`~qkv.training.engine.run_training`).

    Returns:
        :class:`EncoderTaskResult` (its ``model`` the trained model).
    """
    if not isinstance(config, EncoderTaskConfig):
        raise ValueError(f"config must be an EncoderTaskConfig, got {type(config).__name__}")
    if out is None:
        if resume:
            raise ValueError("resume=True continues the run in a folder: give out")
        return _train(config, progress, None, save_every, clock, on_backward)
    refuse_world("a lab encoder run trains in one process; run it without torchrun (qkv ablate --jobs runs several)")
    with open_run(out, resume=resume) as run:
        if resume:
            if (meta := run.finished(config, files=("qkv.json",))) is not None:
                return _result(config, meta, read_metrics(run.out / "metrics.jsonl"), load(run.out).model.eval())
            run.check_config(config)
        return _train(config, progress, run, save_every, clock, on_backward)


def _train(config: EncoderTaskConfig, progress, run, save_every, clock, on_backward) -> EncoderTaskResult:
    task, model_cfg = config.build_task(), config.model_config()
    precision, _ = resolve_precision(config.precision)
    torch.manual_seed(config.seed)
    model = build_masked_lm(model_cfg)
    model.train()
    objective = SyntheticTaskObjective(config)
    init_loss, layers, q_norms, k_norms = init_grad_norms(model, objective.batch(0), precision=precision)
    init_entropy, _ = attention_entropy(model, task.batch(0, objective.eval_bs, EVAL_SEED))
    init = {"init_loss": init_loss, "init_layer_grad_norms": layers, "init_q_grad_norms": q_norms,
            "init_k_grad_norms": k_norms, "init_attention_entropy": init_entropy, "precision": precision,
            "chance": task.chance, "n_parameters": sum(p.numel() for p in model.parameters())}
    if run is not None and not run.resume:
        run.create({"kind": "lab-encoder", "train_config": config.to_dict(), "model_config": model_cfg.to_dict(),
                    **init})
    loop = LoopConfig(steps=config.steps if config.time_budget is None else None, time_budget=config.time_budget,
                      lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98),
                      warmup_steps=config.warmup_steps, schedule=config.schedule, clip_norm=config.clip_norm,
                      seed=config.seed, save_every=save_every, log_every=config.log_every, progress=progress is True)
    on_log = (lambda row: progress(row["step"], row["loss"])) if callable(progress) else None
    r = run_training(loop, objective, model=model, run=run, precision=precision, title=f"{task.name} (lab)",
                     clock=clock, on_log=on_log, on_backward=on_backward, divergence="report")
    model.eval()
    if r.status == "interrupted":
        raise KeyboardInterrupt(f"stopped after step {r.steps_done}; continue with resume=True")
    return _result(config, {**init, **_summary(r)}, r.history, model, r)


def _summary(r: TrainResult) -> dict:
    return {"status": r.status, "steps_done": r.steps_done, "final_eval": r.final_eval, "train_loss": r.train_loss}


def _result(config: EncoderTaskConfig, meta: dict, history: list[dict], model, r: TrainResult | None = None):
    """The :class:`EncoderTaskResult` of a run's measurements (``meta``: at initialisation, and the
    engine's summary) and its logged records."""
    ev = meta["final_eval"]
    new_steps = r.steps_done - r.start_step if r is not None else 0
    seconds = r.train_s if r is not None else 0.0
    return EncoderTaskResult(
        task=config.task, chance=meta["chance"], steps_done=meta["steps_done"],
        diverged=meta["status"] == "diverged", final_loss=meta["train_loss"],
        loss_curve=tuple((row["step"], row["loss"]) for row in history if "loss" in row),
        train_eval=LengthScore(**ev["train_eval"]), length_evals=tuple(LengthScore(**s) for s in ev["length_evals"]),
        attention_entropy=tuple(tuple(row) for row in ev["attention_entropy"]), uniform_entropy=ev["uniform_entropy"],
        init_attention_entropy=tuple(tuple(row) for row in meta["init_attention_entropy"]),
        init_loss=meta["init_loss"], init_layer_grad_norms=tuple(meta["init_layer_grad_norms"]),
        init_q_grad_norms=tuple(meta["init_q_grad_norms"]), init_k_grad_norms=tuple(meta["init_k_grad_norms"]),
        n_parameters=meta["n_parameters"], config=config, seconds=seconds,
        steps_per_s=new_steps / seconds if seconds > 0 else 0.0, precision=meta["precision"], model=model)
