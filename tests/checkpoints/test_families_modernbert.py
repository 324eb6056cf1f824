"""ModernBERT in and out: parity with transformers' ModernBertModel and ModernBertForMaskedLM
(rotary positions with separate local/global bases, sliding-window layers with a global layer
every k, GeGLU, no layer-0 attention norm, bias-free or with biases), the round trip back to
transformers, and the refusals."""

import json

import pytest
import torch
from families_support import batch, perturb

import qkv
from qkv.config import ModelConfig, layer_period
from qkv.models.builders import build_masked_lm
from qkv.errors import CheckpointError
from qkv.models.mlm import MaskedLM
from qkv.nn.encoder import Encoder

transformers = pytest.importorskip("transformers")

# local_attention 4: keys within 2 positions either side, so the window cuts the 7-token batch;
# 4 layers with a global one every 3: layers 0 and 3 global, 1 and 2 local
SIZES = dict(vocab_size=97, hidden_size=24, num_attention_heads=3, intermediate_size=40, num_hidden_layers=4,
             max_position_embeddings=16, pad_token_id=0, bos_token_id=None, eos_token_id=None,
             cls_token_id=None, sep_token_id=None, local_attention=4, global_attn_every_n_layers=3,
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 160_000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}})
BIASES = dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True)
CLASSES = {"encoder": "ModernBertModel", "masked_lm": "ModernBertForMaskedLM"}


def _hf(kind, **overrides):
    torch.manual_seed(0)
    cfg = transformers.ModernBertConfig(**{**SIZES, **overrides})
    return perturb(getattr(transformers, CLASSES[kind])(cfg))


def _folder(tmp_path, kind, name=None, **overrides):
    hf = _hf(kind, **overrides)
    folder = tmp_path / (name or kind)
    hf.save_pretrained(folder)
    return hf, folder


def _reload(folder, kind):
    return getattr(transformers, CLASSES[kind]).from_pretrained(folder).eval()


def _compare(ours, theirs, ids, mask, *, logits):
    """transformers' ``hidden_states`` are the embeddings and every layer's output before the final
    norm; qkv's last entry is after it (its ``last_hidden_state``), so compare that one apart."""
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, output_hidden_states=True)
        b = theirs(ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    n = len(b.hidden_states)
    assert len(a.hidden_states) == n
    for i in range(n - 1):
        torch.testing.assert_close(a.hidden_states[i][real], b.hidden_states[i][real], atol=1e-5, rtol=0,
                                   msg=f"hidden state {i}")
    if logits:
        torch.testing.assert_close(a.logits[real], b.logits[real], atol=1e-5, rtol=0)
    else:
        torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=0)
    return a, b


@pytest.mark.parametrize("biases", [False, True], ids=["bias-free", "biases"])
def test_modernbert_model_matches_transformers(tmp_path, biases):
    hf, folder = _folder(tmp_path, "encoder", **(BIASES if biases else {}))
    model = qkv.load(folder).model
    assert isinstance(model, Encoder)
    cfg = model.config
    assert (cfg.family, cfg.norm.placement, cfg.positions.scheme, cfg.ffn.kind, cfg.norm.first_attention) == (
        "modernbert", "pre", "rope", "glu", False)
    assert (cfg.attention.window, layer_period(cfg), cfg.positions.rope_base, cfg.positions.local_rope_base) == (4, 3, 160_000.0, 10.0)
    assert (cfg.norm.bias, cfg.attention.bias, cfg.ffn.bias) == (biases,) * 3
    ids, mask, _ = batch(97, 0)
    _compare(model, hf, ids, mask, logits=False)


@pytest.mark.parametrize("biases", [False, True], ids=["bias-free", "biases"])
def test_modernbert_masked_lm_matches_transformers(tmp_path, biases):
    extra = {**BIASES, "decoder_bias": False} if biases else {}
    hf, folder = _folder(tmp_path, "masked_lm", **extra)
    model = qkv.load(folder).model
    assert isinstance(model, MaskedLM) and model.config.head_bias is biases
    if biases:  # decoder_bias=False reads as a zero bias
        assert torch.equal(model.head.bias, torch.zeros(97))
    ids, mask, _ = batch(97, 0)
    _compare(model, hf, ids, mask, logits=True)


def test_modernbert_window_matters_and_the_packed_path_agrees(tmp_path):
    """The same weights without the window (every layer global) give other outputs: the
    sliding window is really applied; the padding-free entry point gives the padded outputs."""
    hf, folder = _folder(tmp_path, "encoder")
    model = qkv.load(folder).model
    ids, mask, _ = batch(97, 0)
    wide = qkv.load(folder, local_window=None).model
    with torch.no_grad():
        a, b = model(ids, attention_mask=mask).last_hidden_state, wide(ids, attention_mask=mask).last_hidden_state
        assert (a - b)[mask.bool()].abs().max() > 1e-3
        seqs = [ids[i, : int(n)] for i, n in enumerate(mask.sum(1))]
        packed = model.forward_packed(qkv.nn.packed.PackedBatch.from_sequences(seqs)).last_hidden_state
    torch.testing.assert_close(packed, a[mask.bool()], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["encoder", "masked_lm"])
def test_modernbert_round_trip_through_qkv_and_back_to_transformers(tmp_path, kind):
    hf, folder = _folder(tmp_path, kind, **BIASES)
    model = qkv.load(folder).model
    qkv.save(model, tmp_path / "qkv")
    again = qkv.load(tmp_path / "qkv").model
    assert again.config == model.config
    qkv.export_hf(again, tmp_path / "back")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["model_type"] == "modernbert" and written["architectures"] == [CLASSES[kind]]
    back = _reload(tmp_path / "back", kind)
    ids, mask, _ = batch(97, 0)
    _compare(again, back, ids, mask, logits=kind == "masked_lm")


def test_a_qkv_built_modernbert_exports_and_transformers_agrees(tmp_path):
    """A model made in qkv from the ModernBERT-shaped options (not imported) exports as ModernBERT."""
    config = ModelConfig.preset("modernbert", vocab_size=97, d_model=24, n_heads=3, d_ff=40, n_layers=4,
                                max_len=16, pad_token_id=0, local_window=4)
    torch.manual_seed(1)
    model = perturb(build_masked_lm(config))
    qkv.export_hf(model, tmp_path / "hf")  # the preset says family="modernbert"
    theirs = _reload(tmp_path / "hf", "masked_lm")
    ids, mask, _ = batch(97, 0)
    _compare(model, theirs, ids, mask, logits=True)


def test_modernbert_refusals(tmp_path):
    for arch in ("ModernBertForQuestionAnswering", "ModernBertForMultipleChoice"):
        cls = getattr(transformers, arch)
        torch.manual_seed(0)
        cls(transformers.ModernBertConfig(**SIZES)).save_pretrained(tmp_path / arch)
        with pytest.raises(CheckpointError, match=arch):
            qkv.load(tmp_path / arch)
    _, folder = _folder(tmp_path, "encoder", name="pattern")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["layer_types"] = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"][::-1]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="a global layer every k layers"):
        qkv.load(folder)
    cfg["layer_types"] = None
    cfg["classifier_activation"] = "relu"
    (folder / "config.json").write_text(json.dumps(cfg))
    qkv.load(folder)  # an encoder has no head: its classifier_activation does not matter
    _, mlm = _folder(tmp_path, "masked_lm", name="act", classifier_activation="relu")
    with pytest.raises(CheckpointError, match="classifier_activation='relu'"):
        qkv.load(mlm)
    bert_shaped = build_masked_lm(ModelConfig.preset("tiny"))
    with pytest.raises(CheckpointError, match="ModernBERT needs") as err:
        qkv.export_hf(bert_shaped, tmp_path / "no", family="modernbert")
    assert "norm.placement='post'" in str(err.value) and "ffn.kind='mlp'" in str(err.value)
    assert not (tmp_path / "no").exists()
