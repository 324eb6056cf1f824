"""RoBERTa in and out: parity with transformers' RobertaModel, RobertaForMaskedLM and
RobertaForTokenClassification (positions from pad id + 1), the round trip back to transformers,
and the refusals."""

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

SIZES = dict(vocab_size=97, hidden_size=24, num_attention_heads=3, intermediate_size=40, num_hidden_layers=2,
             max_position_embeddings=13, type_vocab_size=1, pad_token_id=1)
CLASSES = {"encoder": "RobertaModel", "masked_lm": "RobertaForMaskedLM", "token": "RobertaForTokenClassification"}


def _hf(kind, **overrides):
    torch.manual_seed(0)
    extra = dict(id2label=dict(enumerate(TAGS)), label2id={t: i for i, t in enumerate(TAGS)}) if kind == "token" else {}
    cfg = transformers.RobertaConfig(**{**SIZES, **extra, **overrides})
    return perturb(getattr(transformers, CLASSES[kind])(cfg))


def _folder(tmp_path, kind, **overrides):
    hf = _hf(kind, **overrides)
    hf.save_pretrained(tmp_path / kind)
    return hf, tmp_path / kind


def _reload(folder, kind):
    return getattr(transformers, CLASSES[kind]).from_pretrained(folder, attn_implementation="eager").eval()


def test_roberta_model_matches_transformers(tmp_path):
    hf, folder = _folder(tmp_path, "encoder")
    model = qkv.load(folder).model
    assert isinstance(model, Encoder) and model.pooler is not None
    cfg = model.config
    assert (cfg.family, cfg.positions.offset, cfg.max_len, cfg.type_vocab_size) == ("roberta", 2, 11, 1)
    assert model.embeddings.positions.weight.shape == (13, 24)  # max_len + offset rows
    ids, mask, types = batch(97, 1)
    a, b = compare(model, hf, ids, mask, logits=False)
    torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=0)


def test_roberta_masked_lm_matches_transformers(tmp_path):
    hf, folder = _folder(tmp_path, "masked_lm")
    model = qkv.load(folder).model
    assert isinstance(model, MaskedLM) and model.encoder.pooler is None
    ids, mask, _ = batch(97, 1)
    compare(model, hf, ids, mask)


def test_roberta_token_classification_matches_transformers(tmp_path):
    hf, folder = _folder(tmp_path, "token")
    model = qkv.load(folder).model
    assert isinstance(model, TokenClassifier) and model.task.labels == TAGS
    ids, mask, _ = batch(97, 1)
    compare(model, hf, ids, mask)


@pytest.mark.parametrize("kind", ["encoder", "masked_lm", "token"])
def test_roberta_round_trip_through_qkv_and_back(tmp_path, kind):
    hf, folder = _folder(tmp_path, kind)
    qkv.save(qkv.load(folder), tmp_path / "q")  # the family travels in qkv.json's config
    assert json.loads((tmp_path / "q" / "qkv.json").read_text())["config"]["family"] == "roberta"
    again = qkv.load(tmp_path / "q").model
    ids, mask, _ = batch(97, 1, seed=1)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, output_hidden_states=True)
        close_at_real(again(ids, mask, output_hidden_states=True).hidden_states[-1], ref.hidden_states[-1], mask)
    qkv.export_hf(again, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == "roberta" and written["architectures"] == [CLASSES[kind]]
    assert written["max_position_embeddings"] == 13 and written["pad_token_id"] == 1
    back = _reload(tmp_path / "out", kind)
    with torch.no_grad():
        out = back(ids, attention_mask=mask, output_hidden_states=True)
    for x, y in zip(out.hidden_states, ref.hidden_states):
        close_at_real(x, y, mask)
    if kind != "encoder":
        close_at_real(out.logits, ref.logits, mask)


def test_qkv_convert_cli_round_trip(tmp_path):
    from qkv.cli import main

    hf, folder = _folder(tmp_path, "masked_lm")
    assert main(["convert", str(folder), str(tmp_path / "q")]) == 0
    assert main(["convert", str(tmp_path / "q"), str(tmp_path / "h")]) == 0
    back = _reload(tmp_path / "h", "masked_lm")
    ids, mask, _ = batch(97, 1)
    with torch.no_grad():
        close_at_real(back(ids, attention_mask=mask).logits, hf(ids, attention_mask=mask).logits, mask)


@pytest.mark.parametrize("arch,message", [
    ("RobertaForQuestionAnswering", r"RobertaForQuestionAnswering: a question-answering head"),
    ("RobertaForMultipleChoice", r"RobertaForMultipleChoice: a multiple-choice head is not supported"),
])
def test_heads_qkv_cannot_represent_are_refused(tmp_path, arch, message):
    cfg = transformers.RobertaConfig(**SIZES)
    getattr(transformers, arch)(cfg).save_pretrained(tmp_path / "x")
    with pytest.raises(CheckpointError, match=message):
        qkv.load(tmp_path / "x")


def test_masked_lm_with_another_activation_is_refused(tmp_path):
    _, folder = _folder(tmp_path, "masked_lm", hidden_act="relu")
    with pytest.raises(CheckpointError, match=r"hidden_act='relu' with RobertaForMaskedLM is not supported"):
        qkv.load(folder)


def test_export_refuses_what_roberta_cannot_express(tmp_path):
    roberta = ModelConfig.preset("tiny").replace(family="roberta", pad_token_id=1, position_offset=2)
    model = build_encoder(roberta.replace(position_offset=0))
    with pytest.raises(CheckpointError, match=r"as a Hugging Face RoBERTa: positions.offset=0 \(RoBERTa needs "
                                              r"pad_token_id \+ 1 = 2\).*keep it in the qkv format"):
        qkv.export_hf(model, tmp_path / "x")
    model = build_encoder(roberta.replace(norm_type="rmsnorm"))
    with pytest.raises(CheckpointError, match=r"RoBERTa: norm.kind='rmsnorm' \(RoBERTa needs 'layernorm'\)"):
        qkv.export_hf(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_export_refuses_a_sequence_head_roberta_writes_differently(tmp_path):
    from qkv.models.task_builders import build_task_model
    from qkv.models.heads import TaskConfig

    config = ModelConfig.preset("tiny", family="roberta", pad_token_id=1, position_offset=2)
    model = build_task_model(config, TaskConfig("sequence-classification", ("a", "b"), pooling="mean"))
    with pytest.raises(CheckpointError, match=r"RoBERTa: the task head's pooling='mean', head=None \(RoBERTa's "
                                              r"sequence classification head needs pooling='cls', head='tanh'"):
        qkv.export_hf(model, tmp_path / "x")
    with pytest.raises(CheckpointError, match=r"as a Hugging Face BERT: positions.offset=2 \(BERT needs 0\)"):
        qkv.export_hf(model, tmp_path / "x", family="bert")  # BERT has the head but not the offset
    assert not (tmp_path / "x").exists()
