"""Greedy generate equals transformers' GPT-2 greedy generate token for token (same weights)."""

import pytest
import torch

from qkv.generation.loop import generate
from qkv.generation.prompts import pad_prompts

from gpt2_support import gpt2_pair


@pytest.mark.parametrize("sizes", [dict(d_model=32, n_heads=4, n_layers=2), dict(d_model=48, n_heads=3, n_layers=3)])
def test_logits_match_gpt2(sizes):
    hf, model = gpt2_pair(**sizes)
    ids = torch.randint(0, 101, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sizes", [dict(d_model=32, n_heads=4, n_layers=2), dict(d_model=48, n_heads=3, n_layers=3)])
def test_greedy_generate_matches_transformers(sizes):
    hf, model = gpt2_pair(**sizes)
    ids = torch.randint(1, 101, (1, 7))
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                         pad_token_id=0)
    assert torch.equal(generate(model, ids, max_new_tokens=20), theirs)


def test_left_padded_batch_matches_transformers():
    hf, model = gpt2_pair(d_model=32, n_heads=4, n_layers=2, seed=3)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [20, 21, 22, 23]]
    ids, mask = pad_prompts(prompts, pad_token_id=0)
    theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=15, do_sample=False, pad_token_id=0)
    ours = generate(model, ids, attention_mask=mask, max_new_tokens=15, pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_eos_matches_transformers():
    hf, model = gpt2_pair(d_model=32, n_heads=4, n_layers=2, seed=1)
    ids, mask = pad_prompts([[5, 6, 7], [8, 9, 10, 11, 12]], pad_token_id=0)
    free = generate(model, ids, attention_mask=mask, max_new_tokens=12)
    eos = int(free[0, 7])
    theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=eos,
                         pad_token_id=1)
    ours = generate(model, ids, attention_mask=mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=1)
    assert torch.equal(ours, theirs)
