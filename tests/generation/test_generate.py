"""generate: greedy equals a naive recompute-everything loop and transformers' GPT-2 generate;
sampling is reproducible per seed; eos handling; the bad inputs."""

import pytest
import torch

from qkv.config import ModelConfig
from qkv.generation.loop import generate
from qkv.generation.prompts import pad_prompts
from qkv.models.builders import build_causal_lm, build_masked_lm


def _model(**kw):
    torch.manual_seed(0)
    kw = dict(dict(norm="pre", dropout=0.0, max_len=40), **kw)
    return build_causal_lm(ModelConfig.preset("tiny", **kw)).eval()


def _naive_greedy(model, ids, n, mask=None):
    """Recompute everything each step, argmax of the last position."""
    seqs = ids
    for _ in range(n):
        pos = None if mask is None else (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(seqs, mask, position_ids=pos).logits[:, -1]  # (B,V)
        seqs = torch.cat([seqs, logits.argmax(-1, keepdim=True)], 1)
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return seqs


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "relative", "t5", "alibi", "rope", "none"])
def test_greedy_equals_naive_loop(position):
    model = _model(position=position)
    ids = torch.randint(1, 97, (2, 5))
    expected = _naive_greedy(model, ids, 12)
    assert torch.equal(generate(model, ids, max_new_tokens=12), expected)
    assert torch.equal(model.generate(ids, max_new_tokens=12, use_cache=False), expected)


def test_greedy_left_padded_batch_equals_each_prompt_alone():
    model = _model(position="learned")
    prompts = [[5, 6, 7, 8, 9], [11, 12], [20, 21, 22]]
    ids, mask = pad_prompts(prompts)
    assert mask.tolist()[1] == [0, 0, 0, 1, 1]
    out = generate(model, ids, attention_mask=mask, max_new_tokens=8)
    assert torch.equal(out[:, :5], ids)
    for i, p in enumerate(prompts):
        alone = generate(model, torch.tensor([p]), max_new_tokens=8)
        assert out[i, 5:].tolist() == alone[0, len(p):].tolist()
    assert torch.equal(out, _naive_greedy(model, ids, 8, mask))


def test_eos_fills_the_row_with_pad_and_stops_when_all_done():
    model = _model(position="rope")
    ids = torch.randint(1, 97, (2, 4))
    free = generate(model, ids, max_new_tokens=10)
    eos = int(free[0, 6])  # the 3rd new token of row 0
    out = generate(model, ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=0)
    first = (free[0, 4:] == eos).nonzero()[0, 0] + 4
    assert torch.equal(out[0, : first + 1], free[0, : first + 1])
    assert (out[0, first + 1 :] == 0).all()
    row1 = free[1, 4:]
    if not (row1 == eos).any():
        assert out.shape[1] == 14 and torch.equal(out[1], free[1])
    both = generate(model, ids[:1], max_new_tokens=10, eos_token_id=eos)
    assert both.shape[1] == first + 1  # stopped early: the only row is done
    assert int(both[0, -1]) == eos


def test_sampling_reproducible_per_seed_and_independent_of_global_rng():
    model = _model(position="alibi")
    ids = torch.randint(1, 97, (3, 4))
    opts = dict(max_new_tokens=15, do_sample=True, temperature=1.5, top_k=50, top_p=0.95)
    torch.manual_seed(1)
    a = generate(model, ids, seed=7, **opts)
    torch.manual_seed(2)
    b = generate(model, ids, seed=7, **opts)
    c = generate(model, ids, seed=8, **opts)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(generate(model, ids, seed=7, use_cache=False, **opts), a)


def test_streamer_gets_each_step():
    model = _model()
    got = []
    out = generate(model, torch.tensor([[3, 4, 5]]), max_new_tokens=6, streamer=got.append)
    assert torch.equal(torch.stack(got, 1), out[:, 3:])


def test_sliding_keeps_the_last_window_and_matches_the_naive_loop():
    model = _model(position="learned", max_len=8)
    ids = torch.randint(1, 97, (2, 6))
    with pytest.raises(ValueError, match="sliding=True"):
        generate(model, ids, max_new_tokens=5)
    out = generate(model, ids, max_new_tokens=7, sliding=True)
    seqs = ids
    for _ in range(7):  # naive: the last max_len - 1 tokens once the sequence outgrows the window
        ctx = seqs if seqs.shape[1] <= 8 else seqs[:, -7:]
        with torch.no_grad():
            nxt = model(ctx).logits[:, -1].argmax(-1, keepdim=True)
        seqs = torch.cat([seqs, nxt], 1)
    assert torch.equal(out, seqs)
    assert torch.equal(generate(model, ids, max_new_tokens=7, sliding=True, use_cache=False), seqs)
    long = torch.randint(1, 97, (1, 11))  # longer than the window itself
    with pytest.raises(ValueError, match="longer than the model's window max_len=8"):
        generate(model, long, max_new_tokens=1)
    assert generate(model, long, max_new_tokens=3, sliding=True).shape == (1, 14)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_new_tokens=0), "max_new_tokens must be an int ≥ 1"),
    (dict(temperature=0.0, do_sample=True), "temperature must be > 0"),
    (dict(top_k=0, do_sample=True), "top_k must be an int ≥ 1"),
    (dict(top_p=0.0, do_sample=True), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5, do_sample=True), r"top_p must be in \(0, 1\]"),
    (dict(attention_mask=torch.tensor([[0, 0, 0]])), "empty prompt"),
    (dict(max_new_tokens=40), "sliding=True"),
    (dict(attention_mask=torch.tensor([[1, 1, 0]])), "left-padded"),
])
def test_bad_inputs_are_one_line_value_errors(kwargs, match):
    model = _model()
    with pytest.raises(ValueError, match=match) as err:
        generate(model, torch.tensor([[1, 2, 3]]), **kwargs)
    assert "\n" not in str(err.value)


def test_empty_prompt_and_wrong_model():
    model = _model()
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="empty prompt"):
        pad_prompts([[1, 2], []])
    mlm = build_masked_lm(ModelConfig.preset("tiny"))
    with pytest.raises(ValueError, match="needs a causal LM"):
        generate(mlm, torch.tensor([[1, 2, 3]]))
