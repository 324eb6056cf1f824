"""Task heads: TaskConfig, logits and losses against formulas written out, pooling, save/load,
packed inference. Building and attaching task models: test_task_builders.py. Parity with transformers' task models is in test_hf_heads.py."""

import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv.config import ModelConfig
from qkv.models.builders import build_encoder
from qkv.errors import CheckpointError
from qkv.models.heads import POOLINGS, TASKS, TaskConfig, TaskOutput
from qkv.models.task_models import SequenceClassifier, TokenClassifier
from qkv.models.mlm import IGNORE_INDEX
from qkv.models.task_builders import build_task_model

B, T = 5, 7
SEQ = TaskConfig("sequence-classification", [f"c{i}" for i in range(5)])
TOK = TaskConfig("token-classification", tuple(f"t{i}" for i in range(7)))
REG = TaskConfig("regression")


def _model(task, seed=0, **overrides):
    torch.manual_seed(seed)
    model = build_task_model(ModelConfig.preset("tiny", **overrides), task)
    with torch.no_grad():  # biases away from their zero init, so that a dropped bias shows
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    return model.eval()


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 97, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    return ids.masked_fill(mask == 0, 0), mask


# ---------------------------------------------------------------- TaskConfig

def test_task_config_fields_and_round_trip():
    assert SEQ.labels == ("c0", "c1", "c2", "c3", "c4") and SEQ.num_labels == 5
    assert REG.num_labels == 1 and REG.labels == ()
    assert TOK.num_labels == 7 and TOK.pooling == "pooler"
    assert TASKS == ("sequence-classification", "token-classification", "regression")
    assert POOLINGS == ("pooler", "cls", "mean")
    for task in (SEQ, TOK, REG, TaskConfig("sequence-classification", ("a", "b"), "mean", 0.0)):
        assert TaskConfig.from_dict(task.to_dict()) == task
    with pytest.raises(ValueError, match=r"unknown TaskConfig field\(s\) \['num_labels'\]"):
        TaskConfig.from_dict({"task": "regression", "num_labels": 1})


@pytest.mark.parametrize("kwargs,message", [
    (dict(task="ner"), r"task='ner' is not allowed; allowed: sequence-classification, token-classification"),
    (dict(task="sequence-classification", labels=("a",)), r"needs at least 2 labels"),
    (dict(task="token-classification"), r"labels=\(\): task='token-classification' needs at least 2 labels"),
    (dict(task="sequence-classification", labels=("a", "b", "a")), r"duplicate label\(s\) \['a'\]"),
    (dict(task="sequence-classification", labels=("a", "")), r"every label must be a non-empty string, found ''"),
    (dict(task="sequence-classification", labels=("a", 2)), r"non-empty string, found 2"),
    (dict(task="sequence-classification", labels="ab"), r"labels='ab' must be a tuple or list"),
    (dict(task="regression", labels=("y",)), r"task='regression' has no class names; pass labels=\(\)"),
    (dict(task="regression", pooling="max"), r"pooling='max' is not allowed; allowed: pooler, cls, mean"),
    (dict(task="regression", classifier_dropout=1.0), r"classifier_dropout=1.0 must be a number in \[0, 1\)"),
])
def test_task_config_is_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TaskConfig(**kwargs)


# ---------------------------------------------------------------- logits and losses

def _pooled_by_hand(model, ids, mask):
    h = model.encoder(ids, mask).last_hidden_state  # (B,T,C)
    if model.task.pooling == "pooler":
        p = model.encoder.pooler.dense
        return torch.tanh(h[:, 0] @ p.weight.T + p.bias)
    if model.task.pooling == "cls":
        return h[:, 0]
    return torch.stack([h[b, : int(mask[b].sum())].mean(0) for b in range(B)])


@pytest.mark.parametrize("pooling", POOLINGS)
def test_sequence_classification_logits_and_loss(pooling):
    model = _model(TaskConfig("sequence-classification", SEQ.labels, pooling))
    ids, mask = _batch()
    labels = torch.tensor([0, 4, 2, 1, 4])
    out = model(ids, mask, labels=labels)
    assert isinstance(out, TaskOutput) and out.logits.shape == (B, 5)
    c = model.classifier
    want = _pooled_by_hand(model, ids, mask) @ c.weight.T + c.bias
    torch.testing.assert_close(out.logits, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.loss, F.cross_entropy(want, labels), atol=1e-5, rtol=0)
    assert model(ids, mask).loss is None


def test_mean_pooling_ignores_padding():
    model = _model(TaskConfig("sequence-classification", SEQ.labels, "mean"))
    ids, mask = _batch()
    with torch.no_grad():
        padded = model(ids, mask).logits[3]
        alone = model(ids[3:4, :2]).logits[0]  # the same sequence without its padding
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


def test_regression_logits_and_mse():
    model = _model(REG)
    ids, mask = _batch()
    y = torch.tensor([0.5, -1.0, 2.0, 0.0, 3.5])
    out = model(ids, mask, labels=y)
    assert out.logits.shape == (B, 1)
    c = model.classifier
    want = _pooled_by_hand(model, ids, mask) @ c.weight.T + c.bias
    torch.testing.assert_close(out.logits, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.loss, ((want[:, 0] - y) ** 2).mean(), atol=1e-5, rtol=0)


def test_token_classification_ignores_minus_100():
    model = _model(TOK)
    ids, mask = _batch()
    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 7, (B, T), generator=g)
    labels[mask == 0] = IGNORE_INDEX
    labels[0, :3] = IGNORE_INDEX
    out = model(ids, mask, labels=labels, output_hidden_states=True, output_attentions=True)
    assert out.logits.shape == (B, T, 7)
    c = model.classifier
    want = model.encoder(ids, mask).last_hidden_state @ c.weight.T + c.bias
    torch.testing.assert_close(out.logits, want, atol=1e-5, rtol=0)
    picked = labels != IGNORE_INDEX
    torch.testing.assert_close(out.loss, F.cross_entropy(want[picked], labels[picked]), atol=1e-5, rtol=0)
    assert len(out.hidden_states) == 3 and out.attentions[0].shape == (B, 3, T, T)
    nothing = model(ids, mask, labels=torch.full((B, T), IGNORE_INDEX)).loss
    assert torch.isnan(nothing), "no labelled token: NaN, as F.cross_entropy"


@pytest.mark.parametrize("task,labels,message", [
    (SEQ, torch.zeros(B, 1, dtype=torch.long), r"int64 tensor of class ids with shape \(B,\) = \(5,\), got torch.int64 \(5, 1\)"),
    (SEQ, torch.zeros(B), r"int64 tensor of class ids with shape \(B,\) = \(5,\), got torch.float32"),
    (SEQ, torch.tensor([0, 1, 5, 0, 0]), r"class ids in \[0, num_labels=5\); found values in \[0, 5\]"),
    (REG, torch.zeros(B, dtype=torch.long), r"float tensor of targets with shape \(B,\) = \(5,\), got torch.int64"),
    (REG, torch.zeros(B, 1), r"float tensor of targets with shape \(B,\) = \(5,\), got torch.float32 \(5, 1\)"),
    (TOK, torch.zeros(B, dtype=torch.long), r"shape \(B, T\) = \(5, 7\), got torch.int64 \(5,\)"),
    (TOK, torch.full((B, T), -1), r"in \[0, num_labels=7\) \(or -100 = ignored\); found values in \[-1, -1\]"),
])
def test_labels_are_checked(task, labels, message):
    model = _model(task)
    ids, mask = _batch()
    with pytest.raises(ValueError, match=message):
        model(ids, mask, labels=labels)


def test_models_check_their_parts():
    cfg = ModelConfig.preset("tiny")
    enc = build_encoder(cfg)
    with pytest.raises(ValueError, match=r"pooling='pooler' needs an encoder with a pooler"):
        SequenceClassifier(enc, SEQ, torch.nn.Linear(24, 5), config=cfg)
    with pytest.raises(ValueError, match=r"classifier must be nn.Linear\(d_model=24, num_labels=7\), got \(24, 5\)"):
        TokenClassifier(enc, TOK, torch.nn.Linear(24, 5), config=cfg)
    with pytest.raises(ValueError, match=r"TokenClassifier does not do task='regression'.*use SequenceClassifier"):
        TokenClassifier(enc, REG, torch.nn.Linear(24, 1), config=cfg)


# ---------------------------------------------------------------- qkv folders

@pytest.mark.parametrize("task", [SEQ, TOK, REG, TaskConfig("sequence-classification", ("x", "y"), "mean", 0.2)])
def test_save_load_round_trip(tmp_path, task):
    model = _model(task)
    folder = qkv.save(model, tmp_path / "m")
    again = qkv.load(folder).model
    assert type(again) is type(model) and again.task == task and again.config == model.config
    ids, mask = _batch()
    with torch.no_grad():
        torch.testing.assert_close(again(ids, mask).logits, model(ids, mask).logits, atol=0, rtol=0)


def test_qkv_json_kind_must_agree_with_task(tmp_path):
    import json

    folder = qkv.save(_model(TOK), tmp_path / "m")
    meta = json.loads((folder / "qkv.json").read_text())
    assert meta["kind"] == "token_classification" and meta["task"]["labels"] == list(TOK.labels)
    meta["kind"] = "sequence_classification"
    (folder / "qkv.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"kind 'sequence_classification' disagrees with task 'token-classification'"):
        qkv.load(folder)
    meta["task"]["extra"] = 1
    (folder / "qkv.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"qkv.json: task: unknown TaskConfig field\(s\) \['extra'\]"):
        qkv.load(folder)


def test_load_does_not_override_the_pooler(tmp_path):
    folder = qkv.save(_model(TOK), tmp_path / "m")
    with pytest.raises(ValueError, match=r"pooler cannot be overridden.*attach_task_head adds one"):
        qkv.load(folder, pooler=True)


# ---------------------------------------------------------------- packed (padding-free) inference
@pytest.mark.parametrize("task,pooling", [(SEQ, "pooler"), (SEQ, "cls"), (SEQ, "mean"), (REG, "mean"), (TOK, None)])
def test_forward_packed_equals_the_padded_forward(task, pooling):
    from dataclasses import replace

    from qkv.nn.packed import PackedBatch

    model = _model(task if pooling is None else replace(task, pooling=pooling))
    ids, mask = _batch()
    with torch.inference_mode():
        ref = model(ids, mask).logits  # (B,L) or (B,T,L)
        out = model.forward_packed(PackedBatch.from_padded(ids, mask.bool()))
    assert out.loss is None and out.last_hidden_state.shape == (int(mask.sum()), 24)
    want = ref[mask.bool()] if task is TOK else ref  # token logits at the real positions: (N,L)
    torch.testing.assert_close(out.logits, want, atol=1e-5, rtol=1e-5)


def test_forward_packed_refuses_an_empty_sequence():
    from qkv.nn.packed import PackedBatch

    with pytest.raises(ValueError, match="at least one token"):
        _model(SEQ).forward_packed(PackedBatch.from_sequences([[5, 6], []]))
