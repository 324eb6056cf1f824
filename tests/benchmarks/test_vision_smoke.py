"""Smoke test: benchmarks/vision.py runs end to end on a tiny shape, and both models start equal."""

from __future__ import annotations

import json

import pytest
from bench_support import load_script

pytest.importorskip("transformers")


def test_vision_benchmark_tiny(tmp_path, capsys):
    bench = load_script("vision")
    out = tmp_path / "v.json"
    assert bench.main(["--width", "24", "--layers", "2", "--heads", "3", "--ffn", "40", "--size", "12",
                       "--patch", "4", "--batch-size", "5", "--steps", "2", "--warmup", "1", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["first_loss"]["qkv"] == pytest.approx(r["first_loss"]["transformers"], rel=1e-5)
    assert r["ratio"] > 0 and "ratio" in capsys.readouterr().out
