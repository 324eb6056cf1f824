"""Pretraining: the data, the model and the objective — masked-LM (:class:`MaskedLMObjective`) or,
with ``objective="clm"``, next-token prediction (:class:`qkv.training.clm.CausalLMObjective`).

``pretrain(config)`` resolves the data (every input error raised here, before any training),
creates the run folder atomically, builds the model (or starts from ``--init-from``), and hands
it with a :class:`MaskedLMObjective` to the shared training engine (:mod:`qkv.training.engine`:
the loop, schedule, checkpoints, resume, bf16, threads, progress bar, metrics and curve).

The objective's batches are a pure function of their index — block order and masks are seeded
from ``(seed, index)`` — so a resumed run repeats the uninterrupted one bit for bit, and the loss
of a step is the mean over its masked tokens on all ranks and micro-batches.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from qkv.config import ModelConfig
from qkv.data.corpus import CorpusOptions
from qkv.data.masking import IGNORE_INDEX, MaskingConfig
from qkv.data.pipeline import DEFAULT_MASKING, prepare_pretraining_data
from qkv.models.builders import build_causal_lm, build_masked_lm
from qkv.models.footprint import check_fits
from qkv.training import distributed as qdist
from qkv.training.baselines import baseline_perplexities
from qkv.training.clm import CausalLMObjective, eval_block_indices
from qkv.training.config import TrainConfig, model_config_for
from qkv.training.engine import TrainingError, TrainResult, run_training
from qkv.training.fingerprint import check_data_fingerprints, data_fingerprints, new_run_id
from qkv.training.init_from import check_init_kind, load_for_pretraining
from qkv.training.lifecycle import RunFolder, resume_eval, run_session
from qkv.training.metrics import evaluate
from qkv.training.objective import save_final_model
from qkv.training.precision import resolve_precision
from qkv.training.rundir import RunError
import numpy as np

__all__ = ["pretrain", "PretrainResult", "TrainingError", "MaskedLMObjective"]

#: What :func:`pretrain` returns (the engine's result).
PretrainResult = TrainResult


class MaskedLMObjective:
    """Masked-token prediction: the loss is the mean cross-entropy over the masked tokens; held out,
    loss, perplexity and masked-token accuracy on fixed masks (:func:`qkv.training.metrics.evaluate`)."""

    metric, metric_label, loss_label = "accuracy", "masked-token accuracy", "MLM loss"

    def __init__(self, batches, eval_batches, device: torch.device, max_eval_batches: int):
        self.batches, self.eval_batches = batches, eval_batches
        self.device, self.max_eval_batches = device, max_eval_batches

    def batch(self, index: int):
        return self.batches.batch(index)

    def units(self, batch) -> torch.Tensor:
        return (batch.labels != IGNORE_INDEX).sum()

    def loss(self, model, batch) -> torch.Tensor:
        return model(batch.input_ids, batch.attention_mask, labels=batch.labels).loss

    def evaluate(self, model) -> dict:
        return evaluate(model, self.eval_batches, device=self.device, max_batches=self.max_eval_batches)

    def describe(self, ev: dict) -> str:
        return f"held-out loss {ev['eval_loss']:.4f}, accuracy {ev['accuracy']:.4f}"

    def save(self, model, out: Path) -> None:
        save_final_model(model, out)


def _model_config(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    if cfg.init_from is not None:
        mc = _initial_model(cfg).config
        if mc.vocab_size != vocab_size:
            raise ValueError(f"--init-from {cfg.init_from}: the model's vocab_size={mc.vocab_size} differs "
                             f"from its tokenizer's {vocab_size}; the folder's weights and tokenizer disagree")
        if mc.max_len < cfg.max_len:
            raise ValueError(f"max_len={cfg.max_len} exceeds the model's window ({mc.max_len}); "
                             f"use --max-len {mc.max_len} or less")
        return mc
    return model_config_for(cfg, vocab_size)


def _initial_model(cfg: TrainConfig):
    """The model ``cfg.init_from`` names, as a masked LM or (clm) a causal LM (``model`` overrides applied)."""
    return load_for_pretraining(cfg.init_from, objective=cfg.objective, **cfg.model)


def init_unigram_bias(model, tokens, vocab_size: int, *, max_tokens: int = 20_000_000) -> None:
    """Set the masked-LM output bias to ``log p(token)`` (add-one smoothed) over the training tokens."""
    counts = np.bincount(np.asarray(tokens[:max_tokens], dtype=np.int64), minlength=vocab_size)[:vocab_size]
    logp = np.log((counts + 1.0) / (counts.sum() + vocab_size))
    with torch.no_grad():
        model.head.bias.copy_(torch.from_numpy(logp - logp.mean()).to(model.head.bias.dtype))


def _prepare(cfg: TrainConfig, run: RunFolder, info: qdist.DistInfo):
    out, resume = run.out, run.resume
    tokenizer = cfg.init_from if cfg.init_from is not None else cfg.tokenizer
    if resume:
        meta = run.meta()
        run.check_config(cfg)  # a moved run is the same run
        tokenizer = str(out / "tokenizer.json")
    elif info.distributed and not info.is_main:
        torch.distributed.barrier()  # rank 0 trains the tokenizer and creates the run folder first
        tokenizer = str(out / "tokenizer.json")
    options = CorpusOptions(doc_sep=cfg.doc_sep, text_field=cfg.text_field, encoding_errors=cfg.encoding_errors,
                            max_doc_bytes=cfg.max_doc_bytes, long_docs=cfg.long_docs)
    data = prepare_pretraining_data(
        list(cfg.corpus), options=options, eval_corpus=list(cfg.eval_corpus) if cfg.eval_corpus else None,
        eval_fraction=cfg.eval_fraction, seed=cfg.seed, tokenizer=tokenizer, vocab_size=cfg.vocab_size,
        lowercase=cfg.lowercase, max_len=cfg.max_len, progress=cfg.progress and info.is_main)
    model_config = _model_config(cfg, data.tokenizer.vocab_size)
    if resume:
        check_data_fingerprints(meta, data, out)
        stored_mc = ModelConfig.from_dict(meta["model_config"])
        if stored_mc != model_config or meta["tokenizer"] != data.tokenizer.fingerprint():
            a, b = stored_mc.to_dict(), model_config.to_dict()
            lines = [f"{k}: {a[k]!r} → {b[k]!r}" for k in a if a[k] != b[k]]
            if meta["tokenizer"] != data.tokenizer.fingerprint():
                lines.append(f"tokenizer: {meta['tokenizer'][:12]} → {data.tokenizer.fingerprint()[:12]}")
            raise RunError(f"--resume: model or tokenizer differ from {out}: " + "; ".join(lines))
    elif info.is_main:
        meta = {"train_config": cfg.to_dict(), "model_config": model_config.to_dict(),
                "tokenizer": data.tokenizer.fingerprint(), "data": data.summary(), "run_id": new_run_id(),
                "fingerprints": data_fingerprints(data), "world_size": info.world_size}
        run.create(meta, write=data.tokenizer.save)
        if info.distributed:
            torch.distributed.barrier()
    return data, model_config


def pretrain(cfg: TrainConfig, *, resume: bool = False, on_backward=None,
             clock=time.monotonic) -> PretrainResult:
    """Run (or resume) masked-LM or causal-LM pretraining as ``cfg`` says; see the module docstring.

    ``on_backward``: optional ``f(step, model)``, called on every optimiser step (``step`` from 1)
    after the backward pass and before clipping — for measurements only (the ablation harness's
    early gradient norms); it must leave the weights, gradients and training mode as it found them.
    ``clock``: the monotonic time source of a time-budgeted run (tests pass a fake one).
    """
    if cfg.init_from is None and not resume:
        model_config_for(cfg)  # a block longer than the position table is refused before anything is written
    with run_session(cfg.device, cfg.out, resume=resume) as (info, run):
        if resume and (meta := run.finished(cfg)) is not None:
            return TrainResult(run.out, int(meta.get("steps_done", cfg.steps)), "complete", meta["final_eval"], None)
        if cfg.init_from is not None and not Path(cfg.init_from).is_dir():
            raise ValueError(f"--init-from {cfg.init_from}: not a folder; give a qkv run or model folder, or a "
                             "Hugging Face BERT folder")
        if cfg.init_from is not None and not resume and cfg.objective in ("mlm", "clm"):
            check_init_kind(cfg.init_from, cfg.objective)  # the model's kind before its tokenizer is asked for
        precision, note = resolve_precision(cfg.precision, info.device)
        if note and info.is_main:
            print(f"qkv pretrain: {note}", flush=True)
        if cfg.preset == "tiny" and cfg.init_from is None and not resume and info.is_main:
            print("qkv: warning: --preset tiny is a test-size model (24 wide, a 19-token window): it learns "
                  "little from real text; for a real run use --preset cpu-small (minutes on a CPU) or mini",
                  file=sys.stderr, flush=True)
        data, model_config = _prepare(cfg, run, info)
        batch_size = _batch_size(cfg, run, info)
        run.update(precision=precision)
        torch.manual_seed(cfg.seed)
        clm = cfg.objective == "clm"
        check_fits(lambda: (build_causal_lm if clm else build_masked_lm)(model_config),
                   hint="choose smaller --model sizes or --max-len")
        if cfg.init_from is not None:
            init = _initial_model(cfg)
            model = init.model
            if init.new_head and cfg.unigram_bias:
                init_unigram_bias(model, data.train_cache.tokens, model_config.vocab_size)
        elif clm:
            model = build_causal_lm(model_config)
        else:
            model = build_masked_lm(model_config)
            if cfg.unigram_bias:
                init_unigram_bias(model, data.train_cache.tokens, model_config.vocab_size)
        eval_bs = max(1, cfg.eval_batch_size // info.world_size)
        if clm:
            objective = _clm_objective(cfg, data, info, eval_bs, batch_size)
        else:
            objective = _mlm_objective(cfg, data, info, eval_bs, batch_size)
        return run_training(cfg, objective, model=model, run=run, info=info, precision=precision,
                            title=f"{cfg.preset} on {', '.join(cfg.corpus)}", clock=clock,
                            on_backward=on_backward, resume_eval=resume_eval)


def _batch_size(cfg: TrainConfig, run: RunFolder, info) -> int:
    """Blocks per process: ``cfg.batch_size``, or — a run continued on another number of processes
    than it started on — what keeps its global batch (and so the blocks and masks of every step)."""
    started = run.meta().get("world_size", info.world_size) if run.resume else info.world_size
    if started == info.world_size:
        return cfg.batch_size
    try:
        batch = qdist.per_process_batch(cfg.batch_size, started, info.world_size)
    except ValueError as e:
        raise RunError(f"--resume on {info.world_size} processes: {e}") from None
    if info.is_main:
        print(f"qkv pretrain: the run started on {started} processes with --batch-size {cfg.batch_size}; on "
              f"{info.world_size} it continues with {batch} blocks per process (the same global batch)", flush=True)
    return batch


def _mlm_objective(cfg: TrainConfig, data, info, eval_bs: int, batch_size: int) -> MaskedLMObjective:
    masking = MaskingConfig(cfg.select_rate, cfg.mask_rate, cfg.random_rate, cfg.whole_word)
    batches = data.train_batches(batch_size, masking=masking, seed=cfg.seed, rank=info.rank,
                                 world_size=info.world_size)
    # a global eval batch of eval_batch_size, so the held-out sample does not depend on the world
    # size; always BERT's fixed 15 % token masks, so runs with other training masks compare
    eval_batches = data.eval_batches(eval_bs, masking=DEFAULT_MASKING, rank=info.rank,
                                     world_size=info.world_size)
    return MaskedLMObjective(batches, eval_batches, info.device, cfg.eval_batches)


def _clm_objective(cfg: TrainConfig, data, info, eval_bs: int, batch_size: int):
    """Next-token batches, held-out batches, and the count baselines of exactly the held-out blocks
    an evaluation reads (the first ``eval_batches`` global batches)."""
    batches = data.clm_train_batches(batch_size, seed=cfg.seed, rank=info.rank, world_size=info.world_size)
    eval_batches = data.clm_eval_batches(eval_bs, rank=info.rank, world_size=info.world_size)
    indices = eval_block_indices(len(data.eval), cfg.eval_batches, eval_bs * info.world_size)
    baselines = baseline_perplexities(data.train, data.eval, indices, data.tokenizer.vocab_size)
    return CausalLMObjective(batches, eval_batches, info.device, cfg.eval_batches, baselines)
