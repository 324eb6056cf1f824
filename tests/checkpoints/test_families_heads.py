"""Task heads of every encoder family in and out: RoBERTa, DistilBERT, ELECTRA and ModernBERT sequence
and token classification (and regression) read from transformers' classes and written back, logits equal
to 1e-5 (random weights, distinct sizes)."""

import json

import pytest
import torch
from families_support import TAGS, batch, close_at_real, perturb

import qkv
from qkv.errors import CheckpointError
from qkv.models.heads import TaskConfig
from qkv.models.task_builders import attach_task_head
from qkv.models.task_models import SequenceClassifier, TokenClassifier

transformers = pytest.importorskip("transformers")

LABELS = ("neg", "neu", "pos")
FAMILIES = {
    "roberta": ("Roberta", dict(vocab_size=97, hidden_size=24, num_attention_heads=3, intermediate_size=40,
                                num_hidden_layers=2, max_position_embeddings=13, type_vocab_size=1, pad_token_id=1)),
    "distilbert": ("DistilBert", dict(vocab_size=97, dim=24, n_heads=3, hidden_dim=40, n_layers=2,
                                      max_position_embeddings=11)),
    "electra": ("Electra", dict(vocab_size=97, hidden_size=24, num_attention_heads=3, intermediate_size=40,
                                num_hidden_layers=2, max_position_embeddings=11, type_vocab_size=3, embedding_size=16)),
    "modernbert": ("ModernBert", dict(vocab_size=97, hidden_size=24, num_attention_heads=3, intermediate_size=40,
                                      num_hidden_layers=4, max_position_embeddings=16, pad_token_id=0,
                                      bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None,
                                      local_attention=4, global_attn_every_n_layers=3, attention_bias=True,
                                      mlp_bias=True, norm_bias=True, classifier_bias=True,
                                      classifier_activation="silu")),
}
HEADS = {"roberta": ("cls", "tanh", False), "distilbert": ("cls", "relu", False), "electra": ("cls", "gelu", False),
         "modernbert": ("cls", "silu", True)}


def _hf(family, kind, **overrides):
    prefix, sizes = FAMILIES[family]
    labels = {"sequence": LABELS, "token": TAGS, "regression": ("score",)}[kind]
    extra = dict(id2label=dict(enumerate(labels)), label2id={t: i for i, t in enumerate(labels)})
    if kind == "regression":
        extra["problem_type"] = "regression"
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{prefix}Config")(**{**sizes, **extra, **overrides})
    cls = f"{prefix}For{'Token' if kind == 'token' else 'Sequence'}Classification"
    return perturb(getattr(transformers, cls)(cfg))


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


def _pad_id(family):
    return FAMILIES[family][1].get("pad_token_id", 0)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("kind", ["sequence", "token", "regression"])
def test_task_head_in_and_out(tmp_path, family, kind):
    hf = _hf(family, kind)
    hf.save_pretrained(tmp_path / "hf")
    model = qkv.load(tmp_path / "hf").model
    assert isinstance(model, TokenClassifier if kind == "token" else SequenceClassifier)
    pooling, act, norm = HEADS[family]
    if kind == "token":
        assert model.task.labels == TAGS
        assert (model.task.head, model.task.head_norm) == ((act, True) if family == "modernbert" else (None, False))
    else:
        assert model.task.task == ("regression" if kind == "regression" else "sequence-classification")
        assert (model.task.pooling, model.task.head, model.task.head_norm) == (pooling, act, norm)
    ids, mask, _ = batch(97, _pad_id(family), seed=2)
    ours, theirs = _logits(model, ids, mask), _logits(hf, ids, mask)
    if kind == "token":
        close_at_real(ours, theirs, mask)
    else:
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    qkv.export_hf(model, tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == [type(hf).__name__]
    again = type(hf).from_pretrained(tmp_path / "out").eval()
    back = _logits(again, ids, mask)
    if kind == "token":
        close_at_real(back, theirs, mask)
    else:
        torch.testing.assert_close(back, theirs, atol=1e-5, rtol=0)


def test_modernbert_mean_pooling(tmp_path):
    hf = _hf("modernbert", "sequence", classifier_pooling="mean")
    hf.save_pretrained(tmp_path / "hf")
    model = qkv.load(tmp_path / "hf").model
    assert model.task.pooling == "mean"
    ids, mask, _ = batch(97, 0, seed=3)
    torch.testing.assert_close(_logits(model, ids, mask), _logits(hf, ids, mask), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["roberta", "distilbert", "electra", "modernbert"])
def test_a_fresh_head_in_the_familys_shape_exports(tmp_path, family):
    """The head qkv finetune gives a family's model (its own shape) writes back as that family's class."""
    prefix, sizes = FAMILIES[family]
    torch.manual_seed(0)
    getattr(transformers, f"{prefix}Model")(getattr(transformers, f"{prefix}Config")(**sizes)).save_pretrained(
        tmp_path / "enc")
    pooling, act, norm = HEADS[family]
    encoder = qkv.load(tmp_path / "enc").model
    task = TaskConfig("sequence-classification", LABELS, pooling=pooling, head=act, head_norm=norm)
    model = attach_task_head(encoder, task, seed=1).eval()
    qkv.export_hf(model, tmp_path / "out")
    again = getattr(transformers, f"{prefix}ForSequenceClassification").from_pretrained(tmp_path / "out").eval()
    ids, mask, _ = batch(97, _pad_id(family), seed=4)
    torch.testing.assert_close(_logits(model, ids, mask), _logits(again, ids, mask), atol=1e-5, rtol=0)


def test_roberta_pooler_head_writes_as_classifier_dense(tmp_path):
    """A RoBERTa classifier fine-tuned on BERT's pooler is RoBERTa's head: the pooler becomes classifier.dense."""
    prefix, sizes = FAMILIES["roberta"]
    torch.manual_seed(0)
    transformers.RobertaModel(transformers.RobertaConfig(**sizes)).save_pretrained(tmp_path / "enc")
    model = attach_task_head(qkv.load(tmp_path / "enc").model, TaskConfig("sequence-classification", LABELS),
                             seed=1).eval()
    assert model.task.pooling == "pooler" and model.encoder.pooler is not None
    qkv.export_hf(model, tmp_path / "out")
    again = transformers.RobertaForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    ids, mask, _ = batch(97, 1, seed=5)
    torch.testing.assert_close(_logits(model, ids, mask), _logits(again, ids, mask), atol=1e-5, rtol=0)


def test_a_head_the_family_cannot_express_is_refused_naming_the_fix(tmp_path):
    prefix, sizes = FAMILIES["electra"]
    torch.manual_seed(0)
    transformers.ElectraModel(transformers.ElectraConfig(**sizes)).save_pretrained(tmp_path / "enc")
    model = attach_task_head(qkv.load(tmp_path / "enc").model,
                             TaskConfig("sequence-classification", LABELS, pooling="mean"))
    with pytest.raises(CheckpointError, match=r"the task head's pooling='mean', head=None \(ELECTRA's sequence "
                                              r"classification head needs pooling='cls', head='gelu', "
                                              r"head_norm=False; qkv finetune gives"):
        qkv.export_hf(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    bert = attach_task_head(model.encoder, TaskConfig("sequence-classification", LABELS, pooling="cls", head="gelu"))
    with pytest.raises(CheckpointError, match=r"head='gelu' \(BERT's classifiers"):
        qkv.export_hf(bert, tmp_path / "out", family="bert")


def test_task_config_head_fields_round_trip():
    task = TaskConfig("token-classification", TAGS, head="gelu", head_norm=True)
    assert TaskConfig.from_dict(task.to_dict()) == task
    assert "head" not in TaskConfig("regression").to_dict()  # folders without a head read as before
    with pytest.raises(ValueError, match="head_norm=True must be a bool, and True only with a head"):
        TaskConfig("regression", head_norm=True)
    with pytest.raises(ValueError, match="head"):
        TaskConfig("regression", head="softmax")
