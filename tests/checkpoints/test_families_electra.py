"""ELECTRA in and out: parity with transformers' ElectraModel, ElectraForPreTraining (the
discriminator) and ElectraForTokenClassification with embedding_size ≠ hidden_size (the embedding
projection), the round trip back to transformers, and the refusals."""

import json

import pytest
import torch
from families_support import TAGS, batch, close_at_real, compare, perturb

import qkv
from qkv.config import ModelConfig
from qkv.models.builders import build_discriminator, build_encoder, build_masked_lm
from qkv.models.discriminator import Discriminator
from qkv.errors import CheckpointError
from qkv.models.task_models import TokenClassifier
from qkv.nn.encoder import Encoder

transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=97, hidden_size=24, num_attention_heads=3, intermediate_size=40, num_hidden_layers=2,
             max_position_embeddings=11, type_vocab_size=3, embedding_size=16)
CLASSES = {"encoder": "ElectraModel", "discriminator": "ElectraForPreTraining",
           "token": "ElectraForTokenClassification"}


def _hf(kind, **overrides):
    torch.manual_seed(0)
    extra = dict(id2label=dict(enumerate(TAGS)), label2id={t: i for i, t in enumerate(TAGS)}) if kind == "token" else {}
    cfg = transformers.ElectraConfig(**{**SIZES, **extra, **overrides})
    return perturb(getattr(transformers, CLASSES[kind])(cfg))


def _folder(tmp_path, kind, **overrides):
    hf = _hf(kind, **overrides)
    hf.save_pretrained(tmp_path / kind)
    return hf, tmp_path / kind


@pytest.mark.parametrize("width", [16, 24])
def test_electra_model_matches_transformers(tmp_path, width):
    hf, folder = _folder(tmp_path, "encoder", embedding_size=width)
    model = qkv.load(folder).model
    assert isinstance(model, Encoder) and model.config.family == "electra"
    if width == 16:  # E-wide embeddings, then Linear(E, C)
        assert model.config.embedding_size == 16 and model.embeddings.tokens.weight.shape == (97, 16)
        assert model.embeddings.norm.weight.shape == (16,) and model.embed_proj.weight.shape == (24, 16)
    else:
        assert model.config.embedding_size is None and model.embed_proj is None
    ids, mask, types = batch(97, 0, 3)
    compare(model, hf, ids, mask, types, logits=False)


def test_electra_discriminator_matches_transformers(tmp_path):
    hf, folder = _folder(tmp_path, "discriminator", hidden_act="gelu_new")
    model = qkv.load(folder).model
    assert isinstance(model, Discriminator)
    ids, mask, types = batch(97, 0, 3)
    a, _ = compare(model, hf, ids, mask, types)
    assert a.logits.shape == (5, 7)
    labels = torch.randint(0, 2, ids.shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model(ids, mask, types, labels=labels).loss
        theirs = hf(ids, attention_mask=mask, token_type_ids=types, labels=labels).loss
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


def test_electra_token_classification_matches_transformers(tmp_path):
    hf, folder = _folder(tmp_path, "token")
    model = qkv.load(folder).model
    assert isinstance(model, TokenClassifier) and model.task.labels == TAGS
    ids, mask, types = batch(97, 0, 3)
    compare(model, hf, ids, mask, types)


@pytest.mark.parametrize("kind", ["encoder", "discriminator", "token"])
def test_electra_round_trip_through_qkv_and_back(tmp_path, kind):
    hf, folder = _folder(tmp_path, kind)
    qkv.save(qkv.load(folder), tmp_path / "q")
    meta = json.loads((tmp_path / "q" / "qkv.json").read_text())
    assert meta["config"]["family"] == "electra" and meta["config"]["embedding_size"] == 16
    qkv.export_hf(qkv.load(tmp_path / "q"), tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == [CLASSES[kind]] and written["embedding_size"] == 16
    back = getattr(transformers, CLASSES[kind]).from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    ids, mask, types = batch(97, 0, 3, seed=4)
    kw = dict(attention_mask=mask, token_type_ids=types, output_hidden_states=True)
    with torch.no_grad():
        a, b = back(ids, **kw), hf(ids, **kw)
    for x, y in zip(a.hidden_states, b.hidden_states):
        close_at_real(x, y, mask)
    if kind != "encoder":
        close_at_real(a.logits, b.logits, mask)


def test_a_discriminator_built_in_qkv_saves_and_loads(tmp_path):
    config = ModelConfig.preset("tiny", embedding_size=16, family="electra", dropout=0.0)
    torch.manual_seed(0)
    model = build_discriminator(config).eval()
    assert model.encoder.embed_proj.weight.shape == (24, 16)
    qkv.save(model, tmp_path / "d")
    again = qkv.load(tmp_path / "d").model
    ids, mask, types = batch(97, 0, 4)
    with torch.no_grad():
        torch.testing.assert_close(again(ids, mask, types).logits, model(ids, mask, types).logits, atol=0, rtol=0)


def test_masked_lm_on_narrow_embeddings_is_refused():
    with pytest.raises(ValueError, match=r"embedding_size=16 \(≠ d_model=24\): the masked-LM head"):
        build_masked_lm(ModelConfig.preset("tiny", embedding_size=16))


@pytest.mark.parametrize("arch,message", [
    ("ElectraForMaskedLM", r"ElectraForMaskedLM: the generator .* is not supported"),
    ("ElectraForQuestionAnswering", r"ElectraForQuestionAnswering: a question-answering head"),
])
def test_heads_qkv_cannot_represent_are_refused(tmp_path, arch, message):
    getattr(transformers, arch)(transformers.ElectraConfig(**SIZES)).save_pretrained(tmp_path / "x")
    with pytest.raises(CheckpointError, match=message):
        qkv.load(tmp_path / "x")


def test_export_refuses_what_electra_and_bert_cannot_express(tmp_path):
    narrow = build_encoder(ModelConfig.preset("tiny", embedding_size=16))  # family None: exported as BERT
    with pytest.raises(CheckpointError, match=r"as a Hugging Face BERT: embedding_size=16 \(BERT needs 24"):
        qkv.export_hf(narrow, tmp_path / "x")
    qkv.export_hf(narrow, tmp_path / "e", family="electra")  # ELECTRA can
    assert json.loads((tmp_path / "e" / "config.json").read_text())["model_type"] == "electra"
    glu = build_discriminator(ModelConfig.preset("tiny", family="electra", feed_forward="glu", activation="silu"))
    with pytest.raises(CheckpointError, match=r"ELECTRA: ffn.kind='glu' \(ELECTRA needs 'mlp'\)"):
        qkv.export_hf(glu, tmp_path / "x")
    with pytest.raises(CheckpointError, match=r"BERT: .*kind 'discriminator' \(BERT has no such head"):
        qkv.export_hf(glu.__class__(glu.encoder, glu.head, config=glu.config.replace(family="bert",
                                                                                   feed_forward="mlp")),
                      tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_discriminator_takes_a_task_head_for_fine_tuning(tmp_path):
    from qkv.models.task_builders import attach_task_head
    from qkv.models.heads import TaskConfig

    hf, folder = _folder(tmp_path, "discriminator")
    model = attach_task_head(qkv.load(folder).model, TaskConfig("token-classification", TAGS)).eval()
    ids, mask, types = batch(97, 0, 3)
    with torch.no_grad():
        ours = model(ids, mask, types).last_hidden_state
        theirs = hf.electra(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    close_at_real(ours, theirs, mask)


def test_packed_path_projects_the_embeddings_too(tmp_path):
    from qkv.nn.packed import PackedBatch

    _, folder = _folder(tmp_path, "encoder")
    model = qkv.load(folder).model
    ids, mask, types = batch(97, 0, 3)
    with torch.no_grad():
        padded = model(ids, mask, types).last_hidden_state
        packed = model.forward_packed(PackedBatch.from_padded(ids, mask, types)).last_hidden_state
    torch.testing.assert_close(packed, padded[mask.bool()], atol=1e-5, rtol=0)
