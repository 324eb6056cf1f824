"""Smoke test: benchmarks/attention.py still imports, parses its flags and runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from bench_support import BENCHMARKS, load_script, missing_flags


def test_help_lists_the_flags():
    flags = ("--quick", "--sizes", "--reps", "--json", "--memory", "--additive-backward")
    assert missing_flags(load_script("attention"), *flags) == []


def test_impls_agree_with_copied_weights():
    bench = load_script("attention")
    mods = bench.build_impls(24, 3)
    x = torch.randn(5, 7, 24)
    outs = {name: bench.run_once(name, mods[name], x, backward=False) for name in bench.IMPLS}
    torch.testing.assert_close(outs["qkv"], outs["torch"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["sdpa"], outs["torch"], atol=1e-5, rtol=1e-5)


def test_quick_run_end_to_end(tmp_path, capsys):
    bench = load_script("attention")
    out = tmp_path / "bench.json"
    # in-process, timing only: the memory runs each start a Python, measured below once
    rc = bench.main(["--quick", "--sizes", "16", "--reps", "1", "--warmup", "0", "--heads", "2",
                     "--d-head", "8", "--memory", "none", "--json", str(out)])
    assert rc == 0
    assert "Acceptance" in capsys.readouterr().out  # timing at N=16 is noise; it must only run
    res = json.loads(out.read_text())
    assert res["timing"][0]["N"] == 16
    assert res["timing"][0]["max_abs_diff_qkv_torch"] < 1e-5
    assert res["checks"][0]["name"].startswith("fwd+bwd time qkv/torch")


def test_memory_subprocess_reports_peak_and_weights():
    bench = load_script("attention")
    r = bench.measure_memory(bench.spec("qkv", 16, 2, 2, 8, need_weights=True), timeout=120)
    assert "error" not in r, r
    assert r["weights_shape"] == [2, 2, 16, 16]
    assert r["weights_bytes"] == 2 * 2 * 16 * 16 * 4
    assert r["peak_bytes"] >= 0


def test_variants_section_runs_and_prints_ratios(tmp_path, capsys):
    """``attention.py --variants``: GQA, MQA, qk-norm and window against plain, in process, timing only."""
    bench = load_script("attention")
    out = tmp_path / "variants.json"
    rc = bench.main(["--variants", "--quick", "--sizes", "16", "--heads", "4", "--d-head", "8",
                     "--memory", "none", "--json", str(out)])
    assert rc == 0
    assert "ratio to plain" in capsys.readouterr().out
    row = json.loads(out.read_text())["timing"][0]
    assert row["N"] == 16 and row["plain"]["ratio_plain"] == 1.0
    assert {"gqa", "mqa", "qk_norm", "window"} <= set(row)


def test_variants_memory_subprocess_and_layers():
    variants = load_script("attention_variants")
    built = {v: variants.build_variant(v, 32, 4, kv_heads=2, window=8) for v in variants.VARIANTS}
    assert built["gqa"].n_kv_heads == 2 and built["mqa"].n_kv_heads == 1
    assert built["qk_norm"].qk_norm is not None and built["window"].window == 8
    r = variants.measure_memory({"variant": "window", "N": 32, "B": 1, "H": 4, "d_head": 8, "kv_heads": 2,
                                 "window": 8}, timeout=120)
    assert "error" not in r, r
    assert r["peak_bytes"] >= 0


def test_call_path_counts_the_files_of_both_paths(tmp_path):
    """benchmarks/call_path.py: a tiny pretraining run and qkv.embed, each with its file counts."""
    out = tmp_path / "paths.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "call_path.py"), "--json", str(out)], check=False,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    kernel, pooling = rows["pretrain → kernel"], rows["qkv.embed → pooling"]
    assert kernel["stack"][0] == "cli.py" and kernel["stack"][-1].startswith("nn/backends/")
    assert pooling["stack"] == ["embeddings/embedder.py", "embeddings/pooling.py"]
    assert kernel["files_run"] == len(kernel["files"]) > 20 and "nn/attend.py" in pooling["files"]
