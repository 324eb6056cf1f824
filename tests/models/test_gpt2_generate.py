"""Greedy generation parity: ``CausalLM.generate`` on a GPT-2 checkpoint read by ``qkv.load`` gives
transformers' ``generate(..., do_sample=False)`` token for token, for one prompt and for a batch
of left-padded prompts of different lengths, with and without an end-of-sequence id."""

import pytest
import torch
from checkpoints.families_support import perturb  # tests/checkpoints (also when tests/models runs alone)

import qkv
from qkv.models.causal_lm import CausalLM

transformers = pytest.importorskip("transformers")

V, PAD, NEW = 97, 0, 12
# n_positions 32 leaves room for the longest prompt (7) and the 12 new tokens
SIZES = dict(n_embd=24, n_head=3, n_layer=2, n_positions=32, vocab_size=V, n_inner=40, bos_token_id=None,
             eos_token_id=None, pad_token_id=None)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """``(transformers GPT2LMHeadModel, the qkv CausalLM read from its folder)``, the same weights."""
    torch.manual_seed(0)
    hf = perturb(transformers.GPT2LMHeadModel(transformers.GPT2Config(**SIZES)))
    folder = tmp_path_factory.mktemp("gpt2")
    hf.save_pretrained(folder)
    model = qkv.load(folder).model
    assert isinstance(model, CausalLM)
    return hf, model


def _left_padded(lengths, seed=0):
    """``(ids, mask)``: prompts of ``lengths`` real tokens, padded on the left with :data:`PAD`."""
    t = max(lengths)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (len(lengths), t), generator=g)
    mask = (torch.arange(t)[None] >= t - torch.tensor(lengths)[:, None]).long()  # (B,T), pads first
    return ids.masked_fill(mask == 0, PAD), mask


def _both(pair, ids, mask, eos):
    hf, model = pair
    kw = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=PAD, eos_token_id=eos)
    with torch.no_grad():
        theirs = hf.generate(ids, **kw)
        ours = model.generate(ids, **kw)
    return ours, theirs


def test_single_prompt_greedy_matches_transformers(pair):
    ids, mask = _left_padded([6], seed=1)
    ours, theirs = _both(pair, ids, mask, eos=None)
    assert ours.dtype == torch.long and tuple(ours.shape) == (1, 6 + NEW)
    assert torch.equal(ours[:, :6], ids)  # the prompt, then the new tokens
    assert torch.equal(ours, theirs), (ours, theirs)


def test_batch_of_left_padded_prompts_matches_transformers(pair):
    ids, mask = _left_padded([7, 2, 5, 1], seed=2)
    ours, theirs = _both(pair, ids, mask, eos=None)
    assert tuple(ours.shape) == (4, 7 + NEW)
    assert torch.equal(ours, theirs), (ours, theirs)
    for row in range(4):  # each prompt alone gives its row's new tokens
        n = int(mask[row].sum())
        alone, _ = _both(pair, ids[row:row + 1, 7 - n:], mask[row:row + 1, 7 - n:], eos=None)
        assert torch.equal(alone[0, n:], ours[row, 7:]), row


def test_eos_ends_a_row_and_pads_it_as_transformers_does(pair):
    """An id that row 1 generates at its 4th new token, taken as the end-of-sequence id: that row
    stops there and is filled with the pad id, the others go on (or stop at their own eos)."""
    ids, mask = _left_padded([7, 3, 5], seed=3)
    free, _ = _both(pair, ids, mask, eos=None)
    eos = int(free[1, 7 + 3])
    ours, theirs = _both(pair, ids, mask, eos=eos)
    assert torch.equal(ours, theirs), (ours, theirs)
    row = theirs[1, 7:].tolist()
    first = row.index(eos)
    assert first <= 3 and all(t == PAD for t in row[first + 1:])  # the case is really exercised
