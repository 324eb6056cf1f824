"""ModelConfig: presets, validation messages, JSON round-trip."""

import dataclasses

import pytest

from qkv.config import PRESETS, ModelConfig


def test_presets_have_the_documented_sizes():
    mini = ModelConfig.preset("mini")
    assert (mini.n_layers, mini.d_model, mini.n_heads, mini.d_ff) == (4, 256, 4, 1024)
    small = ModelConfig.preset("small")
    assert (small.n_layers, small.d_model, small.n_heads) == (6, 512, 8)
    base = ModelConfig.preset("base")
    assert (base.n_layers, base.d_model, base.n_heads, base.d_ff) == (12, 768, 12, 3072)
    assert (base.vocab_size, base.max_len, base.type_vocab_size) == (30522, 512, 2)
    tiny = ModelConfig.preset("tiny")
    sizes = [tiny.vocab_size, tiny.d_model, tiny.n_heads, tiny.d_ff, tiny.n_layers, tiny.max_len,
             tiny.type_vocab_size, tiny.d_head]
    assert len(set(sizes)) == len(sizes), "tiny sizes must be distinct so that swapped axes fail"


def test_defaults_keep_the_fast_attention_path():
    cfg = ModelConfig()
    assert cfg.attention_dropout == 0.0 and cfg.attention_path == "auto"
    assert cfg.layer_norm_eps == 1e-12


def test_preset_overrides_and_unknown_preset():
    assert ModelConfig.preset("tiny", n_layers=5).n_layers == 5
    with pytest.raises(ValueError, match="unknown preset 'huge'; allowed: tiny, cpu-small, cpu-small-clm, mini, small, base, modernbert, gpt2"):
        ModelConfig.preset("huge")
    assert set(PRESETS) == {"tiny", "cpu-small", "cpu-small-clm", "mini", "small", "base", "modernbert", "gpt2"}


def test_modernbert_preset_matches_transformers_defaults():
    """The preset against transformers' ModernBertConfig() (ModernBERT-base's shape)."""
    from transformers import ModernBertConfig

    hf = ModernBertConfig()
    cfg = ModelConfig.preset("modernbert")
    assert (cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.max_len) == (
        hf.vocab_size, hf.hidden_size, hf.num_attention_heads, hf.intermediate_size, hf.num_hidden_layers,
        hf.max_position_embeddings)
    assert (cfg.layer_norm_eps, cfg.pad_token_id, cfg.activation) == (hf.norm_eps, hf.pad_token_id,
                                                                     hf.hidden_activation)
    assert (cfg.norm_bias, cfg.attention_bias, cfg.mlp_bias, cfg.head_bias) == (
        hf.norm_bias, hf.attention_bias, hf.mlp_bias, hf.classifier_bias) == (False,) * 4
    assert hf.classifier_activation == cfg.activation and hf.decoder_bias
    assert cfg.local_window == hf.local_attention and cfg.global_every == 3
    types = ["full_attention" if i % cfg.global_every == 0 else "sliding_attention" for i in range(cfg.n_layers)]
    assert types == list(hf.layer_types)
    assert cfg.rope_base == hf.rope_parameters["full_attention"]["rope_theta"] == 160000
    assert cfg.local_rope_base == hf.rope_parameters["sliding_attention"]["rope_theta"] == 10000
    assert cfg.dropout == hf.embedding_dropout == hf.mlp_dropout == hf.attention_dropout == 0
    assert (cfg.norm, cfg.position, cfg.type_vocab_size, cfg.feed_forward, cfg.first_attention_norm) == (
        "pre", "rope", 0, "glu", False)
    assert (cfg.norm_type, cfg.embed_scale) == ("layernorm", False)


def test_first_attention_norm_needs_pre_ln():
    with pytest.raises(ValueError, match="first_attention_norm=False needs norm='pre' \\(got norm='post'\\)"):
        ModelConfig.preset("tiny", first_attention_norm=False)
    assert ModelConfig.preset("tiny", norm="pre", first_attention_norm=False).first_attention_norm is False


def test_shared_qk_needs_its_own_qkv_map_and_no_grouped_heads_and_is_not_exported():
    with pytest.raises(ValueError, match="shared_qk=True needs qkv_proj=True and n_kv_heads=None"):
        ModelConfig.preset("tiny", shared_qk=True, qkv_proj=False)
    with pytest.raises(ValueError, match="shared_qk=True needs qkv_proj=True and n_kv_heads=None"):
        ModelConfig.preset("tiny", shared_qk=True, n_kv_heads=1)
    with pytest.raises(ValueError, match="shared_qk"):
        ModelConfig.preset("tiny", shared_qk="yes")
    from qkv.models.builders import build_masked_lm

    model = build_masked_lm(ModelConfig.preset("tiny", shared_qk=True, dropout=0.0))
    attn = model.encoder.layers[0].attention
    assert attn.shared_qk and tuple(attn.qkv_proj.weight.shape) == (2 * attn.d_model, attn.d_model)
    from qkv.models.families._common import _PLAIN

    assert _PLAIN["shared_qk"] is False  # no Hugging Face family writes a shared query/key map


@pytest.mark.parametrize("cfg", [ModelConfig(), ModelConfig.preset(
    "tiny", similarity="cosine", similarity_kwargs={"temperature": 2.0}, norm="pre", position="none",
    chunk_size=4, attention_path="chunked", activation="relu")])
def test_json_round_trip(cfg):
    again = ModelConfig.from_json(cfg.to_json())
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig().d_model = 3


@pytest.mark.parametrize("field,value,message", [
    ("activation", "swish", "activation='swish' is not allowed; allowed: gelu, gelu_tanh, relu"),
    ("norm", "middle", "norm='middle' is not allowed; allowed: post, pre"),
    ("similarity", "euclid", "similarity='euclid' is not allowed; allowed: .*scaled_dot"),
    ("position", "spiral", "position='spiral' is not allowed; allowed: .*learned"),
    ("attention_path", "gpu", "attention_path='gpu' is not allowed"),
    ("n_heads", 5, "n_heads=5 does not divide d_model=24; allowed: \\[1, 2, 3, 4, 6, 8, 12, 24\\]"),
    ("d_model", 0, "d_model=0 must be an int ≥ 1"),
    ("dropout", 1.0, "dropout=1.0 must be a number in \\[0, 1\\)"),
    ("layer_norm_eps", 0.0, "layer_norm_eps=0.0 must be a positive number"),
    ("pad_token_id", 97, "pad_token_id=97 must be < vocab_size=97"),
    ("qkv_proj", 1, "qkv_proj=1 must be True or False"),
    ("norm_type", "batchnorm", "norm_type='batchnorm' is not allowed; allowed: layernorm, rmsnorm"),
    ("feed_forward", "moe", "feed_forward='moe' is not allowed; allowed: mlp, glu"),
    ("head_bias", "no", "head_bias='no' must be True or False"),
    ("embed_scale", 1, "embed_scale=1 must be True or False"),
])
def test_validation_names_value_and_allowed(field, value, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.preset("tiny", **{field: value})


def test_unknown_field_in_dict():
    with pytest.raises(ValueError, match=r"unknown ModelConfig field\(s\) \['hidden_size'\]; allowed: vocab_size"):
        ModelConfig.from_dict({"hidden_size": 3})
