"""The training engine itself: the one place that calls backward, in-memory runs of a minimal
objective, divergence raised or reported, the gradient probe against torch.autograd.grad."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import qkv
from qkv.training.config import LoopConfig
from qkv.training.engine import TrainingError, run_training
from qkv.training.step import gradients

SRC = Path(qkv.__file__).resolve().parent


def test_backward_is_called_in_exactly_one_module():
    calls = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                   if re.search(r"\.backward\(", p.read_text(encoding="utf-8")))
    assert calls == ["training/step.py"], calls


@dataclass(frozen=True)
class Rows:
    x: torch.Tensor  # (B,3)
    y: torch.Tensor  # (B,)


class Regression:
    """The least an objective has: a batch source and a loss. Batch 3 can be poisoned (a NaN)."""

    def __init__(self, poison: int | None = None):
        self.poison = poison

    def batch(self, index: int) -> Rows:
        g = torch.Generator().manual_seed(index)
        x = torch.randn(8, 3, generator=g)
        y = x @ torch.tensor([1.0, -2.0, 0.5])
        if index == self.poison:
            y = y * float("nan")
        return Rows(x, y)

    def loss(self, model, b: Rows) -> torch.Tensor:
        return ((model(b.x).squeeze(-1) - b.y) ** 2).mean()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def test_an_in_memory_run_needs_only_a_batch_source_and_a_loss(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = _model()
    r = run_training(LoopConfig(steps=60, lr=0.1, weight_decay=0.0, log_every=20), Regression(), model=model)
    assert (r.out, r.status, r.steps_done, r.final_eval) == (None, "complete", 60, {})
    assert [row["step"] for row in r.history] == [20, 40, 60] and r.train_loss < 0.05 * r.history[0]["loss"]
    assert r.train_s > 0 and list(tmp_path.iterdir()) == []  # nothing written


def test_a_non_finite_loss_is_raised_or_reported_before_the_step():
    with pytest.raises(TrainingError, match=r"non-finite loss \(nan\) at step 4; stopped without saving"):
        run_training(LoopConfig(steps=6), Regression(poison=3), model=_model())
    model = _model()
    r = run_training(LoopConfig(steps=6), Regression(poison=3), model=model, divergence="report")
    assert r.status == "diverged" and r.steps_done == 3 and r.history[-1]["diverged"] and r.history[-1]["step"] == 4
    seen = {}

    def after_three(step, m):  # step 4's backward is done, its update not yet: the weights of 3 steps
        if step == 4:
            seen.update({k: v.clone() for k, v in m.state_dict().items()})

    run_training(LoopConfig(steps=6), Regression(), model=_model(), on_backward=after_three)
    assert all(torch.equal(v, seen[k]) for k, v in model.state_dict().items())


def test_gradients_are_those_of_torch_autograd_grad():
    model, b = _model(), Regression().batch(0)
    loss = gradients(model, lambda: Regression().loss(model, b))
    want = torch.autograd.grad(Regression().loss(model, b), list(model.parameters()))
    assert loss == pytest.approx(float(Regression().loss(model, b).detach()))
    for p, g in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)


def test_a_time_budget_in_memory_ends_at_the_deadline():
    clock = [0.0]

    def tick(step, model):
        clock[0] += 2.0

    r = run_training(LoopConfig(time_budget=0.5, log_every=1), Regression(), model=_model(), clock=lambda: clock[0],
                     on_backward=tick)  # 30 s at 2 s a step
    assert r.steps_done == 15 and r.elapsed_s == pytest.approx(30.0) and r.history[-1]["lr"] > 0


def test_loop_config_is_validated():
    for bad, msg in ((dict(), "needs steps or a time_budget"), (dict(steps=0), "steps=0"),
                     (dict(steps=1, betas=(0.9, 1.0)), "betas"), (dict(steps=1, clip_norm=0), "clip_norm")):
        with pytest.raises(ValueError, match=msg):
            LoopConfig(**bad)


def test_a_warm_up_longer_than_the_run_is_warned_about(tmp_path, monkeypatch, capsys):
    from qkv.training.optim import warmup_warning

    monkeypatch.chdir(tmp_path)
    run_training(LoopConfig(steps=4, lr=0.1, warmup_steps=10, log_every=4), Regression(), model=_model())
    err = capsys.readouterr().err
    assert err.count("qkv: warning: --warmup-steps 10 ≥ --steps 4: the whole run is warm-up") == 1
    assert "rises to 40% of --lr at the last step" in err and "use --warmup-steps 1 (10 % of the run)" in err
    run_training(LoopConfig(steps=4, lr=0.1, warmup_steps=3, log_every=4), Regression(), model=_model())
    assert "warning" not in capsys.readouterr().err
    assert warmup_warning(0, 5) is None and warmup_warning(100, None) is None and warmup_warning(5, 5) is not None
