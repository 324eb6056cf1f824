"""The training engine: one explicit loop for every objective qkv trains — the loop that every run
of qkv goes through (one step's gradients: :mod:`qkv.training.step`, the only module that calls
``backward``).

    for step in range(start, steps):           (or: until the time budget is spent)
        micro-batches → forward → loss normalised by the global unit count → backward
        (non-finite loss → stop) → clip → AdamW step → schedule step → log → (evaluate) → (checkpoint)

What is trained on and how it is scored is an :class:`~qkv.training.objective.Objective` (a loss and
a batch source); everything else lives here: the optimiser and schedule (by steps or a time budget),
checkpoints and ``--resume``, bf16 autocast, adaptive threads, the progress bar, the metrics log and
its curve, stop requests (Ctrl-C / SIGTERM save a checkpoint), the final model. A run has a run
folder (:class:`~qkv.training.lifecycle.RunFolder`) or runs in memory (``run=None``: the lab's
hundreds of small runs — no files, no signal handlers; the records come back in the result).

Every random draw of a step is seeded from ``(seed, step, micro-batch, rank)`` and every batch is a
pure function of its index, so a resumed run repeats the uninterrupted one bit for bit, and K
processes with batch b compute what one process with batch K·b computes (the loss is normalised by
the unit count — masked tokens, examples, labelled tokens — over all ranks and micro-batches).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from qkv.errors import QkvError
from qkv.training import distributed as qdist
from qkv.training.budget import BudgetClock, TimedScheduler
from qkv.training.checkpoint import latest_checkpoint
from qkv.training.config import LoopConfig
from qkv.training.health import unhealthy
from qkv.training.lifecycle import RunFolder
from qkv.training.metrics import plot_curve, truncate_metrics
from qkv.training.objective import Objective
from qkv.training.optim import build_optimizer, build_scheduler, warmup_warning
from qkv.training.progress import RunBar
from qkv.training.stop import StepAbandoned, stop_requests
from qkv.training.run_state import Progress, RunState
from qkv.training.step import train_step
from qkv.training.strategy import make_strategy
from qkv.training.threads import thread_governor

__all__ = ["TrainResult", "TrainingError", "run_training", "DIVERGENCE"]

#: What a non-finite loss does: ``raise`` :class:`TrainingError` (pretraining, fine-tuning) or
#: ``report`` it — the run stops before that step with status ``diverged`` (the lab's runs).
DIVERGENCE = ("raise", "report")


class TrainingError(QkvError, RuntimeError):
    """Training stopped (e.g. a non-finite loss); the last good checkpoint is kept."""


@dataclass
class TrainResult:
    """What a finished, interrupted or diverged run reports.

    Attributes:
        out: the run folder (``None``: an in-memory run).
        steps_done: optimiser steps taken.
        status: ``complete``, ``interrupted`` or ``diverged``.
        final_eval: the last evaluation (``None`` when interrupted before any).
        train_loss: the loss of the last step computed (of the step that diverged, if one did).
        history: the logged records (training steps and evaluations) of the whole run.
        elapsed_s: training time on the run's clock (resumptions added up).
        train_s: wall seconds of this process's training steps (evaluations and checkpoints not
            counted); steps per second = (steps_done − start_step) / train_s.
        start_step: the step this process started from (a resumed run's checkpoint).
        model: the model the run folder's final model was written from, usable by this process
            alone: the trained model itself, or after ``--strategy fsdp`` on several processes an
            unsharded copy on the CPU gathered from the shards (rank 0). ``None`` on the other
            ranks, and when no final model was written.
    """

    out: Path | None
    steps_done: int
    status: str
    final_eval: dict | None
    train_loss: float | None
    history: list[dict] = field(default_factory=list)
    elapsed_s: float = 0.0
    train_s: float = 0.0
    start_step: int = 0
    model: torch.nn.Module | None = None


def run_training(cfg, objective: Objective, *, model: torch.nn.Module, run: RunFolder | None = None,
                 info: qdist.DistInfo | None = None, precision: str = "fp32", title: str = "",
                 clock: Callable[[], float] = time.monotonic, on_backward=None, on_log=None, resume_eval=None,
                 divergence: str = "raise") -> TrainResult:
    """Optimise ``model`` for ``objective`` as ``cfg`` says.

    Args:
        cfg: a :class:`~qkv.training.config.LoopConfig`, or a run configuration with its fields.
        objective: see :class:`~qkv.training.objective.Objective`. model: trained in place.
        run: the run folder (``run.resume``: continue from the latest checkpoint — model,
            optimiser, schedule, elapsed time); ``None``: an in-memory run.
        info: the process's place (default: a world of one on the CPU).
        precision: a resolved precision, ``fp32`` or ``bf16`` (autocast). title: the curve's.
        clock: the monotonic time source of a time-budgeted run (tests pass a fake one).
        on_backward: ``f(step, model)`` on every optimiser step after the backward pass, before
            clipping — for measurements only: weights, gradients and mode left as found.
        on_log: ``f(record)`` for every logged training record (``step``, ``loss``, ``lr``, …).
        resume_eval: ``f(trainer_state)``: the last evaluation a checkpoint carries.
        divergence: see :data:`DIVERGENCE`.
    """
    cfg = cfg if isinstance(cfg, LoopConfig) else LoopConfig.of(cfg)
    if divergence not in DIVERGENCE:
        raise ValueError(f"divergence={divergence!r}; allowed: {', '.join(DIVERGENCE)}")
    info = info or qdist.DistInfo(0, 1, 0, torch.device("cpu"))
    model = model.to(info.device).train()
    strategy = make_strategy(cfg.strategy, info)
    ddp = strategy.wrap(model)  # fsdp: the model is sharded in place
    optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas, eps=cfg.eps,
                                position_lr_scale=cfg.position_lr_scale)
    timed = cfg.time_budget is not None
    if timed:  # its clock is set once the checkpoint says how much of the budget is spent
        scheduler = TimedScheduler(optimizer, None, warmup_steps=cfg.warmup_steps, schedule=cfg.schedule)
    else:
        scheduler = build_scheduler(optimizer, warmup_steps=cfg.warmup_steps, total_steps=cfg.steps,
                                    schedule=cfg.schedule)
        if info.is_main and (warning := warmup_warning(cfg.warmup_steps, cfg.steps)):
            print(f"qkv: warning: {warning}", file=sys.stderr, flush=True)
    start, elapsed, state, history = 0, 0.0, {}, []
    resume = run is not None and run.resume
    ckpt = latest_checkpoint(run.out) if resume else None
    if ckpt is not None:
        # a time-budgeted run has no step limit to check a checkpoint's step against
        state = strategy.load(ckpt, model=model, optimizer=optimizer, scheduler=scheduler,
                              run_id=run.meta().get("run_id"), max_step=None if timed else cfg.steps)
        start, elapsed = state["step"], float(state.get("elapsed_s", 0.0))
    # a time-budgeted run's clock; a step run's counts the elapsed time only
    train_clock = BudgetClock(cfg.time_budget * 60 if timed else 1.0, elapsed_s=elapsed, clock=clock)
    if timed:
        scheduler.clock = train_clock
    writes = run is not None and info.is_main
    if writes and resume:
        history = truncate_metrics(run.out, start)
    if run is not None:
        run.start()
    budget = train_clock if timed else None
    r = RunState(cfg, info, run, model, ddp, strategy, objective, optimizer, scheduler, precision, budget,
                 train_clock, on_backward, on_log, divergence, title, history, writes)
    last_eval = resume_eval(state) if resume_eval is not None else None
    return _loop(r, start, last_eval, state.get("train_loss"))


def _diverged(r: RunState, done: int, loss: float, grad_norm: float) -> bool:
    """Whether step ``done + 1`` must not update the weights: a non-finite loss (or, when
    divergence is reported, gradient). Raises :class:`TrainingError` where divergence raises."""
    if r.divergence == "report":
        return not (math.isfinite(loss) and math.isfinite(grad_norm))
    if not math.isfinite(loss):
        last = latest_checkpoint(r.run.out) if r.run is not None else None
        raise TrainingError(f"non-finite loss ({loss}) at step {done + 1}; stopped without saving. "
                            f"Last good checkpoint: {last or 'none'}. Lower --lr or raise --warmup-steps.")
    return False


def _loop(r: RunState, start: int, last_eval: dict | None, last_loss: float | None) -> TrainResult:
    cfg, info = r.cfg, r.info
    timed = r.budget is not None
    p = Progress(start, start, last_eval, last_loss)
    # an in-memory run without a bar is silent; a run with a folder prints its evaluations
    bar = RunBar(enabled=cfg.progress and info.is_main, steps=cfg.steps, start=start, echo=r.run is not None,
                 budget_s=r.budget.budget_s if timed else None, elapsed_s=r.clock.elapsed_s)
    threads0 = torch.get_num_threads()
    governor = thread_governor(cfg.threads)
    r.clock.start()
    t0 = time.perf_counter()
    with stop_requests(r.optimizer, enabled=r.run is not None, allow_abandon=not info.distributed) as stop:
        while _step(r, p, stop, bar, governor, timed):
            pass
        if timed and p.status == "complete":
            # the deadline: a last evaluation (unless this step had one) and checkpoint
            if not _every(cfg.eval_every, p.done):
                p.final_eval = _evaluate(r, p, bar)
            if not _every(cfg.save_every, p.done):
                _checkpoint(r, p)
    train_s = time.perf_counter() - t0 - p.aside_s
    bar.close()
    torch.set_num_threads(threads0)
    return _finalise(r, p, timed, train_s)


def _every(n: int | None, done: int) -> bool:
    return n is not None and done % n == 0


def _step(r: RunState, p: Progress, stop, bar, governor, timed: bool) -> bool:
    """Run one optimiser step with its logging, evaluation and checkpoint; False when the loop ends."""
    cfg = r.cfg
    if timed:
        share = _shared_progress(r)
        if share >= 1.0:
            return False
        r.scheduler.set_lr(share)
    elif p.done >= cfg.steps:
        return False
    lr = r.scheduler.get_last_lr()[0]
    t_step = time.perf_counter()
    try:
        stop.abandonable = True
        loss, grad_norm, tokens = train_step(r, p.done)
    except StepAbandoned:  # stopped inside gradient accumulation: keep the steps completed
        r.optimizer.zero_grad(set_to_none=True)
        if r.writes and (p.done > p.start or latest_checkpoint(r.run.out) is None):
            _checkpoint(r, p)
        p.status = "interrupted"
        return False
    p.loss = loss
    if _diverged(r, p.done, loss, grad_norm):
        r.optimizer.zero_grad(set_to_none=True)
        r.record({"step": p.done + 1, "loss": loss, "lr": lr, "grad_norm": grad_norm, "diverged": True})
        p.status = "diverged"
        return False
    r.optimizer.step()
    r.scheduler.step()
    r.optimizer.zero_grad(set_to_none=True)
    if governor is not None:
        governor.record(time.perf_counter() - t_step)
    p.done += 1
    _log(r, p, lr, loss, grad_norm, tokens, bar, governor, timed)
    last_step = not timed and p.done == cfg.steps
    if _every(cfg.eval_every, p.done) or last_step:
        p.final_eval = _evaluate(r, p, bar)
    stopping = stop.hit
    if r.info.distributed:
        stopping = bool(qdist.all_sum(torch.tensor(float(stop.hit))).item())
    if _every(cfg.save_every, p.done) or last_step or stopping:
        _checkpoint(r, p)
    if stopping and not last_step:
        p.status = "interrupted"
        return False
    return True


def _shared_progress(r: RunState) -> float:
    # every rank trains at the same learning rate and stops at the same step: rank 0's clock decides
    share = r.budget.progress()
    if r.info.distributed:
        t = torch.tensor(share, dtype=torch.float64)
        torch.distributed.broadcast(t, 0)
        share = t.item()
    return share


def _log(r: RunState, p: Progress, lr, loss, grad_norm, tokens, bar: RunBar, governor, timed: bool) -> None:
    p.rate.add(tokens)
    if _every(r.cfg.log_every, p.done) or (not timed and p.done == r.cfg.steps):
        tps, unit = p.rate.rate(), getattr(r.objective, "rate_unit", "tokens")
        row = {"step": p.done, "loss": loss, "lr": lr, "grad_norm": grad_norm, f"{unit}_per_s": tps,
               "elapsed_s": round(r.clock.elapsed_s, 3), **({"threads": governor.current} if governor else {})}
        if r.info.is_main:
            r.record(row)
        if r.on_log is not None:
            r.on_log(row)
        rate = {{"tokens": "tok_s", "images": "img_s"}.get(unit, f"{unit}_s"): f"{tps:,.0f}"}
        bar.show(loss=f"{loss:.3f}", **rate, **({"step": p.done} if timed else {}))
    bar.advance(r.clock.elapsed_s)


def _checkpoint(r: RunState, p: Progress) -> None:
    if r.writes or (r.run is not None and r.strategy.collective_save):
        t0 = time.perf_counter()
        what = unhealthy(r.model, p.final_eval, r.strategy.collective_save) if r.divergence != "report" else None
        if what is not None:
            raise TrainingError(f"{what} after step {p.done}; stopped without saving. Last good checkpoint: "
                                f"{latest_checkpoint(r.run.out) or 'none'}. Lower --lr or raise --warmup-steps.")
        state = {"seed": r.cfg.seed, "data_position": p.done * r.cfg.grad_accum, "elapsed_s": r.clock.elapsed_s,
                 "run_id": r.run.meta().get("run_id"), "last_eval": p.final_eval, "train_loss": p.loss,
                 "strategy": r.strategy.name} if r.writes else None
        r.strategy.save(r.run.out, step=p.done, model=r.model, optimizer=r.optimizer, scheduler=r.scheduler,
                        trainer_state=state)
        p.aside_s += time.perf_counter() - t0


def _evaluate(r: RunState, p: Progress, bar) -> dict:
    t0 = time.perf_counter()
    evaluate = getattr(r.objective, "evaluate", None)
    with r.strategy.evaluating(r.model):
        ev = evaluate(r.model) if evaluate is not None else {}
    if r.info.is_main and ev:
        r.record({"step": p.done, **ev, "elapsed_s": round(r.clock.elapsed_s, 3)})
        describe = getattr(r.objective, "describe", None)
        if describe is not None:
            bar.write(f"step {p.done}: {describe(ev)}")
    p.aside_s += time.perf_counter() - t0
    return ev


def _finalise(r: RunState, p: Progress, timed: bool, train_s: float) -> TrainResult:
    """The run's end: the final evaluation (a diverged run's weights as they are), then — with a
    run folder — its checkpoint, curve, final model and status."""
    obj = r.objective
    if p.status == "diverged" or (p.status == "complete" and p.final_eval is None):
        evaluate = getattr(obj, "evaluate", None)  # a diverged run, or one whose last evaluation was lost
        with r.strategy.evaluating(r.model):
            p.final_eval = evaluate(r.model) if evaluate is not None else {}
    if r.run is not None and p.status == "diverged":
        _checkpoint(r, p)
    saving = r.run is not None and p.status in ("complete", "diverged") and hasattr(obj, "save")
    final = r.strategy.final_model(r.model) if saving else None  # fsdp: gathered by every rank
    if r.writes:
        out = r.run.out
        plot_curve(out / "metrics.jsonl", out / "curve.png", title=r.title, x="minutes" if timed else "step",
                   metric=getattr(obj, "metric", "accuracy"),
                   metric_label=getattr(obj, "metric_label", "accuracy"),
                   loss_label=getattr(obj, "loss_label", "loss"))
        if saving:
            obj.save(final, out)
        r.run.finish(p.status, steps_done=p.done, final_eval=p.final_eval, train_loss=p.loss,
                     **({"elapsed_s": round(r.clock.elapsed_s, 3)} if timed else {}))
    return TrainResult(r.run.out if r.run is not None else None, p.done, p.status, p.final_eval, p.loss,
                       r.history, r.clock.elapsed_s, train_s, p.start, final)
