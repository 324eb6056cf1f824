"""Train an encoder–decoder on a synthetic task (:mod:`qkv.lab.tasks`) on CPU and measure exact match.

:func:`train` runs AdamW with a linear warmup then linear decay, evaluates greedy generation on a
fixed held-out set (its own seed stream, never trained on), and writes ``out/model`` (a qkv model
folder whose tokenizer's tokens are the task's symbols: ``qkv inspect out/model "3 1 4 1 5"``)
and ``out/metrics.json``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from qkv.config import ModelConfig
from qkv.lab.tasks import EOS, PAD, SPECIALS, Task, get_task

__all__ = ["PRESETS", "preset_config", "train", "evaluate", "LabResult", "task_tokenizer", "EVAL_SEED"]

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
    """What :func:`train` returns (and writes to ``metrics.json``)."""

    task: str
    exact_match: float
    chance: float
    steps: int
    wall_s: float
    final_loss: float
    eval_examples: int
    seed: int
    model_dir: str | None


def task_tokenizer(task: Task):
    """A ``tokenizers`` WordLevel tokenizer over the task's tokens (whitespace-split)."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

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


def train(task: Task | str, *, config: ModelConfig | None = None, preset: str = "small", steps: int | None = None,
          minutes: float | None = None, batch_size: int | None = None, lr: float | None = None, seed: int = 0,
          out: str | Path | None = None, eval_examples: int = 512, progress: bool = True) -> LabResult:
    """Train an :class:`~qkv.models.seq2seq.EncoderDecoder` on ``task``.

    Args:
        task: a :class:`~qkv.lab.tasks.Task` or a registered name.
        config: the model (default :func:`preset_config` of ``preset``).
        preset: a name in :data:`PRESETS` (its model and recipe: steps, batch size, learning rate).
        steps: optimiser steps (default the preset's). minutes: a wall-clock budget instead (the
            schedule is laid out for ``steps``; training stops when the time is spent).
        batch_size, lr: default the preset's. seed: initialisation and training stream.
        out: folder to write ``model/`` and ``metrics.json`` into, or ``None``.
        eval_examples: held-out examples. progress: show a progress bar.

    Returns:
        :class:`LabResult`.
    """
    from tqdm.auto import tqdm

    import qkv
    from qkv.models.builders import build_encoder_decoder

    task = get_task(task) if isinstance(task, str) else task
    recipe = PRESETS.get(preset)
    if recipe is None:
        raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if minutes is not None and not minutes > 0:
        raise ValueError(f"minutes must be > 0, got {minutes!r}")
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder; choose another run folder")
    if out is not None and any(p.is_file() for p in Path(out).parents):
        raise ValueError(f"--out {out}: lies under a file; choose another run folder")
    steps = steps or recipe["steps"]
    batch_size, lr = batch_size or recipe["batch_size"], lr or recipe["lr"]
    config = config or preset_config(task, preset)
    torch.manual_seed(seed)
    model = build_encoder_decoder(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup))))
    t0, loss_v, done = time.perf_counter(), float("nan"), 0
    bar = tqdm(total=steps, disable=not progress, unit="step", dynamic_ncols=True, leave=False)
    for step in range(steps):
        if minutes is not None and time.perf_counter() - t0 > minutes * 60:
            break
        b = task.batch(step, batch_size, seed)
        loss = model(b.input_ids, b.attention_mask, labels=b.labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_v, done = float(loss.detach()), step + 1
        bar.update(1)
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss_v:.3f}")
    bar.close()
    wall = time.perf_counter() - t0
    em = evaluate(model, task, eval_examples)
    model.eval()
    result = LabResult(task.name, em, task.chance(), done, round(wall, 2), loss_v, eval_examples, seed,
                       None if out is None else str(Path(out) / "model"))
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        qkv.save(model, out / "model", tokenizer=task_tokenizer(task))
        tmp = out / "metrics.json.tmp"
        tmp.write_text(json.dumps({**asdict(result), "config": config.to_dict(), "batch_size": batch_size,
                                   "lr": lr, "task_options": dict(n_symbols=task.n_symbols, min_len=task.min_len,
                                                                  max_len=task.max_len)}, indent=2))
        tmp.replace(out / "metrics.json")
    result.model = model  # the trained model, for callers (not in metrics.json)
    return result
