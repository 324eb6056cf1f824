"""benchmarks/embed.py --memory: qkv's modes and ONNX Runtime each embed alone in a fresh process and
report their resident memory in the same table (a few documents); ``--device cuda`` without a GPU says
so. No timing or size is compared."""

from __future__ import annotations

import json

import pytest
import torch
from bench_support import load_script


def test_memory_rows_for_qkv_and_onnx_runtime(tmp_path, capsys, minilm):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "r.json"
    assert load_script("embed").main(["--limit", "4", "--max-len", "24", "--repeats", "1", "--batch-size",
                                      "2", "--threads", "1", "--only", "ort-fp32", "qkv-fp32", "qkv-int8",
                                      "--memory", "--json", str(out)]) == 0
    mem = json.loads(out.read_text())["memory"]
    assert {"ort-fp32", "qkv-fp32"} <= set(mem)
    for name, m in mem.items():
        assert 0 < m["loaded_mb"] <= m["peak_mb"], name
    assert "peak MB" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script times it")
def test_device_cuda_without_a_gpu_says_so(capsys):
    assert load_script("embed").main(["--device", "cuda"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
