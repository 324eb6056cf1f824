"""Train an encoder–decoder on a synthetic task (:mod:`qkv.lab.tasks`) on CPU and measure exact match.

:func:`train` trains with the training engine (:func:`qkv.training.engine.run_training`: AdamW with
betas (0.9, 0.98), a warm-up of 5 % of the steps then linear decay, gradients clipped at 1 — by
steps or a time budget, fp32 or bf16) on the :class:`Seq2SeqObjective`, then evaluates greedy
generation on a fixed held-out set (its own seed stream, never trained on).

Without ``out`` the run is in memory. With ``out`` it is a run folder
(:mod:`qkv.training.lifecycle`: created atomically and locked, ``run.json``, ``metrics.jsonl``,
``curve.png``, checkpoints — ``resume=True`` continues it bit for bit) that ends with ``out/model``
(a qkv model folder whose tokenizer's tokens are the task's symbols: ``qkv inspect out/model "3 1 4
1 5"``) and ``out/metrics.json``. A folder holding anything else — an earlier result too — is
refused unless resuming it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from qkv._fs import atomic_write_text
from qkv.config import ModelConfig
from qkv.lab.tasks import EOS, PAD, SPECIALS, Task, get_task
from qkv.models.builders import build_encoder_decoder
from qkv.models.footprint import check_fits
from qkv.checkpoints.io import load, save
from qkv.training.config import LoopConfig, RunConfig
from qkv.training.distributed import refuse_world
from qkv.training.engine import run_training
from qkv.training.lifecycle import open_run, resume_eval
from qkv.training.precision import PRECISIONS, resolve_precision
from qkv.validation import check_batch_tokens, check_choice, check_positive, check_run_length
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel

__all__ = ["PRESETS", "preset_config", "train", "evaluate", "LabResult", "Seq2SeqObjective", "Seq2SeqRunConfig",
           "task_tokenizer", "EVAL_SEED"]

#: The held-out stream: a seed no training run uses.
EVAL_SEED = 2**31 - 1

#: Model presets (ModelConfig fields) and their training recipe.
PRESETS: dict[str, dict] = {
    "small": dict(model=dict(d_model=64, n_heads=4, d_ff=256, n_layers=2, position="relative-alibi", norm="pre",
                             dropout=0.0), steps=3700, batch_size=64, lr=3e-3),
    "tiny": dict(model=dict(d_model=64, n_heads=4, d_ff=128, n_layers=1, position="learned", norm="pre",
                            dropout=0.0), steps=300, batch_size=32, lr=3e-3),
}


def preset_config(task: Task, preset: str = "small", **overrides) -> ModelConfig:
    """The :class:`ModelConfig` of ``preset`` sized for ``task``'s vocabulary and lengths."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    fields = dict(vocab_size=task.vocab_size, max_len=max(task.max_len, task.max_target_len) + 1, type_vocab_size=0,
                  pad_token_id=PAD, layer_norm_eps=1e-5, **PRESETS[preset]["model"])
    return ModelConfig.from_flat(**{**fields, **overrides})


@dataclass
class LabResult:
    """What :func:`train` returns (and writes to ``metrics.json``).

    ``wall_s``: seconds this process trained (held-out evaluations not counted). ``status``:
    ``complete``, or ``interrupted`` (a stop request; ``exact_match`` is then NaN and ``resume=True``
    continues the run). The trained model is its attribute ``model`` (not in ``metrics.json``).
    """

    task: str
    exact_match: float
    chance: float
    steps: int
    wall_s: float
    final_loss: float
    eval_examples: int
    seed: int
    model_dir: str | None
    precision: str = "fp32"
    status: str = "complete"


@dataclass(frozen=True)
class Seq2SeqRunConfig(RunConfig):
    """What a run depends on — stored in ``run.json``; ``--resume`` refuses a different one."""

    task: str
    task_options: dict[str, Any]
    preset: str
    model: dict[str, Any]
    steps: int
    time_budget: float | None
    batch_size: int
    lr: float
    seed: int
    eval_examples: int
    precision: str

    def tokens_per_example(self, model=None) -> None:
        """``None``: a row's length is the task's (its source and target lengths), not this record's."""
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def task_tokenizer(task: Task):
    """A ``tokenizers`` WordLevel tokenizer over the task's tokens (whitespace-split)."""
    vocab = {t: i for i, t in enumerate(task.vocab)}
    tok = Tokenizer(WordLevel(vocab, unk_token="[PAD]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIALS))
    return tok


@torch.no_grad()
def evaluate(model, task: Task, n: int = 512, batch_size: int = 128) -> float:
    """Exact match of greedy generation on ``n`` held-out examples (:data:`EVAL_SEED`)."""
    was = model.training
    model.eval()
    hits = 0
    for i in range(math.ceil(n / batch_size)):
        b = task.batch(i, min(batch_size, n - i * batch_size), EVAL_SEED)
        out = model.generate(b.input_ids, b.attention_mask, max_new_tokens=task.max_target_len, eos_token_id=EOS)
        hits += sum(task.exact_match(row[1:].tolist(), t) for row, t in zip(out, b.targets))
    model.train(was)
    return hits / n


class Seq2SeqObjective:
    """Cross-entropy of the target tokens given the source (teacher forcing), on batch ``i`` of the
    task's stream ``seed``; held out, exact match of greedy generation."""

    metric, metric_label, loss_label = "exact_match", "held-out exact match", "loss"

    def __init__(self, task: Task, batch_size: int, seed: int, eval_examples: int):
        self.task, self.batch_size, self.seed, self.eval_examples = task, batch_size, seed, eval_examples

    def batch(self, index: int):
        return self.task.batch(index, self.batch_size, self.seed)

    def units(self, batch) -> torch.Tensor:
        return (batch.labels != -100).sum()

    def loss(self, model, batch) -> torch.Tensor:
        return model(batch.input_ids, batch.attention_mask, labels=batch.labels).loss

    def evaluate(self, model) -> dict:
        return {"exact_match": evaluate(model, self.task, self.eval_examples), "eval_examples": self.eval_examples}

    def describe(self, ev: dict) -> str:
        return f"held-out exact match {ev['exact_match']:.4f} ({ev['eval_examples']} examples)"

    def save(self, model, out: Path) -> None:
        save(model, Path(out) / "model", tokenizer=task_tokenizer(self.task))


def train(task: Task | str, *, config: ModelConfig | None = None, preset: str = "small", steps: int | None = None,
          time_budget: float | None = None, minutes: float | None = None, batch_size: int | None = None,
          lr: float | None = None, seed: int = 0, out: str | Path | None = None, resume: bool = False,
          precision: str = "fp32", eval_examples: int = 512, progress: bool = True,
          clock: Callable[[], float] = time.monotonic, on_backward=None) -> LabResult:
    """Train an :class:`~qkv.models.seq2seq.EncoderDecoder` on ``task``.

    Args:
        task: a :class:`~qkv.lab.tasks.Task` or a registered name.
        config: the model (default :func:`preset_config` of ``preset``).
        preset: a name in :data:`PRESETS` (its model and recipe: steps, batch size, learning rate).
        steps: optimiser steps (default the preset's; they also size the warm-up).
        time_budget: train for this many minutes instead (the learning rate reaches zero at the
            deadline, :mod:`qkv.training.budget`). minutes: the same (its former name).
        batch_size, lr: default the preset's. seed: initialisation and training stream.
        out: the run folder (see the module docstring), or ``None``: in memory.
        resume: continue the run in ``out`` (a finished one is returned as it is).
        precision: ``fp32``, ``bf16`` (fp32 with a message where the CPU has no native bf16) or ``auto``.
        eval_examples: held-out examples. progress: show a progress bar.
        clock: the monotonic time source of a time budget (tests pass a fake one).
        on_backward: ``f(step, model)`` after each backward pass (:func:`~qkv.training.engine.run_training`).

    Returns:
        :class:`LabResult` (its ``model`` the trained model).
    """
    refuse_world("qkv lab seq2seq trains its small models in one process; run it without torchrun")
    task = get_task(task) if isinstance(task, str) else task
    cfg, model_cfg = _run_config(task, config, preset, steps, time_budget, minutes, batch_size, lr, seed,
                                 precision, eval_examples)
    if out is None:
        if resume:
            raise ValueError("resume=True continues the run in a folder: give out")
        return _train(task, cfg, model_cfg, None, progress, clock, on_backward)
    with open_run(out, resume=resume) as run:
        if resume:
            if run.finished(cfg, files=("model/qkv.json", "metrics.json")) is not None:
                return _finished(run.out)
            run.check_config(cfg)
        return _train(task, cfg, model_cfg, run, progress, clock, on_backward)


def _run_config(task: Task, config, preset, steps, time_budget, minutes, batch_size, lr, seed, precision,
                eval_examples) -> tuple[Seq2SeqRunConfig, ModelConfig]:
    recipe = PRESETS.get(preset)
    if recipe is None:
        raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if minutes is not None:
        if time_budget is not None and time_budget != minutes:
            raise ValueError("time_budget and minutes are the same setting; give one")
        time_budget = minutes
    check_positive("time_budget", time_budget, unit=" of minutes (e.g. 3)", optional=True)
    check_choice("precision", precision, PRECISIONS)
    model_cfg = config or preset_config(task, preset)
    options = dict(n_symbols=task.n_symbols, min_len=task.min_len, max_len=task.max_len)
    cfg = Seq2SeqRunConfig(task=task.name, task_options=options, preset=preset, model=model_cfg.to_dict(),
                           steps=steps or recipe["steps"], time_budget=time_budget,
                           batch_size=batch_size or recipe["batch_size"], lr=lr or recipe["lr"], seed=seed,
                           eval_examples=eval_examples, precision=precision)
    check_run_length(cfg)
    check_batch_tokens("batch_size", cfg.batch_size, task.max_len)
    return cfg, model_cfg


def _train(task: Task, cfg: Seq2SeqRunConfig, model_cfg: ModelConfig, run, progress: bool, clock,
           on_backward) -> LabResult:
    used, note = resolve_precision(cfg.precision)
    if note and progress:
        print(f"qkv lab seq2seq: {note}", flush=True)
    check_fits(lambda: build_encoder_decoder(model_cfg), hint="choose a smaller --preset or --max-len")
    if run is not None and not run.resume:
        run.create({"kind": "lab-seq2seq", "train_config": cfg.to_dict(), "precision": used})
    torch.manual_seed(cfg.seed)
    model = build_encoder_decoder(model_cfg)
    model.train()
    loop = LoopConfig(steps=cfg.steps if cfg.time_budget is None else None, time_budget=cfg.time_budget, lr=cfg.lr,
                      weight_decay=0.01, betas=(0.9, 0.98), eps=1e-8, warmup_steps=max(1, cfg.steps // 20),
                      clip_norm=1.0, seed=cfg.seed, save_every=max(1, cfg.steps // 10) if run is not None else None,
                      log_every=10, progress=progress)
    objective = Seq2SeqObjective(task, cfg.batch_size, cfg.seed, cfg.eval_examples)
    r = run_training(loop, objective, model=model, run=run, precision=used, title=f"{task.name} (lab seq2seq)",
                     clock=clock, resume_eval=resume_eval, on_backward=on_backward)
    model.eval()
    done = r.status == "complete"
    result = LabResult(task.name, r.final_eval["exact_match"] if done else math.nan, task.chance(), r.steps_done,
                       round(r.train_s, 2), r.train_loss if r.train_loss is not None else math.nan,
                       cfg.eval_examples, cfg.seed, None if run is None else str(run.out / "model"), used, r.status)
    if run is not None and done:
        atomic_write_text(run.out / "metrics.json", json.dumps(
            {**asdict(result), "config": cfg.model, "batch_size": cfg.batch_size, "lr": cfg.lr,
             "task_options": cfg.task_options, "time_budget": cfg.time_budget}, indent=2))
    result.model = model  # the trained model, for callers (not in metrics.json)
    return result


def _finished(out: Path) -> LabResult:
    """The result of a run that is complete (``--resume`` of it changes nothing)."""
    data = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    result = LabResult(**{k: data[k] for k in LabResult.__dataclass_fields__ if k in data})
    result.model = load(out / "model").model.eval()
    return result
