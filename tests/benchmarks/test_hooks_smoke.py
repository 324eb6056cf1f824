"""Smoke test: benchmarks/hooks.py removes exactly the hook check and runs end to end (no timing asserted)."""

from __future__ import annotations

import inspect

import torch
from bench_support import load_script


def test_the_stripped_model_has_no_hook_check_and_the_same_numbers():
    from qkv.config import ModelConfig
    from qkv.models.builders import build_encoder
    from qkv.nn.attention import MultiHeadAttention
    from qkv.nn.layer import TransformerLayer

    bench = load_script("hooks")
    for cls in (MultiHeadAttention, TransformerLayer):
        assert bench.CHECK in inspect.getsource(cls.forward)
        assert bench.without_hook_check(cls).forward.__code__.co_filename.endswith("without the hook check>")
    torch.manual_seed(0)
    model = build_encoder(ModelConfig.preset("tiny", dropout=0.0)).eval()
    plain = bench.stripped(model)
    assert all(type(m).__name__.endswith("WithoutHookCheck") for m in plain.modules()
               if isinstance(m, (MultiHeadAttention, TransformerLayer)))
    ids = torch.randint(1, 97, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, plain(ids).last_hidden_state)


def test_quick_run(capsys):
    rows = load_script("hooks").main(["--quick"])
    assert len(rows) == 1 and rows[0]["ratio"] > 0
    assert "ratio" in capsys.readouterr().out
