"""Train a translation model on verse pairs (or any pairs) with the training engine.

:func:`train_translation` learns a shared subword vocabulary from both sides of the training pairs
(:func:`~qkv.translation.subwords.train_subwords`), builds an encoder–decoder from a preset
(:data:`PRESETS`: one token table for both languages, tied to the output layer), and optimises the
:class:`~qkv.translation.objective.TranslationObjective` with
:func:`qkv.training.engine.run_training` (AdamW, betas (0.9, 0.98), linear warm-up then linear decay
to zero at the last step or the time budget's deadline, gradients clipped at 1; fp32 or bf16).
Held out: BLEU of greedy translations of the first ``eval_pairs`` validation pairs.

Without ``out`` the run is in memory. With ``out`` it is a run folder (:mod:`qkv.training.lifecycle`:
``run.json``, ``tokenizer.json``, ``metrics.jsonl``, ``curve.png``, checkpoints, ``resume=True``)
that ends with ``out/model``, a qkv model folder with its tokenizer (``qkv translate out/model …``).

Under ``torchrun --nproc-per-node K`` (a run folder is needed) the K processes train data-parallel
through the engine's strategies (:mod:`qkv.training.strategy`, ``ddp`` or ``fsdp``): rank 0 learns the
subwords and creates the folder, the others read its tokenizer; each optimiser step takes
``batches_per_step`` token-budget batches of the one sequence of batches, ``batches_per_step / K``
on each rank (:class:`~qkv.translation.objective.TranslationObjective`), so the run computes what
one process accumulating ``batches_per_step`` batches computes. A resumed run keeps its
``batches_per_step`` on any number of processes that divides it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from qkv.config import ModelConfig
from qkv.data.bible import bible_pairs
from qkv.models.builders import build_encoder_decoder
from qkv.training.config import LoopConfig, RunConfig
from qkv.training import distributed as qdist
from qkv.training.engine import TrainResult, run_training
from qkv.training.lifecycle import resume_eval, run_session
from qkv.training.rundir import RunError
from qkv.training.precision import PRECISIONS, resolve_precision
from qkv.translation.baselines import parse_direction
from qkv.translation.errors import TranslationError
from qkv.translation.objective import TranslationBatches, TranslationObjective, encode_side
from qkv.translation.subwords import BOS, EOS, PAD, train_subwords
from qkv.validation import check_choice, check_positive

__all__ = ["PRESETS", "TranslationRunConfig", "TranslationRun", "train_translation", "preset_config"]

#: Model and recipe presets. ``small``: the recipe chosen by the sweep of docs/translation.md (2 + 2 layers,
#: token embeddings scaled by √C, lr 2e-3); ``base``: 3 + 3 layers; ``tiny``: tests.
PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(model=dict(d_model=256, n_heads=4, d_ff=1024, n_layers=3, max_len=128, position="sinusoidal",
                            norm="pre", dropout=0.1, embed_scale=True),
                 vocab_size=8000, batch_tokens=1536, lr=1e-3, warmup=100, smoothing=0.1, steps=4000),
    "small": dict(model=dict(d_model=256, n_heads=4, d_ff=1024, n_layers=2, max_len=128, position="sinusoidal",
                             norm="pre", dropout=0.1, embed_scale=True),
                  vocab_size=8000, batch_tokens=1536, lr=2e-3, warmup=100, smoothing=0.1, steps=4000),
    "tiny": dict(model=dict(d_model=64, n_heads=4, d_ff=128, n_layers=1, max_len=48, position="sinusoidal",
                            norm="pre", dropout=0.0), vocab_size=120, batch_tokens=256, lr=3e-3, warmup=10,
                 smoothing=0.0, steps=200),
}


def preset_config(preset: str, vocab_size: int) -> ModelConfig:
    """The :class:`ModelConfig` of ``preset`` for a shared vocabulary of ``vocab_size``."""
    check_choice("preset", preset, tuple(PRESETS))
    fields = dict(PRESETS[preset]["model"])
    return ModelConfig.from_flat(vocab_size=vocab_size, type_vocab_size=0, pad_token_id=PAD, layer_norm_eps=1e-5,
                                 decoder=dict(start_token_id=BOS, eos_token_id=EOS), **fields)


@dataclass(frozen=True)
class TranslationRunConfig(RunConfig):
    """What a run depends on — stored in ``run.json``; ``resume`` refuses a different one."""

    direction: str
    data: str
    preset: str
    vocab_size: int
    steps: int
    time_budget: float | None
    batch_tokens: int
    lr: float
    warmup: int
    smoothing: float
    seed: int
    eval_pairs: int
    eval_every: int | None
    precision: str
    #: token-budget batches per optimiser step, over all processes (runs from before torchrun: 1)
    batches_per_step: int = 1
    strategy: str = "ddp"

    def tokens_per_example(self, model: ModelConfig | None = None) -> None:
        """``None``: a batch is a token budget (``batch_tokens``) of pairs whose lengths vary."""
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TranslationRun:
    """What :func:`train_translation` returns: the trained ``model``, its ``tokenizer``, the
    engine's :class:`~qkv.training.engine.TrainResult`, the pairs trained on and left out (longer
    than the window), and the run folder (or ``None``)."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    result: TrainResult
    pairs: int
    left_out: int
    out: Path | None


def _pairs(pairs, what: str) -> list[tuple[str, str]]:
    out = [(p.source, p.target) if hasattr(p, "source") else tuple(p) for p in pairs]
    if not out:
        raise TranslationError(f"no {what} pairs; give at least one (source, target) pair")
    return out


def train_translation(direction: str = "en-es", *, preset: str = "small", steps: int | None = None,
                      time_budget: float | None = None, out: str | Path | None = None, resume: bool = False,
                      train_pairs: Sequence | None = None, held_out: Sequence | None = None, eval_pairs: int = 200,
                      eval_every: int | None = None, seed: int = 0, precision: str = "fp32", progress: bool = True,
                      threads: int | str | None = None, clock: Callable[[], float] = time.monotonic,
                      grad_accum: int = 1, strategy: str = "ddp", **recipe) -> TranslationRun:
    """Train an encoder–decoder to translate (see the module docstring).

    Args:
        direction: ``en-es`` or ``es-en`` (the Bible pairs' direction; a label with given pairs).
        preset: a name in :data:`PRESETS`; ``recipe`` overrides its ``vocab_size``, ``batch_tokens``,
            ``lr``, ``warmup``, ``smoothing``.
        steps, time_budget: optimiser steps, or minutes of training (the schedule ends at the deadline).
        out, resume: the run folder, and whether to continue it.
        train_pairs, held_out: pairs (``(source, target)`` or :class:`~qkv.data.pairs.Pair`) instead of
            the Bible's ``train`` and ``validation`` splits.
        eval_pairs: held-out pairs translated at each evaluation (the first ones).
        eval_every: steps between evaluations (``None``: at the end only).
        seed, precision, progress, clock: as for every run of the engine.
        threads: intra-op CPU threads (``"adaptive"``, with a time budget: one thread or all, by
            measured step time — for a machine shared with other jobs); not part of the run's
            configuration (a resumed run may change it).
        grad_accum: batches each process accumulates per optimiser step (the run's
            ``batches_per_step`` is ``grad_accum`` × the number of processes; a resumed run keeps
            its own and ignores this).
        strategy: under torchrun, ``ddp`` or ``fsdp`` (:mod:`qkv.training.strategy`).

    Raises:
        TranslationError: no pairs, a bad direction. ValueError: a bad option; torchrun without
            ``out``. RunError: a resumed run's batches per step do not split over the processes.
        DatasetNotInstalledError: the Bible packages are missing.
    """
    source, target = parse_direction(direction)
    check_choice("precision", precision, PRECISIONS)
    check_positive("time_budget", time_budget, unit=" of minutes (e.g. 30)", optional=True)
    if threads is not None and threads != "adaptive" and (isinstance(threads, bool) or not isinstance(threads, int)
                                                          or threads < 1):
        raise ValueError(f"threads={threads!r} must be a number ≥ 1 or 'adaptive'")
    if threads == "adaptive" and time_budget is None:
        raise ValueError("threads='adaptive' needs a time_budget (a step-count run keeps a fixed thread count)")
    if isinstance(grad_accum, bool) or not isinstance(grad_accum, int) or grad_accum < 1:
        raise ValueError(f"grad_accum={grad_accum!r} must be an int ≥ 1 (batches per process and step)")
    check_choice("strategy", strategy, qdist.STRATEGIES)
    unknown = sorted(set(recipe) - {"vocab_size", "batch_tokens", "lr", "warmup", "smoothing"})
    if unknown:
        raise ValueError(f"unknown recipe option(s) {unknown}; allowed: vocab_size, batch_tokens, lr, warmup, "
                         "smoothing")
    check_choice("preset", preset, tuple(PRESETS))
    r = {**PRESETS[preset], **recipe}
    data = "given pairs" if train_pairs is not None else f"dataset:bible-{direction}"
    train = _pairs(train_pairs if train_pairs is not None else bible_pairs(source, target, "train"), "training")
    held = _pairs(held_out if held_out is not None else bible_pairs(source, target, "validation"),
                  "held-out")[:eval_pairs]
    cfg = TranslationRunConfig(direction, data, preset, r["vocab_size"], steps or r["steps"], time_budget,
                               r["batch_tokens"], r["lr"], r["warmup"], r["smoothing"], seed, len(held), eval_every,
                               precision, grad_accum, strategy)
    if out is None:
        qdist.refuse_world("translation training under torchrun writes a run folder: give out (--out)")
        if resume:
            raise ValueError("resume=True continues the run in a folder: give out")
        return _train(cfg, train, held, None, None, progress, clock, threads)
    with run_session("cpu", out, resume=resume) as (info, run):
        if resume:
            stored = run.meta()["train_config"].get("batches_per_step", 1)
            cfg = cfg.replace(batches_per_step=stored)
            run.check_config(cfg)
            if stored % info.world_size:  # the batches per step stay those the run started with
                raise RunError(f"--resume on {info.world_size} processes: the run takes {stored} batch(es) per "
                               f"step, which do not split over {info.world_size} processes; continue it on a "
                               "number of processes that divides it")
        else:
            cfg = cfg.replace(batches_per_step=grad_accum * info.world_size)
        return _train(cfg, train, held, run, info, progress, clock, threads)


def _tokenizer(cfg: TranslationRunConfig, train: list, run, info) -> Tokenizer:
    """The run's subwords: learned (by rank 0 of a new run), or read from the run folder."""
    if run is not None and (run.resume or not info.is_main):
        if not run.resume:
            torch.distributed.barrier()  # rank 0 learns the subwords and creates the run folder first
        return Tokenizer.from_file(str(run.out / "tokenizer.json"))
    return train_subwords([t for pair in train for t in pair], vocab_size=cfg.vocab_size)


def _train(cfg: TranslationRunConfig, train: list, held: list, run, info, progress: bool, clock,
           threads) -> TranslationRun:
    info = info or qdist.DistInfo(0, 1, 0, torch.device("cpu"))
    progress = progress and info.is_main
    used, note = resolve_precision(cfg.precision)
    if note and progress:
        print(f"qkv translation: {note}", flush=True)
    tokenizer = _tokenizer(cfg, train, run, info)
    model_cfg = preset_config(cfg.preset, tokenizer.get_vocab_size())
    if run is not None and not run.resume and info.is_main:
        run.create({"kind": "translation", "train_config": cfg.to_dict(), "precision": used,
                    "model_config": model_cfg.to_dict(), "world_size": info.world_size},
                   write=lambda tmp: tokenizer.save(str(tmp / "tokenizer.json")))
        if info.distributed:
            torch.distributed.barrier()
    batches = TranslationBatches(encode_side(tokenizer, [s for s, _ in train]),
                                 encode_side(tokenizer, [t for _, t in train]), batch_tokens=cfg.batch_tokens,
                                 max_len=model_cfg.max_len, seed=cfg.seed)
    if progress:
        print(f"qkv translation: {batches.pairs} training pairs in {len(batches)} batches "
              f"({batches.left_out} longer than the window of {model_cfg.max_len} tokens left out), "
              f"vocabulary {tokenizer.get_vocab_size()}"
              + (f"; {info.world_size} processes" if info.distributed else ""), flush=True)
    torch.manual_seed(cfg.seed)
    model = build_encoder_decoder(model_cfg)
    loop = LoopConfig(steps=cfg.steps if cfg.time_budget is None else None, time_budget=cfg.time_budget, lr=cfg.lr,
                      weight_decay=0.01, betas=(0.9, 0.98), eps=1e-8, warmup_steps=cfg.warmup, clip_norm=1.0,
                      seed=cfg.seed, eval_every=cfg.eval_every, log_every=10, progress=progress,
                      threads=threads, grad_accum=cfg.batches_per_step // info.world_size, strategy=cfg.strategy,
                      save_every=(cfg.eval_every or 500) if run is not None else None)
    objective = TranslationObjective(batches, tokenizer, held, smoothing=cfg.smoothing, rank=info.rank,
                                     world_size=info.world_size)
    result = run_training(loop, objective, model=model, run=run, info=info, precision=used,
                          title=f"translation {cfg.direction}", clock=clock, resume_eval=resume_eval)
    model.eval()
    return TranslationRun(model, tokenizer, result, batches.pairs, batches.left_out,
                          None if run is None else run.out)
