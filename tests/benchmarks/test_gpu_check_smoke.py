"""benchmarks/gpu_check.py: without a GPU it says so and checks nothing; its checks and timings run end
to end on the CPU (``--device cpu --quick``), so the script works when a GPU is there."""

from __future__ import annotations

import json

import pytest
import torch
from bench_support import load_script


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script checks it")
def test_without_a_gpu_it_says_so_and_checks_nothing(capsys):
    assert load_script("gpu_check").main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_the_checks_run_end_to_end_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert load_script("gpu_check").main(["--device", "cpu", "--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["failures"] == [] and len(result["checks"]) >= 10
    assert any("training step" in r["timing"] for r in result["timings"])
