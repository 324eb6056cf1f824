"""Faults around a pretraining run: damaged checkpoints, resume checks, locking, disk full, stops,
and kill -9 at the points where a crash matters (the long campaign is ``test_faults_campaign.py``)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from faults_support import (
    env,
    flip_middle,
    kill_at_point,
    pretrain_cmd,
    resume_cmd,
    run,
    run_json,
    same_weights,
    truncate_half,
)

from qkv.cli import main


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache) -> Path:
    """A complete run of STEPS steps, made by a real process (checkpoints at 9 and 12 kept)."""
    out = tmp_path_factory.mktemp("ref") / "run"
    r = run(pretrain_cmd(out), env(cache.parent, QKV_CACHE_DIR=str(cache)))
    assert r.returncode == 0, r.stderr
    return out


def _interrupted(reference: Path, dst: Path) -> Path:
    """The reference run as it was when killed after its step-9 checkpoint."""
    shutil.copytree(reference, dst)
    meta = run_json(dst)
    meta.update(status="running", final_eval=None)
    meta.pop("steps_done", None)
    (dst / "run.json").write_text(json.dumps(meta))
    for f in ("qkv.json", "model.safetensors", "vocab.txt", "curve.png"):
        (dst / f).unlink(missing_ok=True)
    shutil.rmtree(dst / "checkpoints" / "step-00000012")
    (dst / "checkpoints" / "LATEST").write_text("step-00000009\n")
    rows = [json.loads(x) for x in (dst / "metrics.jsonl").read_text().splitlines()]
    (dst / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= 10))
    return dst


@pytest.fixture()
def interrupted(reference, tmp_path, cache, monkeypatch) -> Path:
    monkeypatch.setenv("QKV_CACHE_DIR", str(cache))
    return _interrupted(reference, tmp_path / "run")


def _resume(out, capsys) -> tuple[int, str, str]:
    code = main(["pretrain", "--out", str(out), "--resume", "--no-progress"])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_resume_after_interrupt_is_bit_identical_with_intact_final_eval(interrupted, reference, capsys):
    code, _, err = _resume(interrupted, capsys)
    assert code == 0, err
    assert same_weights(reference, interrupted)
    assert run_json(interrupted)["final_eval"] == run_json(reference)["final_eval"] is not None


def _ckpt(out: Path) -> Path:
    return out / "checkpoints" / "step-00000009"


def _set_trainer(out: Path, **fields) -> None:
    f = _ckpt(out) / "trainer.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), **fields}))


def _malicious_pickle(path: Path) -> None:
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path.write_bytes(pickle.dumps({"state": Evil()}))


DAMAGE = {
    "model truncated": (lambda o: truncate_half(_ckpt(o) / "model.safetensors"), "model.safetensors"),
    "model flipped byte": (lambda o: flip_middle(_ckpt(o) / "model.safetensors"), "model.safetensors"),
    "model missing": (lambda o: (_ckpt(o) / "model.safetensors").unlink(), "model.safetensors is missing"),
    "optimizer truncated": (lambda o: truncate_half(_ckpt(o) / "optimizer.pt"), "optimizer.pt"),
    "optimizer missing": (lambda o: (_ckpt(o) / "optimizer.pt").unlink(), "optimizer.pt is missing"),
    "optimizer malicious pickle": (lambda o: _malicious_pickle(_ckpt(o) / "optimizer.pt"), "optimizer.pt"),
    "trainer.json garbage": (lambda o: (_ckpt(o) / "trainer.json").write_text("{oops"), "trainer.json"),
    "trainer.json step 99999": (lambda o: _set_trainer(o, step=99999), "step 99999"),
    "weights of another run": (lambda o: _set_trainer(o, run_id="0" * 32), "another run"),
    "LATEST names nothing": (lambda o: (o / "checkpoints" / "LATEST").write_text("step-00000777\n"), "LATEST"),
    "run.json garbage": (lambda o: (o / "run.json").write_text("{"), "run.json"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_checkpoint_is_refused_with_a_message(case, interrupted, capsys):
    damage, fragment = DAMAGE[case]
    damage(interrupted)
    code, _, err = _resume(interrupted, capsys)
    assert code == 2 and fragment in err and "Traceback" not in err, err
    assert err.startswith("qkv pretrain: error:")
    assert not (interrupted / "model.safetensors").exists()


def test_checkpoint_of_another_vocabulary_size_is_refused(interrupted):
    from qkv.config import ModelConfig
    from qkv.models.builders import build_masked_lm
    from qkv.errors import CheckpointError
    from qkv.training.checkpoint import load_checkpoint
    from qkv.training.optim import build_optimizer

    cfg = ModelConfig.from_dict({**run_json(interrupted)["model_config"], "vocab_size": 350})
    model = build_masked_lm(cfg)
    with pytest.raises(CheckpointError, match="vocabulary"):
        load_checkpoint(_ckpt(interrupted), model=model, optimizer=build_optimizer(model, lr=1e-3, weight_decay=0),
                        scheduler=None)


def test_resume_of_a_finished_run_changes_nothing_and_prints_its_result(reference, tmp_path, cache,
                                                                          monkeypatch, capsys):
    monkeypatch.setenv("QKV_CACHE_DIR", str(cache))
    done = tmp_path / "done"
    shutil.copytree(reference, done)
    before = {p.name: p.stat().st_mtime_ns for p in done.iterdir()}
    for _ in range(2):
        code, out, err = _resume(done, capsys)
        assert code == 0 and "held-out: loss" in out, err
    assert run_json(done)["final_eval"] == run_json(reference)["final_eval"] is not None
    assert {p.name: p.stat().st_mtime_ns for p in done.iterdir()} == before


def test_a_moved_run_resumes_and_dot_paths_are_the_same_run(interrupted, reference, tmp_path, monkeypatch, capsys):
    moved = tmp_path / "elsewhere" / "x"
    moved.parent.mkdir()
    shutil.move(interrupted, moved)
    monkeypatch.chdir(tmp_path / "elsewhere")
    code, _, err = _resume("./x", capsys)  # "./x", a run made as ".../run"
    assert code == 0, err
    assert same_weights(reference, moved)


def test_torn_last_metrics_line_is_repaired_on_resume(interrupted, reference, capsys):
    with open(interrupted / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 11, "loss": 4.1')  # a crash mid-append
    code, _, err = _resume(interrupted, capsys)
    assert code == 0, err
    rows = [json.loads(x) for x in (interrupted / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(x) for x in (reference / "metrics.jsonl").read_text().splitlines()]
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in rs]  # noqa: E731
    assert strip(rows) == strip(ref)


def test_damaged_metrics_line_before_the_last_names_the_file(interrupted, capsys):
    lines = (interrupted / "metrics.jsonl").read_text().splitlines()
    lines[2] = "garbage"
    (interrupted / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    code, _, err = _resume(interrupted, capsys)
    assert code == 2 and "metrics.jsonl: line 3" in err


def test_rewritten_corpus_is_refused_on_resume(tmp_path, texts, capsys):
    from qkv.training.config import TrainConfig
    from qkv.training.loop import pretrain

    corpus = tmp_path / "small.txt"
    corpus.write_text("\n".join(" ".join(t.split()) for t in texts[:40]) + "\n")
    out = tmp_path / "run"
    pretrain(TrainConfig(corpus=(str(corpus),), out=str(out), preset="tiny", model={"max_len": 40}, vocab_size=200,
                         max_len=24, batch_size=4, steps=3, warmup_steps=1, eval_every=3, eval_batches=1,
                         save_every=3, progress=False))
    meta = run_json(out)
    meta["status"] = "interrupted"
    (out / "run.json").write_text(json.dumps(meta))
    corpus.write_text(corpus.read_text().replace("the", "a"))
    code, _, err = _resume(out, capsys)
    assert code == 2 and "trained on other content" in err and "small.txt" in err, err


def test_a_second_process_on_a_run_is_refused_and_a_stale_lock_taken_over(interrupted, reference, cache,
                                                                           tmp_path, capsys):
    e = env(tmp_path, QKV_CACHE_DIR=str(cache))
    mark = tmp_path / "mark"
    proc = subprocess.Popen(resume_cmd(interrupted), env={**e, "QKV_FAULT_PAUSE": "checkpoint.write:60",
                                                          "QKV_FAULT_MARK": str(mark)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not mark.exists():
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.02)
        code, _, err = _resume(interrupted, capsys)
        assert code == 2 and f"in use by process {proc.pid}" in err, err
    finally:
        proc.kill()
        proc.wait()
    assert (interrupted / ".lock").is_file()  # left by the killed process: stale
    code, _, err = _resume(interrupted, capsys)
    assert code == 0, err
    assert same_weights(reference, interrupted) and not (interrupted / ".lock").exists()


def test_two_new_runs_on_one_out_one_wins_cleanly(tmp_path, cache):
    e = env(tmp_path, QKV_CACHE_DIR=str(cache))
    out = tmp_path / "run"
    procs = [subprocess.Popen(pretrain_cmd(out, 6), env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(c for c, _ in results)
    assert codes == [0, 2], results
    loser = next(err for c, err in results if c == 2)
    assert "Traceback" not in loser and ("--resume" in loser or "in use" in loser), loser
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(x)]
    assert steps == list(range(1, 7))


def test_disk_full_while_checkpointing_says_nothing_is_lost(tmp_path, monkeypatch, capsys):
    import qkv.training.checkpoint as ck
    from qkv.training.config import TrainConfig
    from qkv.training.loop import pretrain
    from qkv.training.checkpoint import CheckpointWriteError, latest_checkpoint

    cfg = TrainConfig(corpus=("dataset:pydoc",), out=str(tmp_path / "run"), preset="tiny", model={"max_len": 40},
                      vocab_size=300, max_len=24, batch_size=4, steps=9, warmup_steps=1, eval_every=9,
                      eval_batches=1, save_every=3, progress=False)
    real, calls = ck.save_file, []

    def full(*a, **k):  # the disk fills up at the second checkpoint
        calls.append(1)
        if len(calls) >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(ck, "save_file", full)
    with pytest.raises(CheckpointWriteError, match="nothing is lost.*step-00000003 is intact"):
        pretrain(cfg)
    assert latest_checkpoint(tmp_path / "run").name == "step-00000003"
    assert not list((tmp_path / "run" / "checkpoints").glob(".step-*"))
    monkeypatch.setattr(ck, "save_file", real)
    code, _, err = _resume(tmp_path / "run", capsys)
    assert code == 0, err


@pytest.mark.parametrize("point", ["checkpoint.write", "finalise.run_json"])
def test_kill_9_at_a_critical_point_then_resume(point, reference, tmp_path, cache):
    e = env(tmp_path, QKV_CACHE_DIR=str(cache))
    out = tmp_path / "run"
    assert kill_at_point(pretrain_cmd(out), e, point, tmp_path / "mark")
    r = run(resume_cmd(out), e)
    assert r.returncode == 0, r.stderr
    assert same_weights(reference, out)
    assert run_json(out)["final_eval"] == run_json(reference)["final_eval"] is not None


def _start_long(tmp_path, cache) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "run"
    e = env(tmp_path, QKV_CACHE_DIR=str(cache))
    mark = tmp_path / "mark"
    proc = subprocess.Popen(pretrain_cmd(out, 2, "--grad-accum", "100000"), stdout=subprocess.PIPE,
                            env={**e, "QKV_FAULT_PAUSE": "stop.installed:0", "QKV_FAULT_MARK": str(mark)},
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not mark.exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    time.sleep(1.5)  # inside the first step's 100,000 micro-batches
    return proc, out


def test_stop_request_is_honoured_inside_gradient_accumulation(tmp_path, cache):
    proc, out = _start_long(tmp_path, cache)
    proc.send_signal(signal.SIGTERM)
    t0 = time.time()
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.time() - t0 < 30, stderr
    assert "--resume" in stdout and run_json(out)["status"] == "interrupted"


def test_a_second_stop_request_exits_at_once(tmp_path, cache):
    proc, out = _start_long(tmp_path, cache)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    t0 = time.time()
    proc.communicate(timeout=60)
    assert proc.returncode in (130, -signal.SIGINT) and time.time() - t0 < 15
    assert (out / "run.json").is_file()
