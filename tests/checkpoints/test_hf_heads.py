"""Hugging Face task heads in and out: parity with transformers' BertForSequenceClassification (single
label, regression) and BertForTokenClassification, export, `qkv convert`, and the heads refused."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import qkv
from qkv.cli import main
from qkv.config import ModelConfig
from qkv.models.builders import build_encoder
from qkv.errors import CheckpointError
from qkv.models.heads import TaskConfig
from qkv.models.task_models import SequenceClassifier, TokenClassifier
from qkv.models.mlm import IGNORE_INDEX, MaskedLM
from qkv.models.task_builders import build_task_model

transformers = pytest.importorskip("transformers")

B, T = 5, 7
SIZES = dict(vocab_size=97, hidden_size=24, num_attention_heads=3, intermediate_size=40,
             num_hidden_layers=2, max_position_embeddings=19, type_vocab_size=4)
NAMES = ("negative", "neutral", "positive")
TAGS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG")


def _perturb(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return model


def _hf_model(kind, **overrides):
    torch.manual_seed(0)
    if kind == "sequence":
        cfg = transformers.BertConfig(**SIZES, id2label=dict(enumerate(NAMES)),
                                      label2id={n: i for i, n in enumerate(NAMES)}, **overrides)
        return _perturb(transformers.BertForSequenceClassification(cfg))
    if kind == "regression":
        return _perturb(transformers.BertForSequenceClassification(transformers.BertConfig(**SIZES, num_labels=1, **overrides)))
    cfg = transformers.BertConfig(**SIZES, id2label=dict(enumerate(TAGS)), label2id={n: i for i, n in enumerate(TAGS)},
                                  **overrides)
    return _perturb(transformers.BertForTokenClassification(cfg))


def _hf_folder(tmp_path, kind, name="hf", **overrides):
    folder = tmp_path / name
    _hf_model(kind, **overrides).save_pretrained(folder)
    return folder


def _auto(folder, kind):
    cls = (transformers.AutoModelForTokenClassification if kind == "token"
           else transformers.AutoModelForSequenceClassification)
    return cls.from_pretrained(folder, attn_implementation="eager").eval()


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, SIZES["vocab_size"], (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    types = torch.randint(0, SIZES["type_vocab_size"], (B, T), generator=g)
    return ids.masked_fill(mask == 0, 0), mask, types


def _labels(kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "sequence":
        return torch.randint(0, len(NAMES), (B,), generator=g)
    if kind == "regression":
        return torch.randn(B, generator=g)
    labels = torch.randint(0, len(TAGS), (B, T), generator=g)
    labels[:, 0] = IGNORE_INDEX
    return labels


def _compare(ours, theirs, kind):
    ids, mask, types = _batch()
    labels = _labels(kind)
    with torch.no_grad():
        a = ours(ids, mask, types, labels=labels)
        b = theirs(ids, attention_mask=mask, token_type_ids=types, labels=labels)
    assert a.logits.shape == b.logits.shape == {"sequence": (B, 3), "regression": (B, 1), "token": (B, T, 7)}[kind]
    torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.loss, b.loss, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["sequence", "regression", "token"])
def test_hf_task_model_loads_with_parity(tmp_path, kind):
    folder = _hf_folder(tmp_path, kind)
    ours = qkv.load(folder).model
    assert isinstance(ours, TokenClassifier if kind == "token" else SequenceClassifier) and not ours.training
    want = {"sequence": ("sequence-classification", NAMES), "regression": ("regression", ()),
            "token": ("token-classification", TAGS)}[kind]
    assert (ours.task.task, ours.task.labels) == want
    assert ours.task.pooling == "pooler" and ours.config.pooler == (kind != "token")
    _compare(ours, _auto(folder, kind), kind)


@pytest.mark.parametrize("kind", ["sequence", "regression", "token"])
def test_export_loads_in_transformers_auto_classes(tmp_path, kind):
    ours = qkv.load(_hf_folder(tmp_path, kind)).model
    folder = qkv.export_hf(ours, tmp_path / "export")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["BertForTokenClassification" if kind == "token" else "BertForSequenceClassification"]
    names = {"sequence": NAMES, "regression": ("LABEL_0",), "token": TAGS}[kind]
    assert cfg["id2label"] == {str(i): n for i, n in enumerate(names)}
    assert cfg["label2id"] == {n: i for i, n in enumerate(names)}
    assert cfg["classifier_dropout"] == 0.1
    assert cfg.get("problem_type") == {"sequence": "single_label_classification", "regression": "regression",
                                       "token": None}[kind]
    theirs = _auto(folder, kind)
    assert theirs.config.num_labels == len(names)
    _compare(ours, theirs, kind)
    again = qkv.load(folder).model
    assert again.task == ours.task
    for (n, p), (_, q) in zip(ours.state_dict().items(), again.state_dict().items()):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=n)


def test_export_of_a_qkv_built_model(tmp_path):
    torch.manual_seed(0)
    task = TaskConfig("sequence-classification", ("a", "b", "c", "d", "e"), classifier_dropout=0.25)
    ours = _perturb(build_task_model(ModelConfig.preset("tiny"), task)).eval()
    theirs = _auto(qkv.export_hf(ours, tmp_path / "export"), "sequence")
    assert theirs.config.id2label == dict(enumerate(task.labels)) and theirs.config.classifier_dropout == 0.25
    ids, mask, types = _batch()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask, types).logits, theirs(ids, attention_mask=mask, token_type_ids=types).logits,
                                   atol=1e-5, rtol=0)


def test_qkv_save_load_of_an_imported_head(tmp_path):
    ours = qkv.load(_hf_folder(tmp_path, "sequence")).model
    again = qkv.load(qkv.save(ours, tmp_path / "q")).model
    assert again.task == ours.task
    ids, mask, types = _batch()
    with torch.no_grad():
        torch.testing.assert_close(again(ids, mask, types).logits, ours(ids, mask, types).logits, atol=0, rtol=0)


def test_cli_convert_round_trip(tmp_path, capsys):
    src = _hf_folder(tmp_path, "token")
    assert main(["convert", str(src), str(tmp_path / "q")]) == 0
    assert json.loads((tmp_path / "q" / "qkv.json").read_text())["kind"] == "token_classification"
    assert main(["convert", str(tmp_path / "q"), str(tmp_path / "h")]) == 0
    assert "wrote" in capsys.readouterr().out
    _compare(qkv.load(tmp_path / "q").model, _auto(tmp_path / "h", "token"), "token")


def test_pretraining_checkpoint_keeps_pooler_and_mlm_head(tmp_path):
    torch.manual_seed(0)
    hf = _perturb(transformers.BertForPreTraining(transformers.BertConfig(**SIZES))).eval()
    hf.save_pretrained(tmp_path / "pt")
    ours = qkv.load(tmp_path / "pt").model  # the next-sentence head (cls.seq_relationship) is ignored
    assert isinstance(ours, MaskedLM) and ours.config.pooler
    ids, mask, types = _batch()
    with torch.no_grad():
        a = ours.encoder(ids, mask, types)
        b = hf.bert(ids, attention_mask=mask, token_type_ids=types)
    torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- refused

def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_question_answering_is_refused(tmp_path):
    torch.manual_seed(0)
    transformers.BertForQuestionAnswering(transformers.BertConfig(**SIZES)).save_pretrained(tmp_path / "qa")
    with pytest.raises(CheckpointError, match=r"BertForQuestionAnswering: a question-answering head \(qa_outputs"
                       r".*not supported.*never drops a head silently"):
        qkv.load(tmp_path / "qa")
    _edit_config(tmp_path / "qa", architectures=["BertModel"])  # the tensors give it away too
    with pytest.raises(CheckpointError, match=r"question-answering head \(qa_outputs"):
        qkv.load(tmp_path / "qa")


def test_multiple_choice_is_refused(tmp_path):
    torch.manual_seed(0)
    transformers.BertForMultipleChoice(transformers.BertConfig(**SIZES)).save_pretrained(tmp_path / "mc")
    with pytest.raises(CheckpointError, match=r"BertForMultipleChoice: a multiple-choice head is not supported"):
        qkv.load(tmp_path / "mc")


def test_multi_label_is_refused(tmp_path):
    folder = _hf_folder(tmp_path, "sequence", problem_type="multi_label_classification")
    with pytest.raises(CheckpointError, match=r"problem_type='multi_label_classification' is not supported"):
        qkv.load(folder)


def test_classifier_without_a_known_architecture_is_refused(tmp_path):
    folder = _hf_folder(tmp_path, "sequence")
    _edit_config(folder, architectures=None)
    with pytest.raises(CheckpointError, match=r"classifier head \('classifier.bias'\) but architectures=\[\] "
                       r"does not say which"):
        qkv.load(folder)


def test_unknown_tensor_is_refused(tmp_path):
    folder = _hf_folder(tmp_path, "token")
    tensors = load_file(folder / "model.safetensors")
    tensors["span_head.weight"] = torch.zeros(2, 24)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"unknown tensor 'span_head.weight'.*refused rather than dropped"):
        qkv.load(folder)


def test_labels_that_disagree_are_refused(tmp_path):
    folder = _hf_folder(tmp_path, "sequence")
    _edit_config(folder, label2id={"negative": 0, "neutral": 2, "positive": 1})
    with pytest.raises(CheckpointError, match=r"label2id=.* disagrees with id2label="):
        qkv.load(folder)
    _edit_config(folder, label2id=None, id2label={"0": "a", "1": "b", "2": "c", "3": "d"})
    with pytest.raises(CheckpointError, match=r"tensor 'classifier.weight' has shape \(3, 24\), expected \(4, 24\) "
                       r"from config.json \(num_labels=4, hidden_size=24\)"):
        qkv.load(folder)


def test_export_refuses_a_pooling_hf_cannot_express(tmp_path):
    model = build_task_model(ModelConfig.preset("tiny"), TaskConfig("regression", pooling="mean"))
    with pytest.raises(CheckpointError, match=r"pooling='mean'.*keep it in the qkv format \(qkv convert --to qkv; qkv.save in Python\)"):
        qkv.export_hf(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_encoder_export_keeps_no_pooler_it_does_not_have(tmp_path):
    folder = qkv.export_hf(build_encoder(ModelConfig.preset("tiny")), tmp_path / "e")
    assert not any("pooler" in k for k in load_file(folder / "model.safetensors"))
