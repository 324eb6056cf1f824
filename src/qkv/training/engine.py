"""The training engine shared by pretraining and fine-tuning: one explicit loop, one home.

    for step in range(start, steps):           (or: until the time budget is spent)
        micro-batches → forward → loss normalised by the global unit count → backward
        clip → AdamW step → schedule step → log → (evaluate) → (checkpoint)

What is trained on and how it is scored is an :class:`Objective` (masked-LM pretraining in
:mod:`qkv.training.loop`, task heads in :mod:`qkv.finetune.run`); everything else lives here:
the optimiser and schedule (by steps or by a time budget), checkpoints and ``--resume``, bf16
autocast, adaptive threads, the progress bar, the metrics log and its curve, stop requests
(Ctrl-C / SIGTERM save a checkpoint), and the final model written into the run folder.

Every random draw of a step is seeded from ``(seed, step, micro-batch, rank)`` and every batch is a
pure function of its index, so a run resumed from a checkpoint repeats the uninterrupted run bit
for bit, and K processes with batch b compute what one process with batch K·b computes (the loss
is normalised by the unit count — masked tokens, examples, labelled tokens — over all ranks and
micro-batches, not per rank).

The loop reads these fields of its configuration (both :class:`~qkv.training.config.TrainConfig`
and :class:`~qkv.finetune.config.FinetuneConfig` have them): ``steps``, ``time_budget``,
``grad_accum``, ``lr``, ``weight_decay``, ``warmup_steps``, ``schedule``, ``clip_norm``, ``seed``,
``eval_every``, ``save_every``, ``log_every``, ``threads``, ``progress``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from qkv.errors import QkvError
from qkv.training import distributed as qdist
from qkv.training.budget import BudgetClock, TimedScheduler
from qkv.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from qkv.training.metrics import append_metrics, plot_curve
from qkv.training.optim import build_optimizer, build_scheduler
from qkv.training.precision import autocast
from qkv.training.rundir import read_run, truncate_metrics, update_run
from qkv.training.stop import StepAbandoned
from qkv.training.stop import StopFlag as _StopFlag

__all__ = ["Objective", "TrainResult", "TrainingError", "run_training", "run_session", "save_final_model",
           "seed_for"]


class TrainingError(QkvError, RuntimeError):
    """Training stopped (e.g. a non-finite loss); the last good checkpoint is kept."""


@dataclass
class TrainResult:
    """What a finished (or interrupted) run reports."""

    out: Path
    steps_done: int
    status: str  # "complete" or "interrupted"
    final_eval: dict | None
    train_loss: float | None


class Objective(Protocol):
    """What a training run learns and how it is scored.

    ``batch(i)`` is micro-batch ``i`` of this rank (a pure function of ``i``: resumption depends
    on it); a batch has ``.to(device)``, ``input_ids`` and ``attention_mask``. ``units(b)`` is the
    number of things the loss averages over (masked tokens, examples, labelled tokens) as a 0-d
    tensor; ``loss(model, b)`` their mean loss. ``evaluate(model)`` returns the held-out figures
    (``eval_loss`` and :attr:`metric` among them; all ranks together), ``describe(ev)`` one line of
    them. ``save(model, out)`` writes the final model into the run folder.
    """

    metric: str  # the held-out figure drawn on the curve beside the loss (e.g. "accuracy")
    metric_label: str
    loss_label: str

    def batch(self, index: int) -> Any: ...
    def units(self, batch: Any) -> torch.Tensor: ...
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor: ...
    def evaluate(self, model: torch.nn.Module) -> dict: ...
    def describe(self, ev: dict) -> str: ...
    def save(self, model: torch.nn.Module, out: Path) -> None: ...


def save_final_model(model: torch.nn.Module, out: Path) -> None:
    """Write the trained ``model`` into run folder ``out`` with the run's tokenizer, so that
    ``qkv.load(out)`` loads it (what an objective's ``save`` usually is)."""
    from qkv.data.tokenizer_facade import read_tokenizer
    from qkv.models.io import save

    save(model, out, tokenizer=read_tokenizer(Path(out) / "tokenizer.json"))


@contextlib.contextmanager
def run_session(device: str, out: Path, *, resume: bool):
    """``(dist info, run folder)`` for one run: processes set up (``torchrun`` or one), the folder
    checked (a new run needs a free ``out``; ``--resume`` one holding a run, which it locks), and on
    leaving the lock released and the process group torn down — whatever happened."""
    from qkv.training.lock import acquire, release
    from qkv.training.rundir import check_out_dir

    info = qdist.setup(device)
    out = Path(out)
    try:
        if info.is_main:
            check_out_dir(out, resume=resume)
            if resume:
                acquire(out)
        yield info, out
    finally:
        if info.is_main:
            release(out)
        qdist.teardown()


def seed_for(seed: int, step: int, micro: int, rank: int) -> int:
    """The seed of micro-batch ``micro`` of optimiser step ``step`` on ``rank`` (dropout)."""
    return (seed * 1_000_003 + step * 1009 + micro * 31 + rank * 7919) % (2**63 - 1)


@dataclass
class _Run:
    cfg: Any
    info: qdist.DistInfo
    out: Path
    model: torch.nn.Module
    ddp: torch.nn.Module
    objective: Objective
    optimizer: torch.optim.Optimizer
    scheduler: object
    precision: str
    budget: BudgetClock | None
    elapsed0: float
    clock: object
    on_backward: object
    title: str


def run_training(cfg, objective: Objective, *, model: torch.nn.Module, info: qdist.DistInfo, out: Path,
                 precision: str, resume: bool, title: str, clock=time.monotonic, on_backward=None,
                 position_lr_scale: float = 1.0, resume_eval=None) -> TrainResult:
    """Optimise ``model`` for ``objective`` as ``cfg`` says, in run folder ``out`` (which exists).

    With ``resume``, the run continues from its latest checkpoint (model, optimiser, schedule,
    elapsed time). ``on_backward``: optional ``f(step, model)`` called on every optimiser step after
    the backward pass, before clipping — for measurements only; it must leave the weights,
    gradients and training mode as it found them. ``resume_eval(state)``: the last evaluation a
    checkpoint's trainer state carries.
    """
    model = model.to(info.device).train()
    ddp = model
    if info.distributed:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[info.device] if info.device.type == "cuda" else None)
    optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                position_lr_scale=position_lr_scale)
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
    run = _Run(cfg, info, out, model, ddp, objective, optimizer, scheduler, precision, budget, elapsed,
               clock, on_backward, title)
    last_eval = resume_eval(state) if resume_eval is not None else None
    return _loop(run, start, last_eval)


def _train_step(run: _Run, step: int):
    cfg, info = run.cfg, run.info
    micro = [run.objective.batch(step * cfg.grad_accum + m).to(info.device) for m in range(cfg.grad_accum)]
    counts = [run.objective.units(b) for b in micro]
    n_global = qdist.all_sum(torch.stack(counts).sum().double().cpu()).item()
    loss_sum = torch.zeros((), dtype=torch.float64)
    for m, b in enumerate(micro):
        torch.manual_seed(seed_for(cfg.seed, step, m, info.rank))  # dropout
        last = m == cfg.grad_accum - 1
        sync = contextlib.nullcontext() if (not info.distributed or last) else run.ddp.no_sync()
        with sync:
            with autocast(run.precision, info.device):
                loss = run.objective.loss(run.ddp, b)
            n = counts[m].item()
            # DDP averages gradients over ranks: scale so the sum is the global unit mean
            (loss.float() * (n * info.world_size / max(n_global, 1.0))).backward()
        loss_sum += loss.detach().double().cpu() * n
    if run.on_backward is not None:
        run.on_backward(step + 1, run.model)
    loss = (qdist.all_sum(loss_sum) / max(n_global, 1.0)).item()
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.clip_norm).item()
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    tokens = qdist.all_sum(sum(b.attention_mask.sum() for b in micro).double().cpu()).item()
    return loss, grad_norm, tokens


def _bar(run: _Run, start: int):
    from tqdm.auto import tqdm

    enabled = run.cfg.progress and run.info.is_main
    if run.budget is not None:
        total = round(run.budget.budget_s)
        return tqdm(total=total, initial=min(round(run.elapsed0), total), disable=not enabled, unit="s",
                    dynamic_ncols=True)
    return tqdm(total=run.cfg.steps, initial=start, disable=not enabled, unit="step", dynamic_ncols=True)


def _loop(run: _Run, start: int, last_eval: dict | None = None) -> TrainResult:
    cfg, info, out, model = run.cfg, run.info, run.out, run.model
    metrics_path = out / "metrics.jsonl"
    timed = run.budget is not None
    # a time-budgeted run's clock doubles as the elapsed-time counter of a step run
    clock = run.budget or BudgetClock(1.0, elapsed_s=run.elapsed0, clock=run.clock)
    bar = _bar(run, start)
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
                loss, grad_norm, tokens = _train_step(run, done)
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
        final_eval = run.objective.evaluate(model)
    if info.is_main:
        obj = run.objective
        plot_curve(metrics_path, out / "curve.png", title=run.title, x="minutes" if timed else "step",
                   metric=obj.metric, metric_label=obj.metric_label, loss_label=obj.loss_label)
        if status == "complete":
            obj.save(model, out)
        update_run(out, status=status, steps_done=done, final_eval=final_eval,
                   **({"elapsed_s": round(clock.elapsed_s, 3)} if timed else {}))
    return TrainResult(out, done, status, final_eval, loss)


def _evaluate(run: _Run, metrics_path: Path, done: int, clock: BudgetClock, bar) -> dict:
    ev = run.objective.evaluate(run.model)
    if run.info.is_main:
        append_metrics(metrics_path, {"step": done, **ev, "elapsed_s": round(clock.elapsed_s, 3)})
        bar.write(f"step {done}: {run.objective.describe(ev)}")
    return ev
