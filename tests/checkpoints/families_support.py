"""What the family tests share: perturbed transformers models, right-padded batches, comparisons
at the real positions."""

import torch

B, T = 5, 7
LENGTHS = (7, 4, 7, 2, 5)  # right padding after these many real tokens
TAGS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")


def perturb(model, seed=0):
    """Random weights far from the init (LayerNorms included) so that a swapped tensor shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def batch(vocab_size, pad_token_id, type_vocab_size=0, seed=0):
    """``(ids, mask, types)``: real ids never equal to the pad id (RoBERTa counts positions by it),
    padding with the pad id; ``types`` is ``None`` when the family has no segments."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size - 1, (B, T), generator=g)
    ids = ids + (ids >= pad_token_id).long()  # skip the pad id
    mask = (torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]).long()  # (B,T)
    ids = ids.masked_fill(mask == 0, pad_token_id)
    types = torch.randint(0, type_vocab_size, (B, T), generator=g) if type_vocab_size else None
    return ids, mask, types


def close_at_real(a, b, mask, atol=1e-5, msg=""):
    """``a`` and ``b`` ``(B,T,…)`` agree at the positions where ``mask`` is 1."""
    real = mask.bool()
    torch.testing.assert_close(a[real], b[real], atol=atol, rtol=0, msg=msg)


def compare(ours, theirs, ids, mask, types=None, *, logits=True, atol=1e-5):
    """Every hidden state and (when ``logits``) the logits of a qkv model and a transformers
    model agree at the real positions; returns both outputs."""
    kw = dict(attention_mask=mask, output_hidden_states=True)
    if types is not None:
        kw["token_type_ids"] = types
    with torch.no_grad():
        a, b = ours(ids, **kw), theirs(ids, **kw)
    assert len(a.hidden_states) == len(b.hidden_states)
    for i, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
        close_at_real(x, y, mask, atol, msg=f"hidden state {i}")
    if logits:
        close_at_real(a.logits, b.logits, mask, atol, msg="logits")
    else:
        close_at_real(a.last_hidden_state, b.last_hidden_state, mask, atol, msg="last hidden state")
    return a, b
