"""Pretraining: overfitting, the run folder, bad input, checkpoints, resume after SIGKILL, torchrun."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qkv.training.config import TrainConfig
from qkv.training.loop import TrainingError, pretrain
from qkv.training.rundir import RunError

TINY = dict(preset="tiny", model={"max_len": 40, "dropout": 0.0}, vocab_size=300, max_len=24,
            batch_size=6, warmup_steps=2, eval_every=4, eval_batches=3, eval_batch_size=8,
            save_every=3, log_every=1, progress=False, corpus=("dataset:pydoc",))


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path / "cache"))


def _cli(*args: str, env=None) -> list[str]:
    return [sys.executable, "-m", "qkv", "pretrain", *args]


def _tiny_args(out: Path, steps: int, batch: int = 6) -> list[str]:
    return ["--corpus", "dataset:pydoc", "--out", str(out), "--preset", "tiny", "--model",
            json.dumps({"max_len": 40, "dropout": 0.0}), "--vocab-size", "300", "--max-len", "24",
            "--batch-size", str(batch), "--warmup-steps", "2", "--eval-every", "4", "--eval-batches", "3",
            "--eval-batch-size", "8", "--save-every", "3", "--log-every", "1", "--steps", str(steps),
            "--no-progress"]


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ, QKV_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def test_tiny_model_overfits_a_fixed_batch_of_pydoc(tmp_path):
    from qkv.config import ModelConfig
    from qkv.data.pipeline import prepare_pretraining_data
    from qkv.models.builders import build_masked_lm
    from qkv.training.optim import build_optimizer

    data = prepare_pretraining_data("dataset:pydoc", vocab_size=300, max_len=24, cache_dir=tmp_path / "c")
    batch = data.train_batches(8, seed=0).batch(0)
    torch.manual_seed(0)
    model = build_masked_lm(ModelConfig.preset("tiny", vocab_size=data.tokenizer.vocab_size, max_len=24,
                                               dropout=0.0))
    opt = build_optimizer(model, lr=3e-3, weight_decay=0.0)
    losses = []
    for _ in range(150):
        loss = model(batch.input_ids, batch.attention_mask, labels=batch.labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 4.5  # ≈ log(300) at initialisation
    assert losses[-1] < 0.1 * losses[0], losses[::25]


def test_run_folder_metrics_curve_and_loadable_model(tmp_path):
    import qkv

    out = tmp_path / "run"
    result = pretrain(TrainConfig(out=str(out), steps=8, **TINY))
    assert result.status == "complete" and result.steps_done == 8
    for name in ("run.json", "tokenizer.json", "metrics.jsonl", "curve.png", "qkv.json", "model.safetensors"):
        assert (out / name).is_file(), name
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 9))
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in evals] == [4, 8]
    assert {"perplexity", "accuracy", "most_frequent_accuracy"} <= set(evals[-1])
    model = qkv.load(out).model
    assert type(model).__name__ == "MaskedLM"
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


def test_bad_input_stops_before_training_and_leaves_no_run_folder(tmp_path):
    cases = {
        "missing": dict(corpus=(str(tmp_path / "nope.txt"),)),
        "unknown": dict(corpus=("dataset:wikipedia",)),
    }
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    cases["empty"] = dict(corpus=(str(empty),))
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    cases["not utf-8"] = dict(corpus=(str(bad),))
    huge = tmp_path / "huge.txt"
    with open(huge, "w") as fh:  # a 50 MB single line
        for _ in range(50):
            fh.write("word " * 209_715)
        fh.write("\n")
    cases["50 MB line"] = dict(corpus=(str(huge),))
    jl = tmp_path / "bad.jsonl"
    jl.write_text('{"text": "fine"}\n{not json}\n')
    cases["bad json"] = dict(corpus=(str(jl),))
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text('{"body": "no text field"}\n')
    cases["missing field"] = dict(corpus=(str(nofield),))
    for name, change in cases.items():
        out = tmp_path / f"run-{name.replace(' ', '')}"
        with pytest.raises(ValueError) as e:
            pretrain(TrainConfig(out=str(out), steps=2, **{**TINY, **change}))
        assert not out.exists(), name
        assert str(e.value), name
    assert "byte" in str(pytest.raises(ValueError, pretrain, TrainConfig(
        out=str(tmp_path / "r"), steps=2, **{**TINY, "corpus": (str(bad),)})).value)


def test_unwritable_output_and_foreign_run_folder(tmp_path):
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(RunError, match="not writable"):
            pretrain(TrainConfig(out=str(ro / "run"), steps=2, **TINY))
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(RunError, match="not an empty folder"):
        pretrain(TrainConfig(out=str(f), steps=2, **TINY))
    with pytest.raises(RunError, match="is a file, not a folder"):
        pretrain(TrainConfig(out=str(f / "run"), steps=2, **TINY))
    out = tmp_path / "run"
    pretrain(TrainConfig(out=str(out), steps=3, **TINY))
    with pytest.raises(RunError, match="already holds a run"):
        pretrain(TrainConfig(out=str(out), steps=3, **TINY))
    with pytest.raises(RunError, match="different configuration"):
        pretrain(TrainConfig(out=str(out), steps=3, **{**TINY, "lr": 0.5}), resume=True)
    with pytest.raises(RunError, match="holds no run"):
        pretrain(TrainConfig(out=str(tmp_path / "fresh"), steps=3, **TINY), resume=True)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(TrainingError, match="non-finite loss") as e:
        pretrain(TrainConfig(out=str(out), steps=30, **{**TINY, "lr": 1e30, "warmup_steps": 0,
                                                       "clip_norm": 1e30}))
    latest = (out / "checkpoints" / "LATEST")
    if latest.exists():
        assert latest.read_text().strip() in str(e.value)
    assert not (out / "model.safetensors").exists()


def test_sigkill_then_resume_is_bit_identical(tmp_path):
    env = _env(tmp_path)
    steps, kill_at = 48, random.randint(4, 40)
    full = tmp_path / "full"
    subprocess.run(_cli(*_tiny_args(full, steps)), env=env, check=True, capture_output=True)
    part = tmp_path / "part"
    proc = subprocess.Popen(_cli(*_tiny_args(part, steps)), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 180

    def logged_step() -> int:
        try:
            lines = (part / "metrics.jsonl").read_text().splitlines()
            return max(json.loads(x)["step"] for x in lines if x.endswith("}"))
        except (FileNotFoundError, ValueError):
            return 0

    while not ((part / "checkpoints" / "LATEST").exists() and logged_step() >= kill_at):
        assert proc.poll() is None and time.time() < deadline, "the run ended before the kill"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (part / "model.safetensors").exists(), "killed too late: the run had finished"
    r = subprocess.run(_cli("--out", str(part), "--resume", "--no-progress"), env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    a, b = load_file(str(full / "model.safetensors")), load_file(str(part / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    la = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in rows]  # noqa: E731
    assert strip(la) == strip(lb)


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    env = _env(tmp_path)
    out = tmp_path / "run"
    proc = subprocess.Popen(_cli(*_tiny_args(out, 5000)), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "--resume" in stdout
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "interrupted"
    step = int((out / "checkpoints" / "LATEST").read_text().strip().split("-")[1])
    assert step == meta["steps_done"] > 0


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_torchrun_two_ranks_match_one_process_with_double_batch(tmp_path, objective):
    env = _env(tmp_path)
    extra = ["--objective", objective]
    one = tmp_path / "one"
    subprocess.run(_cli(*_tiny_args(one, 5, batch=8), *extra), env=env, check=True, capture_output=True)
    two = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port",
           str(random.randint(20000, 40000)), "-m", "qkv", "pretrain", *_tiny_args(two, 5, batch=4),
           "--device", "cpu", *extra]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    la = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert len(la) == len(lb) >= 5
    for ra, rb in zip(la, lb):
        for key in ("loss", "eval_loss", "accuracy", "bigram_perplexity"):
            if key in ra:
                assert abs(ra[key] - rb[key]) < 1e-5, (ra, rb)


def test_unigram_bias_starts_at_the_best_context_free_prediction():
    import numpy as np

    from qkv.config import ModelConfig
    from qkv.models.builders import build_masked_lm
    from qkv.training.loop import init_unigram_bias

    tokens = np.array([5, 5, 5, 6, 7, 7], dtype=np.uint16)
    model = build_masked_lm(ModelConfig.preset("tiny"))
    init_unigram_bias(model, tokens, 97)
    b = model.head.bias.detach().double()
    # differences of the bias are differences of log (count + 1)
    assert abs((b[5] - b[6]).item() - np.log(4 / 2)) < 1e-6
    assert abs((b[7] - b[8]).item() - np.log(3 / 1)) < 1e-6
    assert abs(b.mean().item()) < 1e-6


def test_an_update_that_overflows_the_weights_is_no_good_checkpoint(tmp_path):
    """--lr 1e30 with a finite first loss: the weights after step 1 are inf/NaN; they are neither
    checkpointed as good nor kept as the model, and run.json says failed (never running)."""
    out = tmp_path / "run"
    with pytest.raises(TrainingError, match=r"(held-out loss nan|non-finite weights) after step 1; stopped without saving") as e:
        pretrain(TrainConfig(out=str(out), steps=6, **{**TINY, "lr": 1e30, "warmup_steps": 0, "clip_norm": 1e30,
                                                      "save_every": 1, "eval_every": 1}))
    assert "Last good checkpoint: none" in str(e.value)
    assert not (out / "checkpoints" / "LATEST").exists() and not (out / "model.safetensors").exists()
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
