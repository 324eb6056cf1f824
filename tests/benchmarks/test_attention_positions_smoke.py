"""Smoke test: benchmarks/attention_positions.py imports, documents its flags and runs tiny cases."""

from __future__ import annotations

import torch
from bench_support import load_script, missing_flags


def test_help_lists_the_flags():
    flags = ("--quick", "--sizes", "--variants", "--scopes", "--reps", "--warmup", "--no-memory",
             "--memory-scope", "--json")
    assert missing_flags(load_script("attention_positions"), *flags) == []


def test_every_variant_runs_in_both_scopes():
    bench = load_script("attention_positions")
    torch.set_num_threads(1)  # the conftest restores the count
    for scope in bench.SCOPES:
        res = bench.time_size(16, 1, scope, list(bench.VARIANTS), reps=1, warmup=0)
        assert set(res) == set(bench.VARIANTS)
        assert all(r["wall"] > 0 and r["cpu"] >= 0 for r in res.values())
    assert bench.batch_for(8192, quick=False) == 1 and bench.batch_for(2048, quick=False) == 8
