"""benchmarks/generate.py --memory: each side generates alone in a fresh process and reports its resident
memory (tiny model); ``--device cuda`` without a GPU says so. No timing or size is compared."""

from __future__ import annotations

import pytest
import torch
from bench_support import load_script, missing_flags


def test_each_side_alone_reports_its_resident_memory():
    bench = load_script("generate")
    rows = bench.peak_memory(bench.build_model("tiny", 40), ["fp32", "int8"], 2, 4)
    sides = [r["side"] for r in rows]
    assert sides[-1] == "transformers-fp32" and "qkv-fp32" in sides
    for r in rows:
        assert 0 < r["loaded_mb"] <= r["peak_mb"], r


def test_help_lists_memory_and_device():
    assert missing_flags(load_script("generate"), "--memory", "--device") == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script times it")
def test_device_cuda_without_a_gpu_says_so(capsys):
    assert load_script("generate").main(["--device", "cuda"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
