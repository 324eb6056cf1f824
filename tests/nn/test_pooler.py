"""BERT's pooler: the formula against transformers' BertPooler, on both encoder paths, the config flag."""

import pytest
import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_encoder
from qkv.nn.packed import PackedBatch
from qkv.nn.pooler import Pooler

B, T = 5, 7


def _encoder(**overrides):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", **overrides)
    return build_encoder(cfg).eval(), cfg


def test_pooler_equals_transformers_bert_pooler():
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.modeling_bert import BertPooler

    torch.manual_seed(0)
    ours = Pooler(24)
    theirs = BertPooler(transformers.BertConfig(hidden_size=24))
    theirs.load_state_dict(ours.state_dict())
    h = torch.randn(B, T, 24)
    out = ours(h)
    assert out.shape == (B, 24)
    torch.testing.assert_close(out, theirs(h), atol=0, rtol=0)
    # and the formula itself, written out: tanh(W h[:, 0] + b)
    torch.testing.assert_close(out, torch.tanh(h[:, 0] @ ours.dense.weight.T + ours.dense.bias), atol=1e-6, rtol=0)


def test_encoder_pooler_output_on_the_padded_and_packed_paths():
    enc, cfg = _encoder(pooler=True)
    assert isinstance(enc.pooler, Pooler)
    ids = torch.randint(1, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    with torch.no_grad():
        padded = enc(ids, mask)
        packed = enc.forward_packed(PackedBatch.from_padded(ids, mask))
    assert padded.pooler_output.shape == (B, cfg.d_model)
    want = enc.pooler(padded.last_hidden_state)
    torch.testing.assert_close(padded.pooler_output, want, atol=0, rtol=0)
    torch.testing.assert_close(packed.pooler_output, padded.pooler_output, atol=1e-5, rtol=0)


def test_no_pooler_by_default():
    enc, cfg = _encoder()
    assert cfg.pooler is False and enc.pooler is None
    assert enc(torch.ones(2, 3, dtype=torch.long)).pooler_output is None
    assert not any(n.startswith("pooler.") for n in enc.state_dict())


def test_pooler_is_initialised_like_bert():
    enc, cfg = _encoder(pooler=True, initializer_range=0.5)
    w = enc.pooler.dense.weight.detach()
    assert 0.4 < float(w.std()) < 0.6, "drawn by init_weights with initializer_range, not PyTorch's default"
    assert torch.all(enc.pooler.dense.bias == 0)


def test_pooler_flag_is_validated():
    with pytest.raises(ValueError, match=r"pooler='yes' must be True or False"):
        ModelConfig.preset("tiny", pooler="yes")
    assert ModelConfig.from_json(ModelConfig.preset("tiny", pooler=True).to_json()).pooler is True
