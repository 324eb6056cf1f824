"""Encoder–decoder decoding: the KV cache gives the scores of recomputation (greedy, beam, sampling),
a batch of sources of different lengths decodes as each source alone, beam search's best beam is
at least as likely as greedy's, and bad options are refused in one line."""

from __future__ import annotations

import pytest
import torch

from qkv.config import ModelConfig
from qkv.generation.seq2seq import decode
from qkv.models.builders import build_encoder_decoder

V, EOS = 97, 2


@pytest.fixture(scope="module")
def model():
    # distinct sizes: V 97, C 24, H 3, F 40, 2 encoder and 3 decoder layers
    cfg = ModelConfig.from_flat(vocab_size=V, d_model=24, n_heads=3, d_ff=40, n_layers=2, max_len=32,
                                type_vocab_size=0, dropout=0.0, norm="pre", position="sinusoidal", pad_token_id=0,
                                decoder=dict(n_layers=3, start_token_id=1, eos_token_id=EOS))
    torch.manual_seed(0)
    m = build_encoder_decoder(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)  # far from the init: varied outputs
    return m


def _batch():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, V, (4, 9), generator=g)
    lengths = torch.tensor([9, 5, 7, 2])
    mask = (torch.arange(9)[None] < lengths[:, None]).long()  # (4,9), right padding
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("options", [dict(), dict(num_beams=4), dict(num_beams=3, length_penalty=0.6),
                                     dict(do_sample=True, top_k=20, seed=5)])
def test_cache_gives_the_sequences_and_scores_of_recomputation(model, options):
    ids, mask = _batch()
    cached = decode(model, ids, mask, max_new_tokens=12, **options)
    plain = decode(model, ids, mask, max_new_tokens=12, use_cache=False, **options)
    assert cached.sequences.tolist() == plain.sequences.tolist()
    torch.testing.assert_close(cached.scores, plain.scores, atol=1e-4, rtol=0)
    assert len({tuple(r) for r in cached.sequences.tolist()}) > 1


@pytest.mark.parametrize("beams", [1, 4])
def test_a_batch_of_different_lengths_decodes_as_each_source_alone(model, beams):
    ids, mask = _batch()
    together = decode(model, ids, mask, max_new_tokens=10, num_beams=beams)
    for r in range(ids.shape[0]):
        n = int(mask[r].sum())
        alone = decode(model, ids[r:r + 1, :n], max_new_tokens=10, num_beams=beams)
        k = alone.sequences.shape[1]
        assert together.sequences[r, :k].tolist() == alone.sequences[0].tolist()
        assert (together.sequences[r, k:] == 0).all()  # pad after the end
        torch.testing.assert_close(together.scores[r], alone.scores[0], atol=1e-4, rtol=0)


def test_greedy_score_is_the_sum_of_its_token_log_probabilities(model):
    ids, mask = _batch()
    out = decode(model, ids[:1, :9], max_new_tokens=6)
    seq = out.sequences  # (1, 1+n)
    logits = model(ids[:1, :9], decoder_input_ids=seq[:, :-1]).logits  # (1,n,V)
    logp = torch.log_softmax(logits, -1).gather(-1, seq[:, 1:, None])[..., 0]  # (1,n)
    ends = (seq[0, 1:] == EOS).nonzero()
    n = int(ends[0]) + 1 if len(ends) else seq.shape[1] - 1
    torch.testing.assert_close(out.scores[0], logp[0, :n].sum(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_beams=0), "num_beams must be an int ≥ 1"),
    (dict(max_new_tokens=0), "max_new_tokens must be an int ≥ 1"),
    (dict(max_new_tokens=40), "decoder's window is max_len=32"),
    (dict(do_sample=True, num_beams=2), "sampling is offered with num_beams=1 only"),
    (dict(early_stopping="soon"), "early_stopping must be"),
])
def test_bad_options_are_refused_in_one_line(model, kwargs, match):
    ids, mask = _batch()
    with pytest.raises(ValueError, match=match) as e:
        decode(model, ids, mask, **kwargs)
    assert "\n" not in str(e.value)


def test_empty_and_too_long_sources_are_refused(model):
    with pytest.raises(ValueError, match="empty source"):
        decode(model, torch.zeros((1, 0), dtype=torch.long))
    with pytest.raises(ValueError, match="empty source"):
        decode(model, torch.tensor([[5, 6]]), torch.tensor([[0, 0]]))
    with pytest.raises(ValueError, match="longer than the model's window max_len=32"):
        decode(model, torch.randint(3, V, (1, 40)))
