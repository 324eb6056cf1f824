"""Smoke test: benchmarks/vision.py runs end to end on a tiny shape, and both models start equal."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "vision.py"


def test_vision_benchmark_tiny(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("qkv_bench_vision", PATH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    out = tmp_path / "v.json"
    assert bench.main(["--width", "24", "--layers", "2", "--heads", "3", "--ffn", "40", "--size", "12",
                       "--patch", "4", "--batch-size", "5", "--steps", "2", "--warmup", "1", "--json", str(out)]) == 0
    torch.set_num_threads(threads)
    r = json.loads(out.read_text())
    assert r["first_loss"]["qkv"] == pytest.approx(r["first_loss"]["transformers"], rel=1e-5)
    assert r["ratio"] > 0 and "ratio" in capsys.readouterr().out
