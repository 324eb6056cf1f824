"""GPT-2 in and out: parity with transformers' GPT2LMHeadModel and GPT2Model (Conv1D maps transposed,
the tied head, right and left padding, HF-style position ids, older checkpoints with their mask
buffers, the options GPT-2 switches), the round trip back to transformers and through ``qkv
convert``, the gpt2 preset's size, and every refusal."""

import json

import pytest
import torch
from families_support import batch, close_at_real, compare, perturb

import qkv
from qkv.config import ModelConfig
from qkv.checkpoints import families
from qkv.models.builders import build_causal_lm, build_encoder
from qkv.models.causal_lm import CausalLM
from qkv.errors import CheckpointError

transformers = pytest.importorskip("transformers")

# distinct sizes, so that a swapped axis fails: C 24, H 3, layers 2, P 19, V 97, F 40
SIZES = dict(n_embd=24, n_head=3, n_layer=2, n_positions=19, vocab_size=97, n_inner=40, bos_token_id=None,
             eos_token_id=None)
V = 97


def _hf(cls="GPT2LMHeadModel", seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(**{**SIZES, **overrides})
    return perturb(getattr(transformers, cls)(cfg), seed)


def _folder(tmp_path, name="lm", cls="GPT2LMHeadModel", **overrides):
    hf = _hf(cls, **overrides)
    hf.save_pretrained(tmp_path / name)
    return hf, tmp_path / name


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def _reload(folder):
    return transformers.GPT2LMHeadModel.from_pretrained(folder).eval()


def _ids(seed, shape):
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


def test_gpt2_lm_head_model_matches_transformers_on_a_right_padded_batch(tmp_path):
    hf, folder = _folder(tmp_path)
    model = qkv.load(folder).model
    assert isinstance(model, CausalLM)
    cfg = model.config
    assert (cfg.family, cfg.norm.placement, cfg.ffn.activation, cfg.positions.scheme, cfg.attention.similarity) == (
        "gpt2", "pre", "gelu_tanh", "learned", "scaled_dot")
    assert (cfg.d_model, cfg.attention.n_heads, cfg.n_layers, cfg.ffn.d_ff, cfg.max_len, cfg.vocab_size) == (24, 3, 2, 40, 19, V)
    assert (cfg.type_vocab_size, cfg.norm.embeddings, cfg.pad_token_id, cfg.norm.eps) == (0, False, None, 1e-5)
    assert (cfg.dropout, cfg.attention.dropout) == (0.1, 0.1)
    ids, mask, _ = batch(V, 0)  # right padding after 7, 4, 7, 2, 5 tokens
    compare(model, hf, ids, mask)


@pytest.mark.parametrize("length", [1, 6, 19])  # 19 = n_positions, the whole table
def test_gpt2_matches_transformers_at_different_lengths(tmp_path, length):
    hf, folder = _folder(tmp_path)
    model = qkv.load(folder).model
    ids = _ids(length, (2, length))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, atol=1e-5, rtol=0)


def test_n_inner_none_is_four_times_the_width(tmp_path):
    hf, folder = _folder(tmp_path, n_inner=None)
    model = qkv.load(folder).model
    assert model.config.ffn.d_ff == 96
    ids, mask, _ = batch(V, 1)
    compare(model, hf, ids, mask)


def test_left_padding_with_hf_style_position_ids(tmp_path):
    """A left-padded batch with transformers' generation positions (``mask.cumsum(-1) - 1``, 1 where
    masked) gives transformers' logits at the real positions, and each row's unpadded logits."""
    hf, folder = _folder(tmp_path)
    model = qkv.load(folder).model
    lengths = (7, 3, 5, 1)
    mask = (torch.arange(7)[None] >= 7 - torch.tensor(lengths)[:, None]).long()  # (B,T), pads first
    ids = _ids(2, (4, 7)).masked_fill(mask == 0, 0)
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask, position_ids=pos).logits
        theirs = hf(ids, attention_mask=mask, position_ids=pos).logits
        close_at_real(ours, theirs, mask, msg="left-padded logits")
        for row, n in enumerate(lengths):  # the same prompt without padding
            alone = hf(ids[row:row + 1, 7 - n:]).logits[0]
            torch.testing.assert_close(ours[row, 7 - n:], alone, atol=1e-5, rtol=0)


def test_gpt2_model_folder_without_head_loads_as_the_tied_causal_lm(tmp_path):
    hf, folder = _folder(tmp_path, "base", cls="GPT2Model")
    assert not any(k.startswith("lm_head") for k in hf.state_dict())
    model = qkv.load(folder).model
    assert isinstance(model, CausalLM)
    ids, mask, _ = batch(V, 2)
    with torch.no_grad():
        h = hf(ids, attention_mask=mask).last_hidden_state  # (B,T,C)
        out = model(ids, attention_mask=mask)
    close_at_real(out.last_hidden_state, h, mask)
    close_at_real(out.logits, h @ hf.wte.weight.T, mask)  # the head tied to wte


def test_an_older_pickle_checkpoint_with_bare_names_mask_buffers_and_lm_head(tmp_path):
    """pytorch_model.bin as older GPT-2 checkpoints store it: no ``transformer.`` prefix, the causal
    mask buffers ``attn.bias`` / ``attn.masked_bias`` per block, ``lm_head.weight`` a copy of wte."""
    hf, folder = _folder(tmp_path)
    (folder / "model.safetensors").unlink()
    state = {k.removeprefix("transformer."): v.clone() for k, v in hf.state_dict().items()}
    state["lm_head.weight"] = state["wte.weight"].clone()
    for i in range(2):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(19, 19)).view(1, 1, 19, 19)
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, folder / "pytorch_model.bin")
    model = qkv.load(folder).model
    ids, mask, _ = batch(V, 3)
    compare(model, hf, ids, mask)


@pytest.mark.parametrize("act,ours", [("gelu", "gelu"), ("relu", "relu"), ("silu", "silu"), ("swish", "silu")])
def test_activation_functions(tmp_path, act, ours):
    hf, folder = _folder(tmp_path, activation_function=act)
    model = qkv.load(folder).model
    assert model.config.ffn.activation == ours
    ids, mask, _ = batch(V, 4)
    compare(model, hf, ids, mask)


def test_unscaled_scores_read_as_the_dot_similarity_and_export_back(tmp_path):
    hf, folder = _folder(tmp_path, scale_attn_weights=False)
    model = qkv.load(folder).model
    assert model.config.attention.similarity == "dot"
    ids, mask, _ = batch(V, 5)
    compare(model, hf, ids, mask)
    qkv.export_hf(model, tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["scale_attn_weights"] is False
    compare(model, _reload(tmp_path / "back"), ids, mask)


def test_reorder_and_upcast_attn_changes_only_numerics_and_is_accepted(tmp_path):
    hf, folder = _folder(tmp_path, reorder_and_upcast_attn=True)
    eager = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    assert eager.config.reorder_and_upcast_attn is True
    model = qkv.load(folder).model
    ids, mask, _ = batch(V, 6)
    compare(model, eager, ids, mask)


def test_round_trip_through_qkv_and_back_to_transformers(tmp_path):
    hf, folder = _folder(tmp_path)
    model = qkv.load(folder).model
    qkv.save(model, tmp_path / "qkv")
    again = qkv.load(tmp_path / "qkv").model
    assert isinstance(again, CausalLM) and again.config == model.config
    qkv.export_hf(again, tmp_path / "back")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["model_type"] == "gpt2" and written["architectures"] == ["GPT2LMHeadModel"]
    assert (written["n_embd"], written["n_head"], written["n_layer"], written["n_positions"], written["n_inner"],
            written["vocab_size"], written["activation_function"]) == (24, 3, 2, 19, 40, V, "gelu_new")
    back = _reload(tmp_path / "back")
    for name, t in hf.state_dict().items():  # every tensor back where transformers keeps it
        assert torch.equal(back.state_dict()[name], t), name
    ids, mask, _ = batch(V, 7)
    compare(again, back, ids, mask)
    again_from_hf = qkv.load(tmp_path / "back").model
    assert again_from_hf.config == model.config


def test_qkv_convert_cli_round_trip(tmp_path):
    from qkv.cli import main

    hf, folder = _folder(tmp_path)
    assert main(["convert", str(folder), str(tmp_path / "q")]) == 0
    assert json.loads((tmp_path / "q" / "qkv.json").read_text())["kind"] == "causal_lm"
    assert main(["convert", str(tmp_path / "q"), str(tmp_path / "h")]) == 0
    back = _reload(tmp_path / "h")
    ids, mask, _ = batch(V, 8)
    with torch.no_grad():
        close_at_real(back(ids, attention_mask=mask).logits, hf(ids, attention_mask=mask).logits, mask)


def test_a_qkv_built_gpt2_exports_and_transformers_agrees(tmp_path):
    """A model made in qkv from the gpt2 preset (not imported) exports as GPT-2 (the preset says
    family='gpt2')."""
    config = ModelConfig.preset("gpt2", vocab_size=V, d_model=24, n_heads=3, d_ff=40, n_layers=2, max_len=19)
    torch.manual_seed(1)
    model = perturb(build_causal_lm(config))
    qkv.export_hf(model, tmp_path / "hf")
    theirs = _reload(tmp_path / "hf")
    ids, mask, _ = batch(V, 9)
    compare(model, theirs, ids, mask)


def test_the_gpt2_preset_has_gpt2_small_parameter_count():
    ours = build_causal_lm(ModelConfig.preset("gpt2"), init=False)
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters()) == 124_439_808  # lm_head tied: counted once
    cfg = ours.config
    assert (cfg.norm.placement, cfg.ffn.activation, cfg.norm.eps, cfg.type_vocab_size, cfg.norm.embeddings,
            cfg.pad_token_id, cfg.dropout, cfg.family) == ("pre", "gelu_tanh", 1e-5, 0, False, None, 0.1, "gpt2")


# --- refusals on read -------------------------------------------------------------------------

@pytest.mark.parametrize("changes,message", [
    (dict(scale_attn_by_inverse_layer_idx=True), r"scale_attn_by_inverse_layer_idx=True is not supported"),
    (dict(add_cross_attention=True), r"add_cross_attention=True is not supported"),
    (dict(tie_word_embeddings=False), r"tie_word_embeddings=False is not supported"),
    (dict(activation_function="quick_gelu"), r"activation_function='quick_gelu' is not supported; allowed: "),
    (dict(embd_pdrop=0.0), r"embd_pdrop=0.0 differs from resid_pdrop=0.1"),
    (dict(n_layer=1), r"unexpected tensor 'transformer.h.1.attn.c_attn.bias' for config.json \(n_layer=1\)"),
    (dict(n_inner=32), r"'transformer.h.0.mlp.c_fc.weight' has shape \(24, 40\), expected \(24, 32\) "
                       r"from config.json \(n_embd=24, n_inner=32\)"),
    (dict(architectures=["GPT2LMHeadModel", "GPT2Model"]), r"architectures=.* is not supported"),
])
def test_config_refusals_name_the_field(tmp_path, changes, message):
    _, folder = _folder(tmp_path)
    _edit_config(folder, **changes)
    with pytest.raises(CheckpointError, match=message):
        qkv.load(folder)


def test_an_untied_lm_head_is_refused(tmp_path):
    hf, folder = _folder(tmp_path)
    (folder / "model.safetensors").unlink()
    state = dict(hf.state_dict())
    state["lm_head.weight"] = state["transformer.wte.weight"] + 1.0
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"lm_head.weight differs from the token embeddings wte; qkv ties"):
        qkv.load(folder)


@pytest.mark.parametrize("arch,what", [
    ("GPT2ForSequenceClassification", r"its sequence classification head \(score.\*\)"),
    ("GPT2DoubleHeadsModel", r"its multiple-choice head \(multiple_choice_head.\*\)"),
    ("GPT2ForTokenClassification", r"its token classification head \(classifier.\*\)"),
    ("GPT2ForQuestionAnswering", r"its question-answering head \(qa_outputs.\*\)"),
])
def test_other_gpt2_heads_are_refused_not_dropped(tmp_path, arch, what):
    _, folder = _folder(tmp_path, arch, cls=arch)
    with pytest.raises(CheckpointError, match=rf"{arch}: {what} is not supported; qkv loads GPT2LMHeadModel"):
        qkv.load(folder)
    _edit_config(folder, architectures=None)  # the head's tensors alone say it
    with pytest.raises(CheckpointError, match=rf"the weights hold {what} \('.*', {arch}\)"):
        qkv.load(folder)


# --- refusals on export -----------------------------------------------------------------------

def _gpt2_config(**overrides):
    return ModelConfig.preset("gpt2", vocab_size=V, d_model=24, n_heads=3, d_ff=40, n_layers=2, max_len=19,
                              **overrides)


VARIANTS = [  # (field overrides, the field named in the refusal)
    (dict(norm="post"), "norm.placement='post'"),
    (dict(position="rope"), "positions.scheme='rope'"),
    (dict(position="sinusoidal"), "positions.scheme='sinusoidal'"),
    (dict(similarity="cosine"), "attention.similarity='cosine'"),
    (dict(n_kv_heads=1), "attention.n_kv_heads=1"),
    (dict(qk_norm="layernorm"), "attention.qk_norm='layernorm'"),
    (dict(local_window=4), "attention.window=4"),
    (dict(norm_type="rmsnorm"), "norm.kind='rmsnorm'"),
    (dict(feed_forward="glu"), "ffn.kind='glu'"),
    (dict(attention_bias=False), "attention.bias=False"),
    (dict(mlp_bias=False), "ffn.bias=False"),
    (dict(norm_bias=False), "norm.bias=False"),
    (dict(embedding_norm=True), "norm.embeddings=True"),
    (dict(position_offset=2), "positions.offset=2"),
    (dict(embed_scale=True), "embed_scale=True"),
    (dict(type_vocab_size=2), "type_vocab_size=2"),
    (dict(first_attention_norm=False), "norm.first_attention=False"),
    (dict(qkv_proj=False), "attention.qkv_proj=False"),
]


@pytest.mark.parametrize("overrides,named", VARIANTS)
def test_export_refuses_every_field_gpt2_cannot_express(overrides, named):
    gpt2 = families.get("gpt2")
    config = _gpt2_config()
    gpt2.config_to_hf(config, "causal_lm")  # the base is expressible
    with pytest.raises(CheckpointError, match=rf"as a Hugging Face GPT-2: .*{named} \(GPT-2 needs .*keep it in "
                                              r"the qkv format"):
        gpt2.config_to_hf(config.replace(**overrides), "causal_lm")


def test_export_names_every_field_at_once_and_writes_nothing(tmp_path):
    model = build_causal_lm(_gpt2_config(norm="post", norm_type="rmsnorm", n_kv_heads=1, position="alibi"))
    with pytest.raises(CheckpointError) as err:
        qkv.export_hf(model, tmp_path / "x")
    for named in ("norm.placement='post'", "norm.kind='rmsnorm'", "attention.n_kv_heads=1", "positions.scheme='alibi'"):
        assert named in str(err.value)
    assert len(str(err.value).splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kind", ["encoder", "masked_lm", "sequence_classification", "discriminator"])
def test_gpt2_export_refuses_every_kind_but_the_causal_lm(kind):
    with pytest.raises(CheckpointError, match=rf"kind {kind!r} \(GPT-2 is a causal language model"):
        families.get("gpt2").config_to_hf(_gpt2_config(), kind)


def test_export_of_an_encoder_as_gpt2_is_refused(tmp_path):
    encoder = build_encoder(_gpt2_config())
    with pytest.raises(CheckpointError, match=r"kind 'encoder' \(GPT-2 is a causal language model"):
        qkv.export_hf(encoder, tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "electra", "modernbert"])
def test_the_encoder_families_refuse_a_causal_lm_in_one_line(family):
    converter = families.get(family)
    with pytest.raises(CheckpointError) as err:
        converter.config_to_hf(_gpt2_config(), "causal_lm")
    text = str(err.value)
    assert text.startswith(f"a causal language model (kind 'causal_lm') cannot be exported as a Hugging Face "
                           f"{converter.NAME}, an encoder family; export it as GPT-2")
    assert "family='gpt2'" in text and len(text.splitlines()) == 1


def test_a_qkv_causal_lm_without_family_exports_as_gpt2(tmp_path):
    config = ModelConfig.preset("tiny", norm="pre", type_vocab_size=0, embedding_norm=False)
    torch.manual_seed(2)
    model = perturb(build_causal_lm(config))  # a qkv model: family None, a causal LM exports as GPT-2
    with pytest.raises(CheckpointError, match=r"cannot be exported as a Hugging Face BERT"):
        qkv.export_hf(model, tmp_path / "x", family="bert")
    assert not (tmp_path / "x").exists()
    qkv.export_hf(model, tmp_path / "x")
    ids, mask, _ = batch(V, 10)
    compare(model, _reload(tmp_path / "x"), ids, mask)
