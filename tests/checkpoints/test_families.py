"""The family dispatcher: model_type chooses the converter, unsupported ones are refused with the
supported list, the family a model came from is kept, and every variant field no family expresses
is refused by name on export."""

import json

import pytest

import qkv
from qkv.config import ModelConfig
from qkv.checkpoints import families
from qkv.models.builders import build_encoder
from qkv.errors import CheckpointError


@pytest.mark.parametrize("model_type", ["llama", "mbart", None])
def test_unsupported_model_type_is_refused_with_the_supported_ones(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(CheckpointError, match=rf"config.json: not a BERT checkpoint \(model_type is {model_type!r}, "
                                              r".*supported model_type values: bert, roberta, distilbert, electra, modernbert, gpt2, marian, bart, t5, vit$"):
        qkv.load(tmp_path)


def test_dispatch_by_model_type_and_family():
    assert families.for_checkpoint({"model_type": "electra"}, "x").NAME == "ELECTRA"
    assert families.for_export(ModelConfig.preset("tiny")).NAME == "BERT"  # a qkv model
    assert families.for_export(ModelConfig.preset("tiny", family="distilbert")).NAME == "DistilBERT"
    assert families.for_export(ModelConfig.preset("tiny"), "roberta").NAME == "RoBERTa"
    assert families.for_checkpoint({"model_type": "gpt2"}, "x").NAME == "GPT-2"
    with pytest.raises(CheckpointError, match=r"unknown model family 'llama'; qkv converts: bert, roberta"):
        families.get("llama")


def test_family_field_is_checked(tmp_path):
    model = build_encoder(ModelConfig.preset("tiny", family="llama"))  # the family builds nothing
    with pytest.raises(CheckpointError, match=r"unknown model family 'llama'; qkv converts: bert, roberta"):
        qkv.export_hf(model, tmp_path / "hf")
    qkv.save(build_encoder(ModelConfig.preset("tiny")), tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "qkv.json").read_text())
    meta["config"]["family"] = "llama"
    (tmp_path / "m" / "qkv.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"family='llama' is not allowed; allowed: bert, roberta, distilbert, "
                                              r"electra"):
        qkv.load(tmp_path / "m")


VARIANTS = [  # (field overrides, the field named in the refusal)
    (dict(norm_type="rmsnorm"), "norm.kind='rmsnorm'"),
    (dict(feed_forward="glu"), "ffn.kind='glu'"),
    (dict(n_kv_heads=1), "attention.n_kv_heads=1"),
    (dict(qk_norm="layernorm"), "attention.qk_norm='layernorm'"),
    (dict(local_window=4), "attention.window=4"),
    (dict(embed_scale=True), "embed_scale=True"),
    (dict(norm_bias=False), "norm.bias=False"),
    (dict(mlp_bias=False), "ffn.bias=False"),
    (dict(norm="pre", first_attention_norm=False), "norm.first_attention=False"),
    (dict(position="rope"), "positions.scheme='rope'"),
    (dict(attention_bias=False), "attention.bias=False"),
    (dict(embedding_norm=False), "norm.embeddings=False"),
]
BASES = {"bert": {}, "roberta": dict(pad_token_id=1, position_offset=2), "electra": {},
         "distilbert": dict(type_vocab_size=0)}


@pytest.mark.parametrize("family", list(BASES))
@pytest.mark.parametrize("overrides,named", VARIANTS)
def test_export_refuses_every_variant_field(tmp_path, family, overrides, named):
    config = ModelConfig.preset("tiny", family=family, **BASES[family])
    converter = families.get(family)
    converter.config_to_hf(config, "encoder")  # the base is expressible
    with pytest.raises(CheckpointError, match=rf"as a Hugging Face {converter.NAME}: .*{named} \({converter.NAME} "
                                              r"needs .*keep it in the qkv format"):
        converter.config_to_hf(config.replace(**overrides), "encoder")


def test_export_of_a_variant_model_writes_nothing(tmp_path):
    model = build_encoder(ModelConfig.preset("tiny", family="roberta", pad_token_id=1, position_offset=2,
                                             norm_bias=False))
    with pytest.raises(CheckpointError, match=r"norm.bias=False \(RoBERTa needs True\)"):
        qkv.export_hf(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_convert_help_names_the_families(capsys):
    from qkv.cli import main

    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "model_type bert, roberta, distilbert, electra, modernbert or gpt2" in text and "of the family the model came from" in text


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
def test_export_refuses_a_masked_lm_head_without_its_dense_bias(family):
    config = ModelConfig.preset("tiny", family=family, head_bias=False, **BASES[family])
    converter = families.get(family)
    converter.config_to_hf(config, "encoder")  # no head: nothing lost
    with pytest.raises(CheckpointError, match=rf"head_bias=False \({converter.NAME}'s masked-LM head has a dense "
                                              r"bias: needs True\)"):
        converter.config_to_hf(config, "masked_lm")
