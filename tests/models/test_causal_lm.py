"""The causal LM: causality, the next-token loss against a hand-written one, tying, save/load."""

import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv.config import ModelConfig
from qkv.models.builders import build_causal_lm
from qkv.models.causal_lm import IGNORE_INDEX, CausalLM, shift_labels


def _model(**kw):
    torch.manual_seed(0)
    return build_causal_lm(ModelConfig.preset("tiny", norm="pre", dropout=0.0, **kw)).eval()


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "relative", "t5", "alibi", "rope"])
def test_later_tokens_do_not_change_earlier_logits(position):
    model = _model(position=position)
    ids = torch.randint(1, 97, (2, 9))
    changed = ids.clone()
    changed[:, 6:] = 5
    a, b = model(ids).logits, model(changed).logits  # (B,T,V)
    assert torch.equal(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_loss_is_the_shifted_cross_entropy_over_scored_positions():
    model = _model()
    ids = torch.randint(1, 97, (3, 8))
    labels = ids.clone()
    labels[1, 5:] = IGNORE_INDEX  # padding is not scored
    out = model(ids, labels=labels)
    logits = model(ids).logits  # (B,T,V)
    targets = torch.cat([labels[:, 1:], torch.full((3, 1), IGNORE_INDEX)], 1)
    expected = F.cross_entropy(logits.reshape(-1, 97), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(out.loss, expected)
    assert out.logits.shape == (int((targets != IGNORE_INDEX).sum()), 97)
    assert torch.equal(shift_labels(labels), targets)


def test_head_is_tied_to_token_embeddings():
    model = _model()
    assert model.decoder_weight is model.decoder.embeddings.tokens.weight
    h = torch.randn(4, 24)
    torch.testing.assert_close(model.logits(h), h @ model.decoder.embeddings.tokens.weight.T)


def test_no_embedding_norm_and_no_padding_row():
    model = _model(embedding_norm=False, pad_token_id=None, type_vocab_size=0)
    assert isinstance(model.decoder.embeddings.norm, torch.nn.Identity)
    assert model.decoder.embeddings.tokens.padding_idx is None


def test_position_ids_shift_absolute_positions():
    model = _model(position="learned")
    ids = torch.randint(1, 97, (1, 5))
    left = torch.cat([torch.zeros(1, 2, dtype=torch.long), ids], 1)  # two pad tokens on the left
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    padded = model(left, mask, position_ids=pos).logits[:, 2:]
    torch.testing.assert_close(padded, model(ids).logits, atol=1e-5, rtol=1e-5)


def test_save_load_round_trip(tmp_path):
    model = _model(position="alibi")
    ids = torch.randint(1, 97, (2, 6))
    qkv.save(model, tmp_path / "m")
    loaded = qkv.load(tmp_path / "m").model
    assert isinstance(loaded, CausalLM)
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_refusals():
    with pytest.raises(ValueError, match="pooler"):
        build_causal_lm(ModelConfig.preset("tiny", pooler=True))
    with pytest.raises(ValueError, match="embedding_size"):
        build_causal_lm(ModelConfig.preset("tiny", embedding_size=12))
    enc = qkv.build_encoder(ModelConfig.preset("tiny"))
    with pytest.raises(ValueError, match="causal=True"):
        CausalLM(enc)
