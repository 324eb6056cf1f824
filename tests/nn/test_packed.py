"""The padding-free entry point: :class:`qkv.nn.packed.PackedBatch` and ``Encoder.forward_packed``.

The packed encoder is checked against the padded one (an independent computation: masks instead
of per-sequence attention) at every real position, for every position slot and both norms, with
segments, the pooler, gradients, and bad input. The run helpers (runs of equal-length sequences,
their views) are checked against the sequences cut out one by one.
"""

from __future__ import annotations

import pytest
import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_encoder
from qkv.nn.packed import PackedBatch, first_sequences, run_view, runs_by_length

LENGTHS = [9, 3, 5, 0, 7, 3]  # an empty sequence, two of equal length (one batched attention call)


def _batch(seed=0, vocab=97, lengths=LENGTHS):
    g = torch.Generator().manual_seed(seed)
    n = torch.tensor(lengths)
    T = int(n.max())
    mask = torch.arange(T)[None] < n[:, None]  # (B,T) right-padded
    ids = torch.randint(1, vocab, (len(lengths), T), generator=g).masked_fill(~mask, 0)
    return ids, mask


@pytest.mark.parametrize("overrides", [dict(), dict(norm="pre", position="rope"), dict(position="relative"),
                                       dict(position="alibi"), dict(position="t5"),
                                       dict(position="learned", position_qk_only=True),
                                       dict(similarity="additive"), dict(qkv_proj=False, out_proj=False)])
def test_packed_equals_the_padded_path_at_real_positions(overrides):
    torch.manual_seed(0)
    enc = build_encoder(ModelConfig.preset("tiny", dropout=0.0, **overrides)).eval()
    ids, mask = _batch()
    want = enc(ids, mask, output_hidden_states=True)
    batch = PackedBatch.from_padded(ids, mask)
    got = enc.forward_packed(batch, output_hidden_states=True)
    assert got.last_hidden_state.shape == (sum(LENGTHS), enc.embeddings.tokens.embedding_dim)
    assert got.lengths == tuple(LENGTHS)
    for a, p in zip(want.hidden_states, got.hidden_states):
        b = batch.unpack(p, ids.shape[1])  # (N,C) -> (B,T,C)
        torch.testing.assert_close(b[mask], a[mask], atol=1e-5, rtol=1e-5)
        assert (b[~mask] == 0).all()
    torch.testing.assert_close(got.hidden_states[-1], got.last_hidden_state, atol=0, rtol=0)


@pytest.mark.parametrize("overrides", [dict(), dict(norm="pre", position="alibi"),
                                       dict(position="rope", n_kv_heads=1),
                                       dict(local_window=4, global_every=2)])
def test_packed_attention_weights_equal_the_padded_ones(overrides):
    torch.manual_seed(2)
    enc = build_encoder(ModelConfig.preset("tiny", dropout=0.0, **overrides)).eval()
    ids, mask = _batch(2)
    want = enc(ids, mask, output_attentions=True).attentions  # L × (B,H,T,T), zeros at padded keys
    got = enc.forward_packed(PackedBatch.from_padded(ids, mask), output_attentions=True).attentions
    assert len(got) == len(want) == enc.config.n_layers
    keep = (mask[:, None, :, None] & mask[:, None, None, :]).expand_as(want[0])  # (B,H,T,T) real query × key
    for a, b in zip(want, got):
        assert b.shape == a.shape
        torch.testing.assert_close(b[keep], a[keep], atol=1e-6, rtol=1e-5)
        assert (b[~keep] == 0).all()
        real = b.sum(-1)[mask[:, None, :].expand(-1, b.shape[1], -1)]  # rows of real queries sum to 1
        torch.testing.assert_close(real, torch.ones_like(real))
    assert enc.forward_packed(PackedBatch.from_padded(ids, mask)).attentions is None


def test_an_empty_sequence_between_two_of_one_length_keeps_the_weights_in_place():
    torch.manual_seed(4)
    enc = build_encoder(ModelConfig.preset("tiny", dropout=0.0)).eval()
    ids, mask = _batch(4, lengths=[4, 4, 0, 4])  # sequence 3's weights belong to sequence 3, not 2
    want = enc(ids, mask, output_attentions=True).attentions[0]  # (B,H,T,T)
    got = enc.forward_packed(PackedBatch.from_padded(ids, mask), output_attentions=True).attentions[0]
    keep = (mask[:, None, :, None] & mask[:, None, None, :]).expand_as(want)  # (B,H,T,T) real query × key
    torch.testing.assert_close(got[keep], want[keep], atol=1e-6, rtol=1e-5)
    assert (got[2] == 0).all() and (got[~keep] == 0).all()


def test_packed_attention_weights_of_a_causal_stack_equal_the_padded_ones():
    torch.manual_seed(3)
    enc = build_encoder(ModelConfig.preset("tiny", dropout=0.0, norm="pre"), causal=True).eval()
    ids, mask = _batch(3)
    want = enc(ids, mask, output_attentions=True).attentions
    got = enc.forward_packed(PackedBatch.from_padded(ids, mask), output_attentions=True).attentions
    keep = (mask[:, None, :, None] & mask[:, None, None, :]).expand_as(want[0])  # (B,H,T,T)
    for a, b in zip(want, got):
        torch.testing.assert_close(b[keep], a[keep], atol=1e-6, rtol=1e-5)
        assert (b.triu(1) == 0).all()  # nothing above the diagonal


def test_packed_trains_with_gradients_equal_to_the_padded_path():
    torch.manual_seed(1)
    enc = build_encoder(ModelConfig.preset("tiny", dropout=0.0, position="relative"))
    ids, mask = _batch(1)
    enc(ids, mask).last_hidden_state[mask].square().sum().backward()
    want = {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}
    enc.zero_grad()
    enc.forward_packed(PackedBatch.from_padded(ids, mask)).last_hidden_state.square().sum().backward()
    for name, g in want.items():
        got = dict(enc.named_parameters())[name].grad
        torch.testing.assert_close(got, g, atol=1e-4, rtol=1e-4, msg=lambda s: f"{name}: {s}")


def test_segments_and_pooler_on_the_packed_path():
    torch.manual_seed(2)
    enc = build_encoder(ModelConfig.preset("tiny", dropout=0.0, pooler=True)).eval()
    ids, mask = _batch(2, lengths=[4, 6, 2])
    tt = (torch.arange(ids.shape[1])[None] >= 2).long() * mask  # segment 1 from position 2
    want = enc(ids, mask, token_type_ids=tt)
    batch = PackedBatch.from_padded(ids, mask, tt)
    got = enc.forward_packed(batch)
    torch.testing.assert_close(batch.unpack(got.last_hidden_state)[mask], want.last_hidden_state[mask],
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=1e-5, rtol=1e-5)


def test_from_sequences_equals_from_padded_and_the_helpers():
    ids, mask = _batch(3)
    seqs = [row[m].tolist() for row, m in zip(ids, mask)]
    a, b = PackedBatch.from_sequences(seqs), PackedBatch.from_padded(ids, mask)
    assert torch.equal(a.input_ids, b.input_ids) and a.lengths == b.lengths
    assert a.starts.tolist() == [0, 9, 12, 17, 17, 24]
    assert a.positions().tolist()[:12] == list(range(9)) + [0, 1, 2]
    assert a.sequence_ids().tolist()[9:12] == [1, 1, 1]
    assert torch.equal(a.padding_mask(), mask)
    assert PackedBatch.from_sequences([]).lengths == ()


def _raises(needles, fn, *args, **kwargs):
    with pytest.raises(ValueError) as e:
        fn(*args, **kwargs)
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))


def test_bad_packed_input_is_named():
    enc = build_encoder(ModelConfig.preset("tiny", max_len=16))
    ids, mask = _batch(4)
    left = mask.flip(1)  # left-padded
    _raises(["right-padded", "from_sequences"], PackedBatch.from_padded, ids, left)
    _raises(["sum to", "5"], PackedBatch, torch.arange(5), (2, 2))
    _raises(["1-D integer"], PackedBatch, torch.zeros(2, 3, dtype=torch.long), (3, 3))
    _raises(["exceeds max_len=16"], enc.forward_packed, PackedBatch.from_sequences([[1] * 17]))
    _raises(["vocab_size=97", "500"], enc.forward_packed, PackedBatch.from_sequences([[1, 500]]))
    _raises(["PackedBatch", "Tensor"], enc.forward_packed, ids)


def test_runs_of_equal_lengths_are_views_of_the_sequences_one_by_one():
    lengths = [4, 4, 0, 4, 2, 2, 5, 0, 0, 1]
    H, D, N = 3, 2, sum(lengths)
    t = torch.arange(H * N * D, dtype=torch.float32).view(H, N, D)  # (H,N,D), every value distinct
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    runs = runs_by_length(lengths)
    # the reference: consecutive non-empty sequences of one length; an empty one ends a run
    assert runs == [(0, 2, 4), (8, 1, 4), (12, 2, 2), (16, 1, 5), (21, 1, 1)]
    assert first_sequences(lengths) == {starts[i]: i for i, n in enumerate(lengths) if n}
    covered = []
    for start, m, n in runs:
        view = run_view(t, start, m, n)  # (m,H,n,D)
        assert view.shape == (m, H, n, D) and view.data_ptr() == t[:, start].data_ptr()  # a view, no copy
        for j in range(m):
            i = first_sequences(lengths)[start] + j  # the run's j-th sequence
            assert lengths[i] == n
            torch.testing.assert_close(view[j], t[:, starts[i] : starts[i] + n], rtol=0, atol=0)
            covered.append(i)
    assert covered == [i for i, n in enumerate(lengths) if n]  # every non-empty sequence once, in order
