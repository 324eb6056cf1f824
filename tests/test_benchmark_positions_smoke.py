"""Smoke test: benchmarks/attention_positions.py imports, documents its flags and runs tiny cases."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "attention_positions.py"


def _load():
    spec = importlib.util.spec_from_file_location("qkv_bench_positions", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_lists_the_flags():
    text = _load().build_parser().format_help()
    for flag in ("--quick", "--sizes", "--variants", "--scopes", "--reps", "--warmup", "--no-memory",
                 "--memory-scope", "--json"):
        assert flag in text


def test_every_variant_runs_in_both_scopes():
    bench = _load()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for scope in bench.SCOPES:
            res = bench.time_size(16, 1, scope, list(bench.VARIANTS), reps=1, warmup=0)
            assert set(res) == set(bench.VARIANTS)
            assert all(r["wall"] > 0 and r["cpu"] >= 0 for r in res.values())
    finally:
        torch.set_num_threads(threads)
    assert bench.batch_for(8192, quick=False) == 1 and bench.batch_for(2048, quick=False) == 8
