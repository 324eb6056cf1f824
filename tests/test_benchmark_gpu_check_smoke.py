"""benchmarks/gpu_check.py: without a GPU it says so and checks nothing; its checks and timings run end
to end on the CPU (``--device cpu --quick``), so the script works when a GPU is there."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("qkv_bench_gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script checks it")
def test_without_a_gpu_it_says_so_and_checks_nothing(capsys):
    assert _load().main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_the_checks_run_end_to_end_on_the_cpu(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        assert _load().main(["--device", "cpu", "--quick", "--json", str(tmp_path / "r.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["failures"] == [] and len(result["checks"]) >= 10
    assert any("training step" in r["timing"] for r in result["timings"])
