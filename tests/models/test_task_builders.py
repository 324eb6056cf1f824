"""Task builders: build_task_model adds BERT's pooler only where the task pools with it;
attach_task_head copies the encoder, seeds what is new, keeps or replaces an existing head."""

import pytest
import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_encoder, build_masked_lm
from qkv.errors import CheckpointError
from qkv.models.heads import TaskConfig
from qkv.models.task_models import SequenceClassifier, TokenClassifier
from qkv.models.task_builders import attach_task_head, build_task_model
from qkv.nn.pooler import Pooler

SEQ = TaskConfig("sequence-classification", [f"c{i}" for i in range(5)])
TOK = TaskConfig("token-classification", tuple(f"t{i}" for i in range(7)))
REG = TaskConfig("regression")


def _model(task, seed=0):
    torch.manual_seed(seed)
    model = build_task_model(ModelConfig.preset("tiny"), task)
    with torch.no_grad():  # biases away from their zero init, so that a dropped bias shows
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    return model.eval()


def test_build_task_model_adds_the_pooler_only_where_used():
    cfg = ModelConfig.preset("tiny")
    seq = build_task_model(cfg, SEQ)
    assert seq.config.pooler and seq.encoder.config.pooler and isinstance(seq.encoder.pooler, Pooler)
    assert build_task_model(cfg, TaskConfig("regression", pooling="cls")).encoder.pooler is None
    tok = build_task_model(cfg, TOK)
    assert tok.config == cfg and tok.encoder.pooler is None
    assert tok.dropout.p == 0.1 and isinstance(tok.classifier, torch.nn.Linear)


# ---------------------------------------------------------------- attach_task_head

def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], atol=0, rtol=0, msg=k)


def test_attach_to_an_encoder_adds_a_seeded_head_and_pooler():
    torch.manual_seed(0)
    enc = build_encoder(ModelConfig.preset("tiny")).eval()
    rng = torch.get_rng_state()
    model = attach_task_head(enc, SEQ, seed=7)
    assert torch.equal(torch.get_rng_state(), rng), "the global RNG is left as it was"
    assert isinstance(model, SequenceClassifier) and model.config.pooler and not model.training
    assert enc.pooler is None, "the input is not changed"
    assert not hasattr(model, "tokenizer"), "no attribute is attached after construction"
    enc_state = model.encoder.state_dict()
    for k, v in enc.state_dict().items():
        torch.testing.assert_close(enc_state[k], v, atol=0, rtol=0, msg=k)
    g = torch.Generator().manual_seed(7)  # the documented init: pooler first, then classifier
    torch.testing.assert_close(model.encoder.pooler.dense.weight, torch.randn(24, 24, generator=g) * 0.02)
    torch.testing.assert_close(model.classifier.weight, torch.randn(5, 24, generator=g) * 0.02)
    assert torch.all(model.classifier.bias == 0)
    torch.manual_seed(123)  # the global seed does not matter, the given one does
    _same_weights(attach_task_head(enc, SEQ, seed=7), model)
    other = attach_task_head(enc, SEQ, seed=8)
    assert not torch.equal(other.classifier.weight, model.classifier.weight)


def test_attach_to_a_masked_lm_drops_its_head():
    torch.manual_seed(0)
    mlm = build_masked_lm(ModelConfig.preset("tiny", pooler=True)).train()
    model = attach_task_head(mlm, TOK)
    assert isinstance(model, TokenClassifier) and model.training and not hasattr(model, "tokenizer")
    assert not any(k.startswith("head.") for k in model.state_dict())
    _same_weights(model.encoder, mlm.encoder)  # the pooler it had is kept
    # a pooler nothing uses is frozen (DDP needs every trainable parameter used); trainable once used
    assert not any(p.requires_grad for p in mlm.encoder.pooler.parameters())
    assert not any(p.requires_grad for p in model.encoder.pooler.parameters())
    assert all(p.requires_grad for n, p in model.named_parameters() if not n.startswith("encoder.pooler."))
    assert all(p.requires_grad for p in attach_task_head(mlm, SEQ).parameters())
    assert not attach_task_head(mlm, TaskConfig("regression", pooling="mean")).encoder.pooler.dense.weight.requires_grad


def test_attach_to_an_existing_head():
    head = _model(SEQ)
    kept = attach_task_head(head, TaskConfig("sequence-classification", SEQ.labels, classifier_dropout=0.3))
    _same_weights(kept, head)
    assert kept.dropout.p == 0.3
    renamed = TaskConfig("sequence-classification", ("a", "b"))
    with pytest.raises(CheckpointError, match=r"already has a task head \(sequence-classification, num_labels=5, "
                       r"labels \('c0', 'c1', 'c2', 'c3', 'c4'\).*asked for \(sequence-classification, num_labels=2, "
                       r"labels \('a', 'b'\).*pass reset_head=True"):
        attach_task_head(head, renamed)
    with pytest.raises(CheckpointError, match=r"pooling 'pooler'.*pooling 'mean'.*reset_head=True"):
        attach_task_head(head, TaskConfig("sequence-classification", SEQ.labels, "mean"))
    with pytest.raises(CheckpointError, match=r"num_labels=5.*regression, num_labels=1"):
        attach_task_head(head, REG)
    reset = attach_task_head(head, renamed, reset_head=True, seed=1)
    assert reset.task == renamed and reset.classifier.weight.shape == (2, 24)
    _same_weights(reset.encoder, head.encoder)
    torch.testing.assert_close(reset.classifier.weight, torch.randn(2, 24, generator=torch.Generator().manual_seed(1)) * 0.02)


def test_attach_refuses_other_models():
    with pytest.raises(ValueError, match=r"needs a qkv Encoder, MaskedLM or task model.*got Linear"):
        attach_task_head(torch.nn.Linear(2, 2), SEQ)
