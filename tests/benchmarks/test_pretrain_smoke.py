"""Smoke tests: benchmarks/pretrain.py, inference.py, precision.py, threads.py and recipe_sweep.py
run end to end on a tiny config."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from bench_support import load_script, missing_flags

pytest.importorskip("transformers")


def test_pretrain_help_lists_the_flags():
    flags = ("--preset", "--steps", "--warmup", "--batch-size", "--seq-len", "--compile", "--bf16", "--json",
             "--threads", "--optimizer")
    assert missing_flags(load_script("pretrain"), *flags) == []


def test_pretrain_tiny_two_steps(tmp_path, capsys):
    bench = load_script("pretrain")
    out = tmp_path / "pretrain.json"
    assert bench.main(["--preset", "tiny", "--steps", "2", "--warmup", "1", "--batch-size", "4",
                       "--seq-len", "16", "--profile-steps", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ratio qkv/hf" in text and "MFU" in text and "dropout 0" in text
    res = json.loads(out.read_text())["results"][0]
    assert res["preset"] == "tiny" and len(res["losses"]["qkv"]) == 3
    # same weights, same batches, dropout 0: the two libraries train the same function
    assert res["loss_max_diff"] <= 1e-4
    assert res["flops_per_token"]["qkv"]["total"] < res["flops_per_token"]["hf"]["total"]
    assert res["gemm_gflops"] > 0 and res["profile"]["qkv"]


def test_inference_tiny(tmp_path, capsys):
    bench = load_script("inference")
    out = tmp_path / "inference.json"
    assert bench.main(["--preset", "tiny", "--seq-len", "16", "--min-len", "4", "--reps", "2",
                       "--warmup", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == list(bench.CASES)
    for r in rows:
        assert r["max_abs_diff"] < 1e-4 and r["ratio"] > 0
    mixed = rows[1]
    assert mixed["real_tokens"] < mixed["batch"] * mixed["padded_len"]  # there is padding


# --- the library paths these benchmarks rely on (no-grad in-place sums, AdamW impls; the packed
# encoder is tested in tests/nn/test_packed.py)

def test_no_grad_forward_equals_grad_forward():
    from qkv.config import ModelConfig
    from qkv.models.builders import build_encoder

    for norm in ("post", "pre"):
        enc = build_encoder(ModelConfig.preset("tiny", norm=norm, activation="gelu_tanh")).eval()
        ids = torch.randint(1, 97, (3, 8))
        with torch.no_grad():
            fast = enc(ids).last_hidden_state
        torch.testing.assert_close(fast, enc(ids).last_hidden_state.detach(), atol=0, rtol=0)


def test_adamw_implementations_agree():
    from qkv.training.optim import build_optimizer

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5))
    results = {}
    for impl in ("auto", "fused", "foreach", "single"):
        model = __import__("copy").deepcopy(base)
        opt = build_optimizer(model, lr=1e-2, weight_decay=0.1, impl=impl)
        for step in range(3):
            torch.manual_seed(step)
            model(torch.randn(4, 6)).square().sum().backward()
            opt.step()
            opt.zero_grad()
        results[impl] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert build_optimizer(base, lr=1e-3, weight_decay=0.0).defaults["fused"] is True  # CPU: fused
    for impl, flat in results.items():
        torch.testing.assert_close(flat, results["single"], atol=1e-6, rtol=1e-6, msg=impl)
    with pytest.raises(ValueError, match="unknown AdamW implementation 'x'"):
        build_optimizer(base, lr=1e-3, weight_decay=0.0, impl="x")


def test_precision_benchmark_runs_three_arms_and_prints_the_ratio(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path / "cache"))
    bench = load_script("precision")
    png = tmp_path / "bf16.png"
    assert bench.main(["--steps", "3", "--batch-size", "2", "--max-len", "16", "--corpus", "dataset:pydoc",
                       "--vocab-size", "300", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "bf16 speed" in out and "seed-to-seed difference" in out and png.stat().st_size > 1000


def test_recipe_sweep_commands_are_qkv_pretrain_commands_that_parse():
    from qkv.cli import build_parser
    from qkv.training.cli import config_from_args

    sweep = load_script("recipe_sweep")
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
    bench = load_script("threads")
    assert bench.main(["--steps", "2", "--preset", "tiny", "--batch-size", "2", "--max-len", "8", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "| idle |" in out and "| one other CPU-bound process |" in out and "as fast as" in out
