"""benchmarks/finetune.py --trainer: qkv's fine-tuning run and transformers' Trainer on the same few steps
(tiny size) — both run, the losses are logged at every step and agree; ``--device cuda`` without a GPU
says so. No timing is asserted."""

from __future__ import annotations

import json

import pytest
import torch
from bench_support import load_script, missing_flags


@pytest.fixture
def bench(minilm):
    pytest.importorskip("accelerate")  # transformers' Trainer needs it
    return load_script("finetune")


def test_help_lists_the_new_flags(bench):
    assert missing_flags(bench, "--trainer", "--reps", "--device") == []


def test_trainer_and_qkv_finetune_run_the_same_steps(tmp_path, capsys, bench):
    out = tmp_path / "r.json"
    assert bench.main(["--trainer", "--batch", "4", "--length", "16", "--steps", "3", "--warmup", "1",
                       "--json", str(out)]) == 0
    t = json.loads(out.read_text())["trainer"]
    assert t["steps_logged"] == {"qkv": 3, "Trainer": 3}
    assert t["within_tolerance"], t["losses"]  # same weights, batches and optimiser: the same losses
    printed = capsys.readouterr().out
    assert "ratio Trainer/qkv" in printed and "within the fp32 tolerance" in printed


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script times it")
def test_device_cuda_without_a_gpu_says_so(capsys, bench):
    assert bench.main(["--device", "cuda"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
