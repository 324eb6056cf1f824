"""Temperature, top-k and top-p against hand computations; draws follow the filtered distribution."""

import math

import pytest
import torch

from qkv.generation.sampling import filter_logits, next_tokens

PROBS = [0.5, 0.2, 0.15, 0.1, 0.05]  # already sorted, for hand-computed nuclei


def _logits():
    return torch.tensor([[math.log(p) for p in PROBS]])


def _kept(scores):
    return torch.isfinite(scores[0]).nonzero()[:, 0].tolist()


@pytest.mark.parametrize("p, kept", [(0.5, [0]), (0.51, [0, 1]), (0.7, [0, 1]), (0.71, [0, 1, 2]),
                                     (0.9, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3, 4]), (1e-6, [0])])
def test_top_p_keeps_the_smallest_set_reaching_p(p, kept):
    assert _kept(filter_logits(_logits(), top_p=p)) == kept


def test_top_p_in_vocabulary_order():
    logits = _logits()[:, [3, 0, 4, 2, 1]]  # probs 0.1, 0.5, 0.05, 0.15, 0.2
    assert _kept(filter_logits(logits, top_p=0.8)) == [1, 3, 4]  # 0.5 + 0.2 + 0.15 ≥ 0.8


@pytest.mark.parametrize("k, kept", [(1, [0]), (3, [0, 1, 2]), (5, [0, 1, 2, 3, 4]), (9, [0, 1, 2, 3, 4])])
def test_top_k(k, kept):
    assert _kept(filter_logits(_logits(), top_k=k)) == kept


def test_temperature_then_top_k_then_top_p():
    logits = _logits()
    t = 2.0
    scaled = logits / t  # hand: probs ∝ p^(1/2)
    probs = torch.tensor(PROBS).sqrt()
    probs = probs[:3] / probs[:3].sum()  # top-3 renormalised: ~0.437, 0.276, 0.239 (… of the three)
    need = int((probs.cumsum(0) - probs < 0.6).sum())  # nucleus size by hand
    got = filter_logits(logits, temperature=t, top_k=3, top_p=0.6)
    assert _kept(got) == list(range(need)) == [0, 1]
    torch.testing.assert_close(got[0, :2], scaled[0, :2])


def test_draws_follow_the_filtered_distribution():
    logits = _logits().expand(20000, 5)
    g = torch.Generator().manual_seed(0)
    tok = next_tokens(logits, do_sample=True, top_k=2, generator=g)
    share = (tok == 0).float().mean().item()
    assert set(tok.unique().tolist()) == {0, 1}
    assert abs(share - 0.5 / 0.7) < 0.02
    assert torch.equal(next_tokens(logits[:2], do_sample=False), torch.zeros(2, dtype=torch.long))
