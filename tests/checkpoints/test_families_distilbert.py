"""DistilBERT in and out: parity with transformers' DistilBertModel, DistilBertForMaskedLM and
DistilBertForTokenClassification (learned and sinusoidal position tables), the round trip back to
transformers, and the refusals."""

import json

import pytest
import torch
from families_support import TAGS, batch, close_at_real, compare, perturb

import qkv
from qkv.config import ModelConfig
from qkv.models.builders import build_encoder
from qkv.errors import CheckpointError
from qkv.models.task_models import TokenClassifier
from qkv.models.mlm import MaskedLM
from qkv.nn.encoder import Encoder

transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=97, dim=24, n_heads=3, hidden_dim=40, n_layers=2, max_position_embeddings=11)
CLASSES = {"encoder": "DistilBertModel", "masked_lm": "DistilBertForMaskedLM",
           "token": "DistilBertForTokenClassification"}


def _hf(kind, **overrides):
    torch.manual_seed(0)
    extra = dict(id2label=dict(enumerate(TAGS)), label2id={t: i for i, t in enumerate(TAGS)}) if kind == "token" else {}
    cfg = transformers.DistilBertConfig(**{**SIZES, **extra, **overrides})
    return perturb(getattr(transformers, CLASSES[kind])(cfg))


def _folder(tmp_path, kind, **overrides):
    hf = _hf(kind, **overrides)
    hf.save_pretrained(tmp_path / kind)
    return hf, tmp_path / kind


def test_distilbert_model_matches_transformers(tmp_path):
    hf, folder = _folder(tmp_path, "encoder")
    model = qkv.load(folder).model
    assert isinstance(model, Encoder) and model.embeddings.segments is None and model.pooler is None
    assert (model.config.family, model.config.type_vocab_size, model.config.max_len) == ("distilbert", 0, 11)
    ids, mask, _ = batch(97, 0)
    compare(model, hf, ids, mask, logits=False)
    # a BERT tokenizer's segment ids (a pair) are ignored, as transformers' DistilBertModel takes none
    types = (torch.arange(ids.shape[1]) >= 3).long().expand_as(ids)  # (B,T)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask.bool(), token_type_ids=types).last_hidden_state,
                                   model(ids, mask.bool()).last_hidden_state, rtol=0, atol=0)


def test_inspect_and_analyze_read_a_distilbert_folder_with_a_bert_tokenizer(tmp_path, minilm):
    """qkv inspect refused a DistilBERT folder that qkv analyze read (its tokenizer gives segment ids)."""
    import shutil

    from qkv.cli import main

    torch.manual_seed(0)
    folder = tmp_path / "db"
    transformers.DistilBertModel(transformers.DistilBertConfig(vocab_size=30522, dim=24, n_heads=2, hidden_dim=40,
                                                               n_layers=2)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm / name).exists():
            shutil.copy(minilm / name, folder / name)
    assert main(["inspect", str(folder), "the cat sat", "--pair", "on the mat", "--out", str(tmp_path / "i")]) == 0
    assert (tmp_path / "i" / "viewer.html").is_file() and (tmp_path / "i" / "attention_layer_1.png").is_file()


@pytest.mark.parametrize("sinusoidal", [False, True])
def test_distilbert_masked_lm_matches_transformers(tmp_path, sinusoidal):
    hf, folder = _folder(tmp_path, "masked_lm", sinusoidal_pos_embds=sinusoidal, activation="relu")
    model = qkv.load(folder).model
    assert isinstance(model, MaskedLM) and model.config.ffn.activation == "relu"
    ids, mask, _ = batch(97, 0)
    compare(model, hf, ids, mask)


def test_distilbert_token_classification_matches_transformers(tmp_path):
    hf, folder = _folder(tmp_path, "token")
    model = qkv.load(folder).model
    assert isinstance(model, TokenClassifier) and model.task.labels == TAGS
    ids, mask, _ = batch(97, 0)
    compare(model, hf, ids, mask)


@pytest.mark.parametrize("kind", ["encoder", "masked_lm", "token"])
def test_distilbert_round_trip_through_qkv_and_back(tmp_path, kind):
    hf, folder = _folder(tmp_path, kind, sinusoidal_pos_embds=kind == "masked_lm")
    qkv.save(qkv.load(folder), tmp_path / "q")
    qkv.export_hf(qkv.load(tmp_path / "q"), tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == "distilbert" and written["architectures"] == [CLASSES[kind]]
    back = getattr(transformers, CLASSES[kind]).from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    ids, mask, _ = batch(97, 0, seed=2)
    with torch.no_grad():
        a = back(ids, attention_mask=mask, output_hidden_states=True)
        b = hf(ids, attention_mask=mask, output_hidden_states=True)
    for x, y in zip(a.hidden_states, b.hidden_states):
        close_at_real(x, y, mask)
    if kind != "encoder":
        close_at_real(a.logits, b.logits, mask)


@pytest.mark.parametrize("arch,message", [
    ("DistilBertForQuestionAnswering", r"DistilBertForQuestionAnswering: a question-answering head"),
])
def test_heads_qkv_cannot_represent_are_refused(tmp_path, arch, message):
    getattr(transformers, arch)(transformers.DistilBertConfig(**SIZES)).save_pretrained(tmp_path / "x")
    with pytest.raises(CheckpointError, match=message):
        qkv.load(tmp_path / "x")


def test_unknown_tensor_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder = _folder(tmp_path, "encoder")
    tensors = load_file(folder / "model.safetensors")
    tensors["transformer.layer.2.ffn.lin1.bias"] = torch.zeros(40)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'transformer.layer.2.ffn.lin1.bias' for "
                                              r"config.json \(n_layers=2\); the config disagrees"):
        qkv.load(folder)


def test_export_refuses_what_distilbert_cannot_express(tmp_path):
    tiny = ModelConfig.preset("tiny", family="distilbert")  # type_vocab_size=4: segments DistilBERT lacks
    with pytest.raises(CheckpointError, match=r"as a Hugging Face DistilBERT: type_vocab_size=4 \(DistilBERT "
                                              r"needs 0\)"):
        qkv.export_hf(build_encoder(tiny), tmp_path / "x")
    bert_model = build_encoder(ModelConfig.preset("tiny", type_vocab_size=0, mlp_bias=False))
    with pytest.raises(CheckpointError, match=r"DistilBERT: ffn.bias=False \(DistilBERT needs True\)"):
        qkv.export_hf(bert_model, tmp_path / "x", family="distilbert")
    assert not (tmp_path / "x").exists()
