"""Smoke test: benchmarks/embed.py runs every competitor on a few documents and reports ratios."""

from __future__ import annotations

import json

import pytest
from bench_support import load_script


def test_embed_benchmark_runs_every_competitor(tmp_path, capsys, minilm):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "r.json"
    bench = load_script("embed")
    assert bench.main(["--limit", "6", "--max-len", "32", "--repeats", "1", "--batch-size", "4",
                       "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {r["implementation"]: r for r in result["rows"]}
    assert {"ort-fp32", "ort-int8", "sentence-transformers", "transformers", "qkv-fp32"} <= set(rows)
    assert set(rows) | set(result["skipped"]) >= {"qkv-fp32", "qkv-bf16", "qkv-int8"}
    assert rows["ort-fp32"]["vs_ort_fp32"] == 1.0
    for name in ("qkv-fp32", "sentence-transformers", "transformers", "ort-fp32"):
        assert rows[name]["worst_cosine_to_fp32"] > 0.99999, name  # same vectors
    assert "× ort-fp32" in capsys.readouterr().out
