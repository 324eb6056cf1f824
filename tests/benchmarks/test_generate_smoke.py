"""Smoke test: benchmarks/generate.py imports, parses its flags and runs end to end (--quick)."""

from __future__ import annotations

import json

import torch
from bench_support import load_script, missing_flags


def test_help_lists_the_flags():
    flags = ("--quick", "--size", "--prefixes", "--steps", "--json", "--no-hf")
    assert missing_flags(load_script("generate"), *flags) == []


def test_copied_gpt2_gives_the_same_logits():
    bench = load_script("generate")
    model = bench.build_model("tiny", 32)
    hf = bench.copy_to_gpt2(model)
    ids = torch.randint(0, 512, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, rtol=1e-4, atol=1e-4)


def test_quick_run_end_to_end(tmp_path, capsys):
    bench = load_script("generate")
    out = tmp_path / "gen.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    assert "cache flatness" in capsys.readouterr().out  # timings at these sizes are noise; it must run
    res = json.loads(out.read_text())
    assert [r["prefix"] for r in res["latency"]] == [16, 64]
    assert res["versus_transformers"]["tokens_agree"]


def test_precision_table_runs_and_fp32_agrees_with_itself():
    bench = load_script("generate")
    model = bench.build_model("tiny", 40)
    rows = bench.precision_table(model, 8, 4, 1, ["fp32", "int8"], [1, 2])
    assert [(r["batch"], r["precision"]) for r in rows] == [(1, "fp32"), (1, "int8"), (2, "fp32"), (2, "int8")]
    fp32 = [r for r in rows if r["precision"] == "fp32"]
    assert all(r["agree_with_fp32"] == 1.0 and r["mean_abs_logprob_gap"] == 0.0 for r in fp32)
    assert all(r["qkv_tokens_per_s"] > 0 and r["hf_fp32_tokens_per_s"] > 0 for r in rows)
