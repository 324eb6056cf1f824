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
    with pytest.raises(ValueError, match="unknown preset 'huge'; allowed: tiny, cpu-small, mini, small, base"):
        ModelConfig.preset("huge")
    assert set(PRESETS) == {"tiny", "cpu-small", "mini", "small", "base"}


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
])
def test_validation_names_value_and_allowed(field, value, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.preset("tiny", **{field: value})


def test_unknown_field_in_dict():
    with pytest.raises(ValueError, match=r"unknown ModelConfig field\(s\) \['hidden_size'\]; allowed: vocab_size"):
        ModelConfig.from_dict({"hidden_size": 3})
