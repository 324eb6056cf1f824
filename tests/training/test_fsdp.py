"""Sharded training (``--strategy fsdp``) in real processes: torchrun on the loopback address with gloo.

FSDP2 on two ranks equals DDP on two ranks; a sharded checkpoint written by two ranks, killed, resumes
on one and on two ranks with the next step's loss of the uninterrupted run; two "nodes" (two torchrun
agents meeting at a c10d rendezvous on 127.0.0.1) equal one process with the same global batch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import torch
from distributed_support import (LOOPBACK, env, free_port, kill_all, node, pretrain_args, qkv, records,
                                 torchrun, train_losses)
from safetensors.torch import load_file

TOL = 1e-5


def _run(cmd: list[str], e: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    return r


def _close(a: Path, b: Path, tol: float = TOL) -> None:
    la, lb = records(a), records(b)
    assert len(la) == len(lb) >= 5
    for ra, rb in zip(la, lb):
        assert ra["step"] == rb["step"]
        for key in ("loss", "eval_loss", "accuracy", "grad_norm"):
            if key in ra:
                assert abs(ra[key] - rb[key]) < tol, (key, ra, rb)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=tol, rtol=0, msg=k)


def test_fsdp_on_two_ranks_equals_ddp_on_two_ranks(tmp_path):
    e = env(tmp_path)
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    _run(torchrun(*pretrain_args(ddp, grad_accum=2)), e)
    _run(torchrun(*pretrain_args(fsdp, grad_accum=2, strategy="fsdp")), e)
    _close(ddp, fsdp)
    ckpt = fsdp / "checkpoints" / (fsdp / "checkpoints" / "LATEST").read_text().strip()
    state = json.loads((ckpt / "trainer.json").read_text())
    assert state["format"] == "sharded" and state["world_size"] == 2 and state["strategy"] == "fsdp"
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "trainer.json"]
    assert not (ckpt / "model.safetensors").exists()
    import qkv as api  # the final folder is an ordinary model folder

    assert api.load(fsdp).model.config.vocab_size == api.load(ddp).model.config.vocab_size


def test_sharded_checkpoint_of_two_ranks_resumes_on_one_and_on_two(tmp_path):
    e = dict(env(tmp_path), QKV_FAULT_PAUSE="checkpoint.latest:5", QKV_FAULT_MARK=str(tmp_path / "mark"))
    part = tmp_path / "part"
    # killed during its checkpoint of step 6 (each checkpoint pauses 5 s before LATEST is switched):
    # LATEST still names step 3; the log holds the losses of steps 1-6 of the uninterrupted run
    proc = subprocess.Popen(torchrun(*pretrain_args(part, steps=6, strategy="fsdp")), env=e,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    try:
        while not (part / "checkpoints" / "step-00000006").is_dir():
            assert proc.poll() is None and time.time() < deadline, "the run ended before its checkpoint of step 6"
            time.sleep(0.05)
    finally:
        kill_all(proc.pid)  # the agent and both ranks, at once
        proc.wait()
    assert (tmp_path / "mark").read_text().split() == ["checkpoint.latest", "checkpoint.latest"]
    assert (part / "checkpoints" / "LATEST").read_text().strip() == "step-00000003"
    assert not (part / "model.safetensors").exists()
    want = train_losses(part)
    assert sorted(want) == [1, 2, 3, 4, 5, 6]
    one, two = tmp_path / "one", tmp_path / "two"
    shutil.copytree(part, one)
    shutil.copytree(part, two)
    e = env(tmp_path)
    r = _run(qkv("pretrain", "--out", str(one), "--resume", "--no-progress"), e)
    assert "continues with 8 blocks per process" in r.stdout
    _run(torchrun("pretrain", "--out", str(two), "--resume", "--no-progress"), e)
    for resumed in (one, two):
        got = train_losses(resumed)
        assert sorted(got) == [1, 2, 3, 4, 5, 6]
        for step in (4, 5, 6):  # the steps after the checkpoint: the uninterrupted run's losses
            assert abs(got[step] - want[step]) < TOL, (resumed.name, step, got[step], want[step])
    _close(one, two)


def test_two_nodes_on_the_loopback_equal_one_process(tmp_path):
    e = env(tmp_path)
    one = tmp_path / "one"
    _run(qkv(*pretrain_args(one, batch=8)), e)
    two = tmp_path / "two"
    cmd = node(*pretrain_args(two, batch=4, strategy="fsdp"), endpoint=f"{LOOPBACK}:{free_port()}", run_id="qkv-test")
    nodes = [subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in nodes:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-4000:]
    meta = json.loads((two / "run.json").read_text())
    assert meta["world_size"] == 2 and meta["status"] == "complete"
    _close(one, two)

