"""Time-budgeted training: the schedule as a function of elapsed time, on a fake clock."""

from __future__ import annotations

import json
import math
import os
import signal

import pytest

from qkv.training.config import TrainConfig
from qkv.training.loop import pretrain
from qkv.training.budget import BudgetClock, timed_lr_factor
from qkv.training.metrics import read_metrics

TINY = dict(preset="tiny", model={"max_len": 40, "dropout": 0.0}, vocab_size=300, max_len=24,
            batch_size=4, warmup_steps=4, eval_every=1000, eval_batches=2, eval_batch_size=8,
            save_every=1000, log_every=1, progress=False, corpus=("dataset:pydoc",), lr=1e-3)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path / "cache"))


class FakeClock:
    """A clock that only moves when a test moves it."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_timed_factor_warms_up_by_step_and_decays_to_zero_at_the_deadline():
    f = lambda step, p, schedule="linear": timed_lr_factor(step, p, warmup_steps=4, schedule=schedule)  # noqa: E731
    assert [f(s, 0.0) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert f(10, 0.25) == 0.75 and f(10, 0.5) == 0.5
    assert f(1, 0.9) == pytest.approx(0.1)  # the decay caps an unfinished warm-up
    assert f(10, 1.0) == 0.0 and f(10, 1.7) == 0.0 and f(0, 1.0) == 0.0
    assert f(10, 0.5, "cosine") == pytest.approx(0.5) and f(10, 1.0, "cosine") == 0.0
    assert f(10, 0.99, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.99)))
    assert f(10, 0.99, "constant") == 1.0 and f(10, 1.0, "constant") == 0.0
    with pytest.raises(ValueError, match="allowed: linear, cosine, constant"):
        timed_lr_factor(0, 0.5, warmup_steps=0, schedule="step")


def test_budget_clock_counts_from_a_stored_base():
    clock = FakeClock()
    b = BudgetClock(60, elapsed_s=15, clock=clock)
    assert b.elapsed_s == 15 and b.progress() == 0.25
    b.start()
    clock.t += 30
    assert b.elapsed_s == 45 and b.progress() < 1
    clock.t += 15
    assert b.progress() >= 1
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive number of seconds"):
            BudgetClock(bad)


def _advance(clock: FakeClock, slow_steps: int, slow: float, fast: float):
    """An on_backward hook: each step takes ``slow`` seconds for the first ``slow_steps``, then ``fast``."""
    def hook(step, model):
        clock.t += slow if step <= slow_steps else fast
    return hook


def _expected_lrs(n_steps, budget_s, durations, base_lr, warmup):
    """The learning rate of each step: set from the elapsed time at the start of that step."""
    lrs, elapsed = [], 0.0
    for step in range(n_steps):
        lrs.append(base_lr * timed_lr_factor(step, elapsed / budget_s, warmup_steps=warmup, schedule="linear"))
        elapsed += durations(step + 1)
    return lrs


def test_a_slow_then_fast_run_ends_at_the_deadline_with_the_schedule_fully_decayed(tmp_path):
    clock = FakeClock()
    cfg = TrainConfig(out=str(tmp_path / "run"), time_budget=1.0, **TINY)  # 60 s
    # 10 steps at 3 s (30 s), then 0.5 s a step: 60 more steps reach the deadline exactly
    res = pretrain(cfg, clock=clock, on_backward=_advance(clock, 10, 3.0, 0.5))
    assert res.status == "complete" and res.steps_done == 70
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 71))
    durations = lambda s: 3.0 if s <= 10 else 0.5  # noqa: E731
    expected = _expected_lrs(70, 60.0, durations, 1e-3, 4)
    assert [r["lr"] for r in rows] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert rows[-1]["lr"] == pytest.approx(1e-3 * 0.5 / 60)  # the last step starts 0.5 s before the deadline
    assert rows[-1]["elapsed_s"] == pytest.approx(60.0)
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "complete" and meta["steps_done"] == 70 and meta["final_eval"]["accuracy"] >= 0
    assert meta["elapsed_s"] == pytest.approx(60.0)
    # the `steps` field plays no part in a time-budgeted run
    assert cfg.steps == 1000


def test_a_fast_then_slow_run_also_ends_on_time(tmp_path):
    clock = FakeClock()
    cfg = TrainConfig(out=str(tmp_path / "run"), time_budget=0.5, **TINY)  # 30 s
    res = pretrain(cfg, clock=clock, on_backward=lambda step, m: setattr(clock, "t", clock.t + (0.25 if step <= 40 else 5.0)))
    # 40 steps × 0.25 s = 10 s, then 5 s a step: 4 more steps reach exactly 30 s
    assert res.steps_done == 44
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert rows[-1]["lr"] == pytest.approx(1e-3 * 5.0 / 30)
    assert all(a["lr"] >= b["lr"] for a, b in zip(rows[4:], rows[5:]))  # decays monotonically after warm-up


def test_interrupt_and_resume_continues_the_clock_from_the_checkpoint(tmp_path):
    clock = FakeClock()
    cfg = TrainConfig(out=str(tmp_path / "run"), time_budget=0.5, **TINY)  # 30 s, 1 s a step

    def hook(step, model):
        clock.t += 1.0
        if step == 12:  # a stop request before the update: step 12 is abandoned, its second spent
            os.kill(os.getpid(), signal.SIGINT)

    first = pretrain(cfg, clock=clock, on_backward=hook)
    assert first.status == "interrupted" and first.steps_done == 11
    trainer = json.loads(next((tmp_path / "run" / "checkpoints").glob("step-*/trainer.json")).read_text())
    assert trainer["step"] == 11 and trainer["scheduler"]["steps"] == 11
    assert trainer["elapsed_s"] == pytest.approx(12.0)
    later = FakeClock(5_000.0)  # another process: its clock reads something else entirely
    second = pretrain(cfg, resume=True, clock=later, on_backward=lambda s, m: setattr(later, "t", later.t + 1.0))
    # 18 more seconds of budget at 1 s a step: steps 12 … 29
    assert second.status == "complete" and second.steps_done == 29
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 30))
    # step k (0-based) starts at k seconds before the interruption, at k + 1 after it
    progress = [k / 30 for k in range(11)] + [(k + 1) / 30 for k in range(11, 29)]
    expected = [1e-3 * timed_lr_factor(k, p, warmup_steps=4, schedule="linear") for k, p in enumerate(progress)]
    assert [r["lr"] for r in rows] == pytest.approx(expected, rel=1e-12)
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["elapsed_s"] == pytest.approx(30.0) and meta["final_eval"] is not None


def test_time_budget_is_validated():
    for bad in (0, -2, float("nan"), "10", True):
        with pytest.raises(ValueError, match="time_budget"):
            TrainConfig(corpus="x", out="y", time_budget=bad)


def test_the_cli_takes_time_budget(tmp_path, capsys):
    from qkv.cli import main

    rc = main(["pretrain", "--corpus", "dataset:pydoc", "--out", str(tmp_path / "run"), "--preset", "tiny",
               "--model", json.dumps({"max_len": 40}), "--vocab-size", "300", "--max-len", "24",
               "--batch-size", "4", "--time-budget", "0.02", "--eval-batches", "1", "--no-progress"])
    assert rc == 0
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["train_config"]["time_budget"] == 0.02 and meta["status"] == "complete"
    assert 0 < meta["elapsed_s"] < 30


def test_position_lr_scale_puts_bias_tables_in_their_own_group():
    from qkv.config import ModelConfig
    from qkv.models.builders import build_masked_lm
    from qkv.training.optim import build_optimizer

    model = build_masked_lm(ModelConfig.preset("tiny", position="relative-alibi"))
    tables = {id(p) for n, p in model.named_parameters() if n.endswith("score_bias.weight")}
    assert len(tables) == 2  # one per layer
    plain = build_optimizer(model, lr=1e-3, weight_decay=0.01)
    assert len(plain.param_groups) == 2
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.01, position_lr_scale=30)
    assert len(opt.param_groups) == 3
    group = opt.param_groups[2]
    assert {id(p) for p in group["params"]} == tables and group["lr"] == pytest.approx(0.03)
    assert group["weight_decay"] == 0.0
    assert not tables & {id(p) for g in opt.param_groups[:2] for p in g["params"]}
    with pytest.raises(ValueError, match="position_lr_scale"):
        TrainConfig(corpus="x", out="y", position_lr_scale=0)
