"""ModelConfig: nested sections, presets, validation messages, JSON round-trip, format 1 migrated,
layer types, and a config module that imports nothing of the models."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from qkv.config import PRESETS, ModelConfig, flat_value, layer_period
from qkv.config_sections import AttentionConfig, FeedForwardConfig, NormConfig, PositionConfig
from qkv.models.parts import check_parts

FIXTURES = Path(__file__).parent / "fixtures" / "v1_folders"


def test_presets_have_the_documented_sizes():
    mini = ModelConfig.preset("mini")
    assert (mini.n_layers, mini.d_model, mini.attention.n_heads, mini.ffn.d_ff) == (4, 256, 4, 1024)
    small = ModelConfig.preset("small")
    assert (small.n_layers, small.d_model, small.attention.n_heads) == (6, 512, 8)
    base = ModelConfig.preset("base")
    assert (base.n_layers, base.d_model, base.attention.n_heads, base.ffn.d_ff) == (12, 768, 12, 3072)
    assert (base.vocab_size, base.max_len, base.type_vocab_size) == (30522, 512, 2)
    tiny = ModelConfig.preset("tiny")
    sizes = [tiny.vocab_size, tiny.d_model, tiny.attention.n_heads, tiny.ffn.d_ff, tiny.n_layers, tiny.max_len,
             tiny.type_vocab_size, tiny.d_head]
    assert len(set(sizes)) == len(sizes), "tiny sizes must be distinct so that swapped axes fail"


def test_the_sections_are_nested_dataclasses():
    cfg = ModelConfig()
    assert isinstance(cfg.attention, AttentionConfig) and isinstance(cfg.positions, PositionConfig)
    assert isinstance(cfg.ffn, FeedForwardConfig) and isinstance(cfg.norm, NormConfig)
    top = {f.name for f in dataclasses.fields(ModelConfig)}
    assert len(top) <= 20 and {"attention", "positions", "ffn", "norm", "layer_types", "decoder", "image"} <= top
    nested = ModelConfig(d_model=24, attention=AttentionConfig(n_heads=3), ffn=FeedForwardConfig(d_ff=40))
    assert nested == ModelConfig.from_flat(d_model=24, n_heads=3, d_ff=40)


def test_defaults_keep_the_fast_attention_path():
    cfg = ModelConfig()
    assert cfg.attention.dropout == 0.0 and cfg.attention.backend == "auto"
    assert cfg.norm.eps == 1e-12


def test_preset_overrides_flat_nested_and_unknown_preset():
    assert ModelConfig.preset("tiny", n_layers=5).n_layers == 5
    assert ModelConfig.preset("tiny", attention={"n_heads": 2}).attention.n_heads == 2
    assert ModelConfig.preset("tiny", n_heads=2) == ModelConfig.preset("tiny", attention={"n_heads": 2})
    with pytest.raises(ValueError, match="n_heads and attention.n_heads both given"):
        ModelConfig.preset("tiny", n_heads=2, attention={"n_heads": 2})
    with pytest.raises(ValueError, match="unknown preset 'huge'; allowed: tiny, cpu-small, cpu-small-clm, mini, small, base, modernbert, gpt2"):
        ModelConfig.preset("huge")
    assert set(PRESETS) == {"tiny", "cpu-small", "cpu-small-clm", "mini", "small", "base", "modernbert", "gpt2"}


def test_attention_path_is_now_backend():
    assert ModelConfig.preset("tiny", attention_path="chunked").attention.backend == "chunked"
    assert ModelConfig.preset("tiny", backend="chunked").attention.backend == "chunked"
    assert "attention_path" not in json.dumps(ModelConfig().to_dict())


def test_modernbert_preset_matches_transformers_defaults():
    """The preset against transformers' ModernBertConfig() (ModernBERT-base's shape)."""
    from transformers import ModernBertConfig

    hf = ModernBertConfig()
    cfg = ModelConfig.preset("modernbert")
    assert (cfg.vocab_size, cfg.d_model, cfg.attention.n_heads, cfg.ffn.d_ff, cfg.n_layers, cfg.max_len) == (
        hf.vocab_size, hf.hidden_size, hf.num_attention_heads, hf.intermediate_size, hf.num_hidden_layers,
        hf.max_position_embeddings)
    assert (cfg.norm.eps, cfg.pad_token_id, cfg.ffn.activation) == (hf.norm_eps, hf.pad_token_id,
                                                                     hf.hidden_activation)
    assert (cfg.norm.bias, cfg.attention.bias, cfg.ffn.bias, cfg.head_bias) == (
        hf.norm_bias, hf.attention_bias, hf.mlp_bias, hf.classifier_bias) == (False,) * 4
    assert hf.classifier_activation == cfg.ffn.activation and hf.decoder_bias
    assert cfg.attention.window == hf.local_attention and layer_period(cfg) == 3
    types = ["full_attention" if t == "global" else "sliding_attention" for t in cfg.layer_types]
    assert types == list(hf.layer_types)
    assert cfg.positions.rope_base == hf.rope_parameters["full_attention"]["rope_theta"] == 160000
    assert cfg.positions.local_rope_base == hf.rope_parameters["sliding_attention"]["rope_theta"] == 10000
    assert cfg.dropout == hf.embedding_dropout == hf.mlp_dropout == hf.attention_dropout == 0
    assert (cfg.norm.placement, cfg.positions.scheme, cfg.type_vocab_size, cfg.ffn.kind, cfg.norm.first_attention) == (
        "pre", "rope", 0, "glu", False)
    assert (cfg.norm.kind, cfg.embed_scale) == ("layernorm", False)


def test_layer_types_one_per_layer_and_follow_n_layers_in_a_preset():
    cfg = ModelConfig.preset("modernbert", n_layers=5)
    assert cfg.layer_types == ("global", "local", "local", "global", "local")
    assert [cfg.is_local(i) for i in range(5)] == [False, True, True, False, True]
    custom = ModelConfig.preset("tiny", local_window=4, layer_types=["local", "global"])
    assert custom.layer_types == ("local", "global") and layer_period(custom) is None
    with pytest.raises(ValueError, match=r"layer_types must list one type per layer \(2\)"):
        ModelConfig.preset("tiny", local_window=4, layer_types=["local"])
    with pytest.raises(ValueError, match="layer_types entry='sliding' is not allowed; allowed: global, local"):
        ModelConfig.preset("tiny", local_window=4, layer_types=["sliding", "global"])
    with pytest.raises(ValueError, match="local layers but attention.window is None"):
        ModelConfig.preset("tiny", layer_types=["global", "local"])


def test_first_attention_norm_needs_pre_ln():
    with pytest.raises(ValueError, match=r"norm.first_attention=False needs norm.placement='pre' \(got 'post'\)"):
        ModelConfig.preset("tiny", first_attention_norm=False)
    assert ModelConfig.preset("tiny", norm="pre", first_attention_norm=False).norm.first_attention is False


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
    from qkv.checkpoints.families._common import _PLAIN

    assert _PLAIN["shared_qk"] is False  # no Hugging Face family writes a shared query/key map


@pytest.mark.parametrize("cfg", [ModelConfig(), ModelConfig.preset(
    "tiny", similarity="cosine", similarity_kwargs={"temperature": 2.0}, norm="pre", position="none",
    chunk_size=4, backend="chunked", activation="relu"), ModelConfig.preset("modernbert", n_layers=4)])
def test_json_round_trip(cfg):
    again = ModelConfig.from_json(cfg.to_json())
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()
    assert set(json.loads(cfg.to_json())["attention"]) >= {"n_heads", "backend", "similarity", "window"}


def test_a_format_1_config_migrates():
    """Every format-1 ``qkv.json`` this repository keeps (written by the flat code) reads as nested."""
    for meta in sorted(FIXTURES.glob("*/qkv.json")):
        flat = json.loads(meta.read_text())["config"]
        assert "attention_path" in flat and "attention" not in flat  # format 1
        cfg = ModelConfig.from_dict(flat)
        for name, value in flat.items():
            if name == "global_every":
                continue
            got = flat_value(cfg, name)
            assert (list(got) if isinstance(got, tuple) else got) == value, name
    modern = ModelConfig.from_dict(json.loads((FIXTURES / "mlm_modern" / "qkv.json").read_text())["config"])
    assert modern.layer_types == ("global", "local") and modern.attention.window == 4


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig().d_model = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig().attention.n_heads = 3


@pytest.mark.parametrize("field,value,message", [
    ("norm", "middle", "norm.placement='middle' is not allowed; allowed: post, pre"),
    ("n_heads", 5, "attention.n_heads=5 does not divide d_model=24 .*; allowed: \\[1, 2, 3, 4, 6, 8, 12, 24\\]"),
    ("n_kv_heads", 2, "attention.n_kv_heads=2 does not divide n_heads=3"),
    ("d_model", 0, "d_model=0 must be an int ≥ 1"),
    ("dropout", 1.0, "dropout=1.0 must be a number in \\[0, 1\\)"),
    ("attention_dropout", 1.0, "attention.dropout=1.0 must be a number in \\[0, 1\\)"),
    ("layer_norm_eps", 0.0, "norm.eps=0.0 must be a positive number"),
    ("pad_token_id", 97, "pad_token_id=97 must be < vocab_size=97"),
    ("qkv_proj", 1, "attention.qkv_proj=1 must be True or False"),
    ("head_bias", "no", "head_bias='no' must be True or False"),
    ("embed_scale", 1, "embed_scale=1 must be True or False"),
])
def test_validation_names_value_and_allowed(field, value, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.preset("tiny", **{field: value})


@pytest.mark.parametrize("field,value,message", [
    ("activation", "swish", "ffn.activation='swish' is not allowed; allowed: gelu, gelu_tanh, relu"),
    ("similarity", "euclid", "attention.similarity='euclid' is not allowed; allowed: .*scaled_dot"),
    ("position", "spiral", "positions.scheme='spiral' is not allowed; allowed: .*learned"),
    ("attention_path", "gpu", "attention.backend='gpu' is not allowed"),
    ("norm_type", "batchnorm", "norm.kind='batchnorm' is not allowed; allowed: layernorm, rmsnorm"),
    ("feed_forward", "moe", "ffn.kind='moe' is not allowed; allowed: mlp, glu"),
    ("qk_norm", "batch", "attention.qk_norm='batch' is not allowed; allowed: none, layernorm, rmsnorm"),
])
def test_names_are_resolved_by_the_builders_not_the_config(field, value, message):
    cfg = ModelConfig.preset("tiny", **{field: value})  # the config holds a name; it resolves nothing
    with pytest.raises(ValueError, match=message):
        check_parts(cfg)
    from qkv.models.builders import build_encoder

    with pytest.raises(ValueError, match=message):
        build_encoder(cfg)


def test_qk_only_positions_need_an_input_encoding():
    with pytest.raises(ValueError, match="positions.qk_only=True needs an input encoding; positions.scheme='rope'"):
        check_parts(ModelConfig.preset("tiny", position="rope", position_qk_only=True))


def test_unknown_field_in_dict():
    with pytest.raises(ValueError, match=r"unknown ModelConfig field\(s\) \['hidden_size'\]; allowed: vocab_size"):
        ModelConfig.from_dict({"hidden_size": 3})
    with pytest.raises(ValueError, match=r"unknown attention field\(s\) \['heads'\]; allowed: n_heads"):
        ModelConfig.from_dict({"attention": {"heads": 3}})


def test_the_config_module_imports_nothing_of_the_models_or_plugins():
    code = ("import sys, qkv.config; bad = sorted(m for m in sys.modules if m.startswith(('qkv.nn', 'qkv.models', "
            "'qkv.plugins', 'torch'))); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
