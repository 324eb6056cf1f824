"""Smoke test: benchmarks/serve.py starts qkv serve and the hand-written sentence-transformers server,
drives both, and reports throughput, latency, agreement of their vectors and the memory check."""

from __future__ import annotations

import json

import pytest
from bench_support import load_script


@pytest.mark.slow  # ~40 s on a shared 2-core machine: three processes load torch, transformers and the model
def test_serve_benchmark_drives_both_servers(tmp_path, capsys, minilm):
    pytest.importorskip("sentence_transformers")
    out = tmp_path / "r.json"
    assert load_script("serve").main(["--clients", "1", "4", "--seconds", "0.5", "--warmup", "0.2",
                                      "--memory-requests", "120", "--no-bf16", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["rows"]) == {"qkv-fp32", "st"}
    for name, by_clients in result["rows"].items():
        assert set(by_clients) == {"1", "4"}, name
        for cell in by_clients.values():
            assert cell["errors"] == 0 and cell["requests"] > 0 and cell["p99_ms"] >= cell["p50_ms"] > 0
    assert result["worst_cosine_to_qkv_fp32"]["st"] > 0.9999  # both serve the same vectors
    assert result["memory"]["requests"] == 120 and result["memory"]["rss_mb"]
    assert "qkv-fp32 / st" in capsys.readouterr().out
