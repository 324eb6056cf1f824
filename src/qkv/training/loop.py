"""Masked-language-model pretraining: the explicit loop, in one function.

``pretrain(config)`` resolves the data (every input error raised here, before any training),
creates the run folder atomically, builds the model, then runs

    for step in range(start, steps):
        micro-batches → forward → loss normalised by the global masked-token count → backward
        clip → AdamW step → schedule step → log → (evaluate) → (checkpoint)

Everything random is seeded from ``(seed, step)`` — block order, masks, dropout — so a run
resumed from a checkpoint repeats the uninterrupted run bit for bit, and K processes with batch b
compute what one process with batch K·b computes (the loss is normalised by the masked-token
count over all ranks and micro-batches, not per rank).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from qkv.config import ModelConfig
from qkv.data.corpus import CorpusOptions
from qkv.data.masking import IGNORE_INDEX, MaskingConfig
from qkv.data.pipeline import DEFAULT_MASKING, prepare_pretraining_data
from qkv.errors import QkvError
from qkv.models.builders import build_masked_lm
from qkv.training import distributed as qdist
from qkv.training.budget import BudgetClock, TimedScheduler
from qkv.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from qkv.training.config import TrainConfig
from qkv.training.finalise import finished_result, resume_eval
from qkv.training.fingerprint import check_data_fingerprints, data_fingerprints, new_run_id
from qkv.training.init_from import load_for_pretraining
from qkv.training.lock import acquire, release
from qkv.training.metrics import append_metrics, evaluate, plot_curve
from qkv.training.optim import build_optimizer, build_scheduler
from qkv.training.precision import autocast, resolve_precision
from qkv.training.rundir import RunError, check_out_dir, create_run_dir, read_run, truncate_metrics, update_run
from qkv.training.stop import StepAbandoned
from qkv.training.stop import StopFlag as _StopFlag

__all__ = ["pretrain", "PretrainResult", "TrainingError"]


class TrainingError(QkvError, RuntimeError):
    """Training stopped (e.g. a non-finite loss); the last good checkpoint is kept."""


@dataclass
class PretrainResult:
    """What a finished (or interrupted) run reports."""

    out: Path
    steps_done: int
    status: str  # "complete" or "interrupted"
    final_eval: dict | None
    train_loss: float | None


def _seed_for(seed: int, step: int, micro: int, rank: int) -> int:
    return (seed * 1_000_003 + step * 1009 + micro * 31 + rank * 7919) % (2**63 - 1)


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
    overrides = dict(cfg.model)
    overrides.setdefault("vocab_size", vocab_size)
    if overrides["vocab_size"] != vocab_size:
        raise ValueError(f"model vocab_size={overrides['vocab_size']} differs from the tokenizer's {vocab_size}")
    mc = ModelConfig.preset(cfg.preset, **overrides)
    if mc.max_len < cfg.max_len:
        raise ValueError(f"max_len={cfg.max_len} exceeds the model's position table ({mc.max_len})")
    return mc


def _initial_model(cfg: TrainConfig):
    """The model ``cfg.init_from`` names, as a masked LM (``model`` overrides applied)."""
    return load_for_pretraining(cfg.init_from, **cfg.model)


def init_unigram_bias(model, tokens, vocab_size: int, *, max_tokens: int = 20_000_000) -> None:
    """Set the masked-LM output bias to ``log p(token)`` (add-one smoothed) over the training tokens."""
    import numpy as np

    counts = np.bincount(np.asarray(tokens[:max_tokens], dtype=np.int64), minlength=vocab_size)[:vocab_size]
    logp = np.log((counts + 1.0) / (counts.sum() + vocab_size))
    with torch.no_grad():
        model.head.bias.copy_(torch.from_numpy(logp - logp.mean()).to(model.head.bias.dtype))


def _prepare(cfg: TrainConfig, resume: bool, info: qdist.DistInfo):
    out = Path(cfg.out)
    tokenizer = cfg.init_from if cfg.init_from is not None else cfg.tokenizer
    if resume:
        meta = read_run(out)
        stored = TrainConfig.from_dict({**meta["train_config"], "out": cfg.out})  # a moved run is the same run
        diff = stored.diff(cfg)
        if diff:
            raise RunError(f"--resume: {out} was started with a different configuration:\n  " + "\n  ".join(diff))
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
            raise RunError(f"--resume: model or tokenizer differ from {out}:\n  " + "\n  ".join(lines))
    elif info.is_main:
        meta = {"format": "qkv-run", "status": "running", "train_config": cfg.to_dict(),
                "model_config": model_config.to_dict(), "tokenizer": data.tokenizer.fingerprint(),
                "data": data.summary(), "run_id": new_run_id(), "fingerprints": data_fingerprints(data)}
        create_run_dir(out, meta, data.tokenizer)
        if info.distributed:
            torch.distributed.barrier()
    return data, model_config


def _train_step(model, ddp, batches, step, cfg, info, optimizer, scheduler, on_backward=None,
                precision="fp32"):
    micro = [batches.batch(step * cfg.grad_accum + m).to(info.device) for m in range(cfg.grad_accum)]
    counts = [(b.labels != IGNORE_INDEX).sum() for b in micro]
    n_global = qdist.all_sum(torch.stack(counts).sum().double().cpu()).item()
    loss_sum = torch.zeros((), dtype=torch.float64)
    for m, b in enumerate(micro):
        torch.manual_seed(_seed_for(cfg.seed, step, m, info.rank))  # dropout
        sync = contextlib.nullcontext() if (not info.distributed or m == cfg.grad_accum - 1) else ddp.no_sync()
        with sync:
            with autocast(precision, info.device):
                out = ddp(b.input_ids, b.attention_mask, labels=b.labels)
            n = counts[m].item()
            # DDP averages gradients over ranks: scale so the sum is the global token mean
            (out.loss.float() * (n * info.world_size / max(n_global, 1.0))).backward()
        loss_sum += out.loss.detach().double().cpu() * n
    if on_backward is not None:
        on_backward(step + 1, model)
    loss = (qdist.all_sum(loss_sum) / max(n_global, 1.0)).item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm).item()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    tokens = qdist.all_sum(sum(b.attention_mask.sum() for b in micro).double().cpu()).item()
    return loss, grad_norm, tokens


def pretrain(cfg: TrainConfig, *, resume: bool = False, on_backward=None,
             clock=time.monotonic) -> PretrainResult:
    """Run (or resume) masked-LM pretraining as ``cfg`` says; see the module docstring.

    ``on_backward``: optional ``f(step, model)``, called on every optimiser step (``step`` from 1)
    after the backward pass and before clipping — for measurements only (the ablation harness's
    early gradient norms); it must leave the weights, gradients and training mode as it found them.
    ``clock``: the monotonic time source of a time-budgeted run (tests pass a fake one).
    """
    info = qdist.setup(cfg.device)
    out = Path(cfg.out)
    try:
        if info.is_main:
            check_out_dir(out, resume=resume)
            if resume:
                acquire(out)
        if resume and (done := finished_result(out, cfg)) is not None:
            return done
        if cfg.init_from is not None and not Path(cfg.init_from).is_dir():
            raise ValueError(f"--init-from {cfg.init_from}: not a folder; give a qkv run or model folder, or a "
                             "Hugging Face BERT folder")
        precision, note = resolve_precision(cfg.precision, info.device)
        if note and info.is_main:
            print(f"qkv pretrain: {note}", flush=True)
        data, model_config = _prepare(cfg, resume, info)
        if info.is_main:
            update_run(out, precision=precision)
        torch.manual_seed(cfg.seed)
        if cfg.init_from is not None:
            init = _initial_model(cfg)
            model = init.model
            if init.new_head and cfg.unigram_bias:
                init_unigram_bias(model, data.train_cache.tokens, model_config.vocab_size)
        else:
            model = build_masked_lm(model_config)
            if cfg.unigram_bias:
                init_unigram_bias(model, data.train_cache.tokens, model_config.vocab_size)
        model = model.to(info.device).train()
        ddp = model
        if info.distributed:
            ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[info.device] if info.device.type == "cuda" else None)
        optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    position_lr_scale=cfg.position_lr_scale)
        budget = BudgetClock(cfg.time_budget * 60, clock=clock) if cfg.time_budget is not None else None
        if budget is not None:
            scheduler = TimedScheduler(optimizer, budget, warmup_steps=cfg.warmup_steps, schedule=cfg.schedule)
        else:
            scheduler = build_scheduler(optimizer, warmup_steps=cfg.warmup_steps, total_steps=cfg.steps,
                                        schedule=cfg.schedule)
        start, elapsed, state = 0, 0.0, {}
        ckpt = latest_checkpoint(out) if resume else None
        if ckpt is not None:
            # a time-budgeted run has no step limit to check a checkpoint's step against
            state = load_checkpoint(ckpt, model=model, optimizer=optimizer, scheduler=scheduler,
                                    run_id=read_run(out).get("run_id"),
                                    max_step=cfg.steps if budget is None else None)
            start, elapsed = state["step"], float(state.get("elapsed_s", 0.0))
        if budget is not None:
            budget = scheduler.clock = BudgetClock(cfg.time_budget * 60, elapsed_s=elapsed, clock=clock)
        if info.is_main:
            truncate_metrics(out, start)
        masking = MaskingConfig(cfg.select_rate, cfg.mask_rate, cfg.random_rate, cfg.whole_word)
        batches = data.train_batches(cfg.batch_size, masking=masking, seed=cfg.seed, rank=info.rank,
                                     world_size=info.world_size)
        # a global eval batch of eval_batch_size, so the held-out sample does not depend on the world
        # size; always BERT's fixed 15 % token masks, so runs with other training masks compare
        eval_bs = max(1, cfg.eval_batch_size // info.world_size)
        eval_batches = data.eval_batches(eval_bs, masking=DEFAULT_MASKING, rank=info.rank,
                                         world_size=info.world_size)
        run = _Run(cfg, info, out, model, ddp, optimizer, scheduler, batches, eval_batches, precision,
                   budget, elapsed, clock, on_backward)
        return _loop(run, start, resume_eval(state))
    finally:
        if info.is_main:
            release(out)
        qdist.teardown()


@dataclass
class _Run:
    cfg: TrainConfig
    info: qdist.DistInfo
    out: Path
    model: torch.nn.Module
    ddp: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    batches: object
    eval_batches: object
    precision: str
    budget: BudgetClock | None
    elapsed0: float
    clock: object
    on_backward: object


def _loop(run: _Run, start: int, last_eval: dict | None = None) -> PretrainResult:
    from tqdm.auto import tqdm

    cfg, info, out, model = run.cfg, run.info, run.out, run.model
    metrics_path = out / "metrics.jsonl"
    timed = run.budget is not None
    # a time-budgeted run's clock doubles as the elapsed-time counter of a step run
    clock = run.budget or BudgetClock(1.0, elapsed_s=run.elapsed0, clock=run.clock)
    if timed:
        bar = tqdm(total=round(run.budget.budget_s), initial=min(round(run.elapsed0), round(run.budget.budget_s)),
                   disable=not (cfg.progress and info.is_main), unit="s", dynamic_ncols=True)
    else:
        bar = tqdm(total=cfg.steps, initial=start, disable=not (cfg.progress and info.is_main), unit="step",
                   dynamic_ncols=True)
    final_eval, loss, status, done = last_eval, None, "complete", start
    window_tokens, window_start = 0.0, time.perf_counter()

    def checkpoint(step_done: int) -> None:
        if info.is_main:
            save_checkpoint(out, step=step_done, model=model, optimizer=run.optimizer, scheduler=run.scheduler,
                            trainer_state={"seed": cfg.seed, "data_position": step_done * cfg.grad_accum,
                                           "elapsed_s": clock.elapsed_s, "run_id": read_run(out).get("run_id"),
                                           "last_eval": final_eval})

    def progress() -> float:
        # every rank trains at the same learning rate and stops at the same step: rank 0's clock decides
        p = torch.tensor(run.budget.progress(), dtype=torch.float64)
        if info.distributed:
            torch.distributed.broadcast(p, 0)
        return p.item()

    governor, threads0 = None, torch.get_num_threads()
    if cfg.threads == "adaptive":
        from qkv.training.threads import ThreadGovernor

        governor = ThreadGovernor()
    elif isinstance(cfg.threads, int):
        torch.set_num_threads(cfg.threads)
    clock.start()
    with _StopFlag(allow_abandon=not info.distributed) as stop:
        run.optimizer.register_step_pre_hook(stop.critical)  # a stop request abandons a step only before this
        while True:
            if timed:
                p = progress()
                if p >= 1.0:
                    break
                run.scheduler.set_lr(p)
            elif done >= cfg.steps:
                break
            lr = run.scheduler.get_last_lr()[0]
            t_step = time.perf_counter()
            try:
                stop.abandonable = True
                loss, grad_norm, tokens = _train_step(model, run.ddp, run.batches, done, cfg, info, run.optimizer,
                                                      run.scheduler, run.on_backward, run.precision)
            except StepAbandoned:  # stopped inside gradient accumulation: keep the steps completed
                run.optimizer.zero_grad(set_to_none=True)
                if done > start or latest_checkpoint(out) is None:
                    checkpoint(done)
                status = "interrupted"
                break
            if governor is not None:
                governor.record(time.perf_counter() - t_step)
            done += 1
            if not torch.isfinite(torch.tensor(loss)):
                last = latest_checkpoint(out)
                raise TrainingError(f"non-finite loss ({loss}) at step {done}; stopped without saving. "
                                    f"Last good checkpoint: {last or 'none'}. Lower --lr or raise --warmup-steps.")
            window_tokens += tokens
            last_step = not timed and done == cfg.steps
            if done % cfg.log_every == 0 or last_step:
                elapsed = time.perf_counter() - window_start
                tps = window_tokens / max(elapsed, 1e-9)
                window_tokens, window_start = 0.0, time.perf_counter()
                if info.is_main:
                    append_metrics(metrics_path, {"step": done, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                                                  "tokens_per_s": tps, "elapsed_s": round(clock.elapsed_s, 3),
                                                  **({"threads": governor.current} if governor else {})})
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tps:,.0f}", **({"step": done} if timed else {}))
            if timed:
                second = min(int(clock.elapsed_s), bar.total)
                if second > bar.n:  # at most one refresh a second
                    bar.update(second - bar.n)
            else:
                bar.update(1)
            if done % cfg.eval_every == 0 or last_step:
                final_eval = _evaluate(run, metrics_path, done, clock, bar)
            stopping = bool(qdist.all_sum(torch.tensor(float(stop.hit))).item())
            if done % cfg.save_every == 0 or last_step or stopping:
                checkpoint(done)
            if stopping and not last_step:
                status = "interrupted"
                break
        if timed and status == "complete":
            # the deadline: a last evaluation (unless this step had one) and checkpoint
            if done % cfg.eval_every != 0:
                final_eval = _evaluate(run, metrics_path, done, clock, bar)
            if done % cfg.save_every != 0:
                checkpoint(done)
    bar.close()
    torch.set_num_threads(threads0)
    if status == "complete" and final_eval is None:  # finalising a run whose last evaluation was lost
        final_eval = evaluate(model, run.eval_batches, device=info.device, max_batches=cfg.eval_batches)
    if info.is_main:
        plot_curve(metrics_path, out / "curve.png", title=f"{cfg.preset} on {', '.join(cfg.corpus)}",
                   x="minutes" if timed else "step")
        if status == "complete":
            from qkv.models.io import save

            tok = read_tokenizer_backend(out)
            save(model, out, tokenizer=tok)
        update_run(out, status=status, steps_done=done, final_eval=final_eval,
                   **({"elapsed_s": round(clock.elapsed_s, 3)} if timed else {}))
    return PretrainResult(out, done, status, final_eval, loss)


def _evaluate(run: _Run, metrics_path: Path, done: int, clock: BudgetClock, bar) -> dict:
    ev = evaluate(run.model, run.eval_batches, device=run.info.device, max_batches=run.cfg.eval_batches)
    if run.info.is_main:
        append_metrics(metrics_path, {"step": done, **ev, "elapsed_s": round(clock.elapsed_s, 3)})
        bar.write(f"step {done}: held-out loss {ev['eval_loss']:.4f}, accuracy {ev['accuracy']:.4f}")
    return ev


def read_tokenizer_backend(out: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(out / "tokenizer.json"))
