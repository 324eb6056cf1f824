"""EncoderDecoder: the loss against a hand computation, causality, cross-attention reaching the
source, greedy generation against a step-by-step argmax, the decoder layer's formulas, save/load."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv.config import ModelConfig
from qkv.models.builders import build_encoder_decoder
from qkv.errors import CheckpointError
from qkv.models.seq2seq import shift_right


def _config(**kw):
    base = dict(vocab_size=20, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=24, type_vocab_size=0, dropout=0.0)
    return ModelConfig.from_flat(**{**base, **kw})


def _model(**kw):
    torch.manual_seed(0)
    return build_encoder_decoder(_config(**kw)).eval()


def test_shift_right_puts_the_start_token_first_and_pads_ignored_labels():
    labels = torch.tensor([[5, 6, 2, -100]])
    assert shift_right(labels, 1, 0).tolist() == [[1, 5, 6, 2]]
    assert shift_right(torch.tensor([[5, -100, -100]]), 1, 0).tolist() == [[1, 5, 0]]


def test_loss_is_the_mean_cross_entropy_of_the_scored_labels():
    m = _model()
    x = torch.randint(3, 20, (2, 5))
    labels = torch.tensor([[4, 5, 6, 2], [7, 2, -100, -100]])
    out = m(x, labels=labels)
    dec_in = torch.tensor([[1, 4, 5, 6], [1, 7, 2, 0]])
    logits = m(x, decoder_input_ids=dec_in).logits
    torch.testing.assert_close(out.logits, logits)
    picked = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
    by_hand = torch.stack([-F.log_softmax(logits[b, t], -1)[labels[b, t]] for b, t in picked]).mean()
    torch.testing.assert_close(out.loss, by_hand)


def test_head_is_tied_to_the_one_shared_token_table():
    m = _model()
    assert m.decoder.embeddings.tokens is m.encoder.embeddings.tokens
    names = [n for n in m.state_dict() if "tokens" in n]
    assert names == ["encoder.embeddings.tokens.weight"]


@pytest.mark.parametrize("position", ["learned", "rope", "relative-alibi", "t5"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_is_causal_and_reads_the_source(position, norm):
    m = _model(position=position, norm=norm)
    x = torch.randint(3, 20, (1, 6))
    y = torch.randint(3, 20, (1, 5))
    base = m(x, decoder_input_ids=y).logits
    y2 = y.clone()
    y2[0, 3] = (y[0, 3] + 1 - 3) % 17 + 3  # change decoder token 3: positions 0…2 must not move
    changed = m(x, decoder_input_ids=y2).logits
    torch.testing.assert_close(base[:, :3], changed[:, :3])
    assert not torch.allclose(base[:, 3:], changed[:, 3:])
    x2 = x.clone()
    x2[0, -1] = (x[0, -1] + 1 - 3) % 17 + 3  # the last source token: every decoder position sees it
    assert not torch.allclose(base[:, 0], m(x2, decoder_input_ids=y).logits[:, 0])


def test_source_padding_changes_nothing():
    m = _model()
    x = torch.randint(3, 20, (1, 4))
    y = torch.randint(3, 20, (1, 3))
    padded = torch.cat([x, torch.zeros(1, 2, dtype=torch.long)], 1)
    mask = padded != 0
    torch.testing.assert_close(m(x, decoder_input_ids=y).logits, m(padded, mask, decoder_input_ids=y).logits,
                               atol=1e-5, rtol=1e-5)


def test_generate_is_the_step_by_step_argmax():
    m = _model(norm="pre")
    x = torch.randint(3, 20, (3, 5))
    got = m.generate(x, max_new_tokens=6)
    seq = torch.full((3, 1), 1)
    for _ in range(6):
        nxt = m(x, decoder_input_ids=seq).logits[:, -1].argmax(-1)
        seq = torch.cat([seq, nxt[:, None]], 1)
    assert torch.equal(got, seq)


def test_generate_stops_at_eos_and_pads_after_it():
    m = _model()
    x = torch.randint(3, 20, (2, 5))
    first = m.generate(x, max_new_tokens=1)[:, 1]
    out = m.generate(x, max_new_tokens=5, eos_token_id=int(first[0]))
    assert out.shape[1] <= 6 and int(out[0, 1]) == int(first[0]) and torch.all(out[0, 2:] == 0)


def test_output_attentions_have_the_textbook_shapes():
    m = _model()
    out = m(torch.randint(3, 20, (2, 7)), decoder_input_ids=torch.randint(3, 20, (2, 4)), output_attentions=True)
    assert [a.shape for a in out.cross_attentions] == [(2, 4, 4, 7)] * 2
    assert [a.shape for a in out.decoder_attentions] == [(2, 4, 4, 4)] * 2
    assert torch.all(out.decoder_attentions[0].triu(1) == 0)
    torch.testing.assert_close(out.cross_attentions[1].sum(-1), torch.ones(2, 4, 4))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_layer_follows_its_formulas(norm):
    m = _model(norm=norm)
    layer = m.decoder.layers[0]
    x, mem = torch.randn(2, 4, 32), torch.randn(2, 5, 32)
    sa = lambda h: layer.self_attention(h, causal=True).output  # noqa: E731
    ca = lambda h: layer.cross_attention(h, context=mem).output  # noqa: E731
    n1, n2, n3, ff = layer.norm1, layer.norm2, layer.norm3, layer.feed_forward
    if norm == "post":
        h1 = n1(x + sa(x))
        h2 = n2(h1 + ca(h1))
        y = n3(h2 + ff(h2))
    else:
        h1 = x + sa(n1(x))
        h2 = h1 + ca(n2(h1))
        y = h2 + ff(n3(h2))
    torch.testing.assert_close(layer(x, mem).output, y)


def test_save_load_round_trip_and_no_hf_export(tmp_path):
    m = _model(position="rope", norm="pre")
    qkv.save(m, tmp_path / "m")
    loaded = qkv.load(tmp_path / "m").model
    assert type(loaded).__name__ == "EncoderDecoder"
    x, y = torch.randint(3, 20, (2, 5)), torch.randint(3, 20, (2, 4))
    torch.testing.assert_close(loaded(x, decoder_input_ids=y).logits, m(x, decoder_input_ids=y).logits)
    with pytest.raises(CheckpointError, match="qkv format"):
        qkv.export_hf(m, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_builder_refuses_a_pooler_and_untied_widths():
    with pytest.raises(ValueError, match="pooler"):
        build_encoder_decoder(_config(pooler=True))
    with pytest.raises(ValueError, match="embedding_size"):
        build_encoder_decoder(_config(embedding_size=16))
