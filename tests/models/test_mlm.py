"""Masked-LM model: tied decoder, sparse = dense prediction, parameter counts against transformers."""

import pytest
import torch
import torch.nn.functional as F

from qkv.config import ModelConfig
from qkv.models.builders import build_encoder, build_masked_lm
from qkv.models.mlm import IGNORE_INDEX, MaskedLMOutput

B, T = 5, 7


def _model(**overrides):
    torch.manual_seed(0)
    return build_masked_lm(ModelConfig.preset("tiny", **overrides)).eval()


def _batch(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, cfg.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    labels = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    labels[torch.rand(B, T, generator=g) > 0.3] = IGNORE_INDEX
    labels[1, 4:] = IGNORE_INDEX
    labels[0, 0] = 5  # at least one labelled position
    return ids, mask, labels


def test_decoder_is_tied_to_word_embeddings():
    m = _model()
    assert m.decoder_weight is m.encoder.embeddings.tokens.weight
    names = [n for n, _ in m.named_parameters()]
    assert not any("decoder" in n for n in names)


def test_logits_without_labels_follow_the_head_formula():
    m = _model()
    ids, mask, _ = _batch(m.config)
    out = m(ids, mask)
    assert isinstance(out, MaskedLMOutput) and out.loss is None
    assert out.logits.shape == (B, T, m.config.vocab_size)
    h = m.encoder(ids, mask).last_hidden_state
    t = F.layer_norm(F.gelu(h @ m.head.dense.weight.T + m.head.dense.bias), (m.config.d_model,),
                     m.head.norm.weight, m.head.norm.bias, eps=m.config.norm.eps)
    want = t @ m.encoder.embeddings.tokens.weight.T + m.head.bias
    torch.testing.assert_close(out.logits, want, atol=1e-5, rtol=1e-5)


def test_sparse_prediction_equals_dense():
    m = _model()
    ids, mask, labels = _batch(m.config)
    picked = labels != IGNORE_INDEX
    sparse = m(ids, mask, labels=labels)
    assert sparse.logits.shape == (int(picked.sum()), m.config.vocab_size)
    m.zero_grad()
    sparse.loss.backward()
    g_sparse = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.sparse_prediction = False
    dense = m(ids, mask, labels=labels)
    assert dense.logits.shape == (B, T, m.config.vocab_size)
    torch.testing.assert_close(sparse.loss, dense.loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(sparse.logits, dense.logits[picked], atol=1e-6, rtol=1e-6)
    m.zero_grad()
    dense.loss.backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(g_sparse[n], p.grad, atol=1e-6, rtol=1e-5, msg=n)
    want = F.cross_entropy(dense.logits[picked], labels[picked])
    torch.testing.assert_close(dense.loss, want, atol=1e-6, rtol=1e-6)


def test_labels_shape_is_checked():
    m = _model()
    ids, mask, labels = _batch(m.config)
    with pytest.raises(ValueError, match=r"labels must have the shape of input_ids \(5, 7\), got \(5, 6\)"):
        m(ids, mask, labels=labels[:, :6])


def test_hidden_states_and_attentions_pass_through():
    m = _model()
    ids, mask, labels = _batch(m.config)
    out = m(ids, mask, labels=labels, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == m.config.n_layers + 1
    assert out.attentions[0].shape == (B, m.config.attention.n_heads, T, T)


def _count(model):
    return sum(p.numel() for p in model.parameters())


def test_base_parameter_counts_equal_transformers_bert():
    transformers = pytest.importorskip("transformers")
    cfg = ModelConfig.preset("base")
    with torch.device("meta"):
        encoder = build_encoder(cfg)
        mlm = build_masked_lm(cfg)
        bert = transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False)
        bert_mlm = transformers.BertForMaskedLM(transformers.BertConfig())
    assert _count(encoder) == _count(bert)
    assert _count(mlm) == _count(bert_mlm)
    assert _count(bert_mlm) > 109_000_000  # really BERT-base


def test_modernbert_parameter_counts_equal_transformers_modernbert():
    transformers = pytest.importorskip("transformers")
    cfg = ModelConfig.preset("modernbert")
    hf_cfg = transformers.ModernBertConfig()
    with torch.device("meta"):
        encoder = build_encoder(cfg)
        mlm = build_masked_lm(cfg)
        hf = transformers.ModernBertModel(hf_cfg)
        hf_mlm = transformers.ModernBertForMaskedLM(hf_cfg)
    assert _count(encoder) == _count(hf)
    assert _count(mlm) == _count(hf_mlm)
    assert 149_000_000 < _count(hf_mlm) < 150_000_000  # really ModernBERT-base (149M)


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_bias_free_head_matches_modernbert_prediction_head(norm_type):
    """ModernBERT's head: ``norm(act(dense(h)))`` without biases, then the tied decoder plus a bias."""
    from transformers import ModernBertConfig
    from transformers.models.modernbert.modeling_modernbert import ModernBertPredictionHead

    m = _model(norm="pre", norm_type=norm_type, norm_bias=False, head_bias=False, layer_norm_eps=1e-5)
    assert m.head.dense.bias is None and getattr(m.head.norm, "bias", None) is None
    torch.manual_seed(3)
    with torch.no_grad():
        m.head.norm.weight.copy_(torch.randn(m.config.d_model))
        m.head.bias.copy_(torch.randn(m.config.vocab_size))
    ids, mask, _ = _batch(m.config)
    h = m.encoder(ids, mask).last_hidden_state
    if norm_type == "layernorm":
        ref = ModernBertPredictionHead(ModernBertConfig(hidden_size=m.config.d_model, num_attention_heads=3,
                                                        classifier_bias=False, norm_bias=False, norm_eps=1e-5))
        with torch.no_grad():
            ref.dense.weight.copy_(m.head.dense.weight)
            ref.norm.weight.copy_(m.head.norm.weight)
            t = ref(h)
    else:  # by hand: RMSNorm(gelu(W h))
        u = F.gelu(h @ m.head.dense.weight.T)
        t = u / torch.sqrt((u * u).mean(-1, keepdim=True) + 1e-5) * m.head.norm.weight
    want = t @ m.encoder.embeddings.tokens.weight.T + m.head.bias
    torch.testing.assert_close(m(ids, mask).logits, want, atol=1e-5, rtol=1e-5)


def test_modern_variants_round_trip_through_a_qkv_folder(tmp_path):
    import qkv

    m = _model(norm="pre", norm_type="rmsnorm", feed_forward="glu", activation="silu", embed_scale=True,
               first_attention_norm=False, norm_bias=False, mlp_bias=False, attention_bias=False,
               head_bias=False, position="rope", type_vocab_size=0)
    assert [n for n, _ in m.named_parameters() if "bias" in n] == ["head.bias"]  # the decoder's only
    ids, mask, _ = _batch(m.config)
    qkv.save(m, tmp_path / "m")
    again = qkv.load(tmp_path / "m").model
    assert again.config == m.config
    torch.testing.assert_close(again(ids, mask).logits, m(ids, mask).logits, atol=0, rtol=0)
