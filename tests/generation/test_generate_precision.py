"""Decoding in bf16 and int8 against float32 on a GPT-2-shaped causal LM: the log-probabilities of every
position within the stated bounds, and greedy decoding's first token float32's choice up to a near tie
(the agreement over whole continuations is what ``benchmarks/generate.py`` reports)."""

from __future__ import annotations

import pytest
import torch

from qkv.config import ModelConfig
from qkv.generation.loop import generate
from qkv.hardware import precision_unsupported
from qkv.inference import for_inference, inference_precision
from qkv.models.builders import build_causal_lm

#: Largest |log p(token) − log p_fp32(token)| over a vocabulary, stated in docs/generation.md.
BOUNDS = {"bf16": 0.05, "int8": 0.1}


@pytest.fixture(scope="module")
def gpt2_small():
    torch.manual_seed(0)
    cfg = ModelConfig.preset("gpt2", vocab_size=1000, n_layers=4, d_model=128, n_heads=4, d_ff=512, max_len=64,
                             dropout=0.0)
    return build_causal_lm(cfg).eval()


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_log_probabilities_within_the_bound_of_float32(gpt2_small, precision):
    if precision_unsupported(precision, torch.device("cpu")):
        pytest.skip(f"{precision} is not offered on this CPU")
    ids = torch.randint(0, 1000, (4, 48), generator=torch.Generator().manual_seed(1))
    prepared = for_inference(gpt2_small, precision, smoothing=None)
    with torch.no_grad():
        ref = gpt2_small(ids).logits.log_softmax(-1)  # (B,T,V)
        got = prepared(ids).logits.float().log_softmax(-1)
    assert (got - ref).abs().max().item() <= BOUNDS[precision]
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_greedy_decoding_over_the_cache_starts_as_float32(gpt2_small, precision):
    if precision_unsupported(precision, torch.device("cpu")):
        pytest.skip(f"{precision} is not offered on this CPU")
    prompt = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(2))
    prepared = for_inference(gpt2_small, precision, smoothing=None)
    got = generate(prepared, prompt, max_new_tokens=16)
    assert got.shape == (2, 28)
    with torch.no_grad():
        ref = gpt2_small(prompt).logits[:, -1].log_softmax(-1)  # (B,V) float32's next-token log-probabilities
    first = got[:, 12]
    # the first new token is float32's choice, or one float32 rates within the bound of its choice (a near tie)
    gap = ref.max(-1).values - ref.gather(-1, first[:, None]).squeeze(-1)
    assert (gap <= 2 * BOUNDS[precision]).all(), gap


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_generation_runs_the_converted_head_on_the_last_position_only(gpt2_small, precision):
    """The tied head has its own bf16 / int8 map (not float32's table product); the loop sends it one
    row per sequence each step, prompt included; each chosen token's log-probability, the prepared
    model's against float32's on the same continuation, within the bound."""
    if precision_unsupported(precision, torch.device("cpu")):
        pytest.skip(f"{precision} is not offered on this CPU")
    prepared = for_inference(gpt2_small, precision, smoothing=None)
    assert prepared.vocab_proj is not None and inference_precision(prepared) == precision
    rows = []
    handle = prepared.vocab_proj.register_forward_pre_hook(lambda _m, args: rows.append(args[0].shape[:-1]))
    prompt = torch.randint(0, 1000, (3, 10), generator=torch.Generator().manual_seed(4))
    try:
        got = generate(prepared, prompt, max_new_tokens=8)
    finally:
        handle.remove()
    assert rows == [torch.Size([3])] * 8
    with torch.no_grad():
        ref = gpt2_small(got).logits[:, 9:-1].log_softmax(-1)  # (B,8,V): the positions that chose a token
        lp = prepared(got).logits[:, 9:-1].float().log_softmax(-1)
    chosen = got[:, 10:, None]  # (B,8,1)
    gap = (lp.gather(-1, chosen) - ref.gather(-1, chosen)).abs()
    assert gap.max().item() <= BOUNDS[precision]
