"""A test-sized run: the encoder-decoder learns to reverse 4–6 digits (preset tiny, 300 steps), its
cross-attention is the anti-diagonal, the run folder loads, and ``qkv inspect`` draws the maps."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import qkv
from qkv.lab.seq2seq import evaluate, train
from qkv.lab.tasks import get_task


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab") / "reverse"
    task = get_task("reverse", min_len=4, max_len=6)
    return task, train(task, preset="tiny", steps=300, seed=0, out=out, eval_examples=256, progress=False), out


def test_reverse_is_learned(run):
    task, result, out = run
    assert result.exact_match >= 0.99, result  # measured 1.0 (seeds 0, 1)
    assert result.chance < 1e-3 and result.steps == 300
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["exact_match"] == result.exact_match and metrics["task"] == "reverse"


def test_the_folder_loads_and_generates_the_same(run):
    task, result, out = run
    model, tok = qkv.load(out / "model")
    assert tok.get_vocab()["3"] == task.vocab.index("3")
    assert evaluate(model, task, 64) == evaluate(result.model, task, 64)


def test_cross_attention_follows_the_reversal(run):
    """Decoder position t emits source token n-1-t: the head-averaged cross-attention argmax of row
    t should be source position n-1-t (the textbook's point: cross-attention aligns)."""
    task, result, _ = run
    model = result.model.eval()
    b = task.batch(0, 64, seed=12345)
    hits = total = 0
    with torch.no_grad():
        out = model(b.input_ids, b.attention_mask, labels=b.labels, output_attentions=True)
    cross = out.cross_attentions[-1].mean(1)  # (B,H,T,S) -> (B,T,S)
    for i, src in enumerate(b.sources):
        n = len(src)
        arg = cross[i, :n].argmax(-1).tolist()  # rows 0…n-1 emit the n source tokens reversed
        hits += sum(a == n - 1 - t for t, a in enumerate(arg))
        total += n
    assert hits / total >= 0.8, hits / total


def test_inspect_draws_cross_attention_maps(run, tmp_path):
    from qkv.analysis.viewer import run_inspect

    _, _, out = run
    ins, paths = run_inspect(out / "model", "3 1 4 1 5", tmp_path / "ins")
    assert ins.output_tokens[:6] == ["5", "1", "4", "1", "3", "[EOS]"]
    L, H, T, S = ins.cross_attentions.shape
    assert S == 5 and T == len(ins.target_tokens) and ins.decoder_attentions.shape == (L, H, T, T)
    assert paths["cross_0"].is_file() and paths["encoder_0"].is_file() and paths["decoder_0"].is_file()  # from 0
    anti = np.argmax(ins.cross_attentions[-1].mean(0)[:5], -1)
    assert (anti == np.arange(4, -1, -1)).mean() >= 0.8


def test_bad_budgets_are_refused_before_training():
    with pytest.raises(ValueError, match="steps"):
        train("reverse", steps=0, progress=False)
    with pytest.raises(ValueError, match="preset"):
        train("reverse", preset="huge", progress=False)


# --- on the training engine: time budget, run folder and resume, precision, the command line ---------------

SHORT = dict(preset="tiny", steps=12, seed=0, eval_examples=32, progress=False)


class FakeClock:
    """A clock that only moves when a test moves it."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model" / "model.safetensors"))


def _trained(folder) -> list[dict]:
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in rows]


def test_a_time_budget_stops_the_run_at_its_deadline():
    clock = FakeClock()
    task = get_task("reverse", min_len=4, max_len=6)
    r = train(task, **{**SHORT, "steps": None}, time_budget=0.1, clock=clock,  # 6 s at 1 s a step
              on_backward=lambda step, model: setattr(clock, "t", clock.t + 1.0))
    assert r.status == "complete" and r.steps == 6 and 0 <= r.exact_match <= 1
    assert train(task, **{**SHORT, "steps": None}, minutes=0.1, clock=clock,  # the former name
                 on_backward=lambda step, model: setattr(clock, "t", clock.t + 1.0)).steps == 6


def test_an_interrupted_run_resumes_bit_identically(tmp_path):
    import os
    import signal

    task = get_task("reverse", min_len=4, max_len=6)
    whole = train(task, **SHORT, out=tmp_path / "whole")
    assert (tmp_path / "whole" / "run.json").is_file() and (tmp_path / "whole" / "curve.png").is_file()

    def stop(step, model):
        if step == 8:  # a stop request while step 8 runs: it is abandoned, step 7 checkpointed
            os.kill(os.getpid(), signal.SIGINT)

    part = train(task, **SHORT, out=tmp_path / "part", on_backward=stop)
    assert part.status == "interrupted" and part.steps == 7 and not (tmp_path / "part" / "metrics.json").exists()
    again = train(task, **SHORT, out=tmp_path / "part", resume=True)
    assert again.status == "complete" and again.exact_match == whole.exact_match
    assert again.final_loss == whole.final_loss and _trained(tmp_path / "part") == _trained(tmp_path / "whole")
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    memory = train(task, **SHORT)  # no folder: the same numbers
    assert (memory.exact_match, memory.final_loss) == (whole.exact_match, whole.final_loss)
    with pytest.raises(ValueError, match=r"different configuration: seed: 0 → 1"):
        train(task, **{**SHORT, "seed": 1}, out=tmp_path / "part", resume=True)


def test_bf16_runs_and_stays_close_to_fp32():
    from qkv.training.precision import bf16_support

    ok, why = bf16_support("cpu")
    if not ok:
        pytest.skip(f"bf16 training falls back to fp32 here: {why}")
    task = get_task("reverse", min_len=4, max_len=6)
    a, b = train(task, **SHORT), train(task, **SHORT, precision="bf16")
    assert (a.precision, b.precision) == ("fp32", "bf16") and a.final_loss != b.final_loss
    assert abs(a.final_loss - b.final_loss) / a.final_loss < 0.05


def test_the_command_line_resumes_and_refuses_earlier_results(tmp_path, capsys):
    from qkv.cli import main

    out = tmp_path / "run"
    args = ["lab", "seq2seq", "--task", "reverse", "--out", str(out), "--steps", "4", "--precision", "fp32",
            "--no-progress"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "reverse: exact match" in first and "4 steps" in first and json.loads((out / "metrics.json").read_text())
    assert main(["lab", "seq2seq", "--out", str(out), "--resume", "--no-progress"]) == 0  # finished: as it was
    assert capsys.readouterr().out.split(";")[0] == first.splitlines()[-1].split(";")[0]
    assert main(args) == 2
    assert "already holds a run; continue it with --resume" in capsys.readouterr().err
    old = tmp_path / "old"  # a result of the earlier layout (no run.json), with a link out of its folder
    (old / "model").parent.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (old / "model").symlink_to(tmp_path / "elsewhere")
    (old / "metrics.json").write_text("{}")
    assert main(["lab", "seq2seq", "--task", "reverse", "--out", str(old), "--steps", "2", "--no-progress"]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert not any((tmp_path / "elsewhere").iterdir()) and (old / "metrics.json").read_text() == "{}"
    assert main(["lab", "seq2seq", "--out", str(tmp_path / "new"), "--steps", "2"]) == 2
    assert "--task is required" in capsys.readouterr().err
    budget = tmp_path / "budget"
    assert main(["lab", "seq2seq", "--task", "sort", "--out", str(budget), "--time-budget", "0.002", "--no-progress"]) == 0
    assert json.loads((budget / "run.json").read_text())["train_config"]["time_budget"] == 0.002
