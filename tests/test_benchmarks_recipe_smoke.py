"""Smoke tests: benchmarks/precision.py (bf16 vs fp32 side by side) and benchmarks/recipe_sweep.py."""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"qkv_bench_{name}", ROOT / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_precision_benchmark_runs_three_arms_and_prints_the_ratio(tmp_path, capsys):
    bench = _load("precision")
    png = tmp_path / "bf16.png"
    assert bench.main(["--steps", "3", "--batch-size", "2", "--max-len", "16", "--corpus", "dataset:pydoc",
                       "--vocab-size", "300", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "bf16 speed" in out and "seed-to-seed difference" in out and png.stat().st_size > 1000


def test_recipe_sweep_commands_are_qkv_pretrain_commands_that_parse():
    from qkv.cli import build_parser
    from qkv.training.cli import config_from_args

    sweep = _load("recipe_sweep")
    for name in sweep.CELLS:
        cmd = sweep.command(name, 2.5, Path("runs/sweep"))
        assert cmd[:2] == ["qkv", "pretrain"] and shlex.split(shlex.join(cmd)) == cmd
        cfg = config_from_args(build_parser().parse_args(cmd[1:]))
        assert cfg.time_budget == 2.5 and cfg.out == f"runs/sweep/{name}"
    base = config_from_args(build_parser().parse_args(sweep.command("base", 2.5, Path("o"))[1:]))
    assert base.model["position"] == "alibi" and base.lr == 3e-3 and base.select_rate == 0.15
    mask = config_from_args(build_parser().parse_args(sweep.command("mask-40", 2.5, Path("o"))[1:]))
    assert mask.select_rate == 0.4 and json.dumps(mask.model) == json.dumps(base.model)


def test_threads_benchmark_times_both_counts_idle_and_beside_a_busy_process(capsys):
    bench = _load("threads")
    assert bench.main(["--steps", "2", "--preset", "tiny", "--batch-size", "2", "--max-len", "8", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "| idle |" in out and "| one other CPU-bound process |" in out and "as fast as" in out
