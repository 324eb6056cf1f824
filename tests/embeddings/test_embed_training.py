"""Contrastive training: the loss against a hand computation, and a few steps that lower it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import qkv
from qkv.cli import main
from qkv.embeddings import EmbeddingError
from qkv.embeddings.contrastive import ContrastiveConfig, contrastive_loss, train_embeddings


def test_contrastive_loss_matches_hand_computation():
    g = torch.Generator().manual_seed(0)
    a, p = torch.randn(5, 24, generator=g), torch.randn(5, 24, generator=g)
    labels = torch.tensor([0, 1, 0, 2, 1])
    an = a.numpy() / np.linalg.norm(a.numpy(), axis=1, keepdims=True)
    pn = p.numpy() / np.linalg.norm(p.numpy(), axis=1, keepdims=True)
    logits = an @ pn.T / 0.1
    for lab, use in ((None, np.ones((5, 5), bool)), (labels, None)):
        if lab is not None:
            use = (labels.numpy()[:, None] != labels.numpy()[None, :]) | np.eye(5, dtype=bool)
        ref = np.mean([-(logits[i, i] - np.log(np.exp(logits[i][use[i]]).sum())) for i in range(5)])
        got = float(contrastive_loss(a, p, 0.1, lab))
        assert abs(got - ref) < 1e-5


@pytest.fixture(scope="module")
def labelled(pydoc_texts):
    texts = [t[:300] for t in pydoc_texts[:48]]
    return texts, [f"topic{i % 3}" for i in range(len(texts))]


@pytest.mark.parametrize("mode", ["simcse", "supervised"])
def test_training_lowers_the_loss_and_writes_a_usable_folder(tiny_model, tmp_path, labelled, mode):
    texts, labels = labelled
    cfg = ContrastiveConfig(mode=mode, steps=12, batch_size=8, lr=2e-3, max_len=24, warmup=0.0)
    out = tmp_path / mode
    result = train_embeddings(tiny_model, texts, out, cfg, labels=labels)
    assert result.final_loss < result.initial_loss - 0.05, (result.initial_loss, result.final_loss)
    meta = json.loads((out / "embedding.json").read_text())
    assert meta["pooling"] == "mean" and meta["training"]["objective"] == mode
    vecs = qkv.embed(out, texts[:3])
    assert vecs.shape == (3, 24) and np.isfinite(vecs).all()
    assert not np.allclose(vecs, qkv.embed(tiny_model, texts[:3]))  # the weights did change


def test_training_errors(tiny_model, tmp_path, labelled):
    texts, _ = labelled
    with pytest.raises(EmbeddingError, match="label"):
        train_embeddings(tiny_model, texts, tmp_path / "x", ContrastiveConfig(mode="supervised", steps=1))
    with pytest.raises(EmbeddingError, match="dropout"):
        ContrastiveConfig(dropout=0.0)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(EmbeddingError, match="not an empty folder"):
        train_embeddings(tiny_model, texts, tmp_path / "full", ContrastiveConfig(steps=1))


def test_train_embeddings_command(tiny_model, tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    rows = [{"text": f"document number {i} about {'cats' if i % 2 else 'dogs'}", "label": i % 2}
            for i in range(20)]
    corpus.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    out = tmp_path / "m"
    assert main(["train-embeddings", str(tiny_model), "--corpus", str(corpus), "--label-field", "label",
                 "--objective", "supervised", "--steps", "3", "--batch-size", "4", "--out", str(out),
                 "--no-progress"]) == 0
    assert "loss on a fixed batch" in capsys.readouterr().out
    assert (out / "config.json").is_file() and (out / "modules.json").is_file()  # sentence-transformers
    assert (out / "tokenizer.json").is_file() and (out / "embedding.json").is_file()
    assert main(["train-embeddings", str(tiny_model), "--corpus", str(corpus), "--steps", "1", "--batch-size",
                 "4", "--out", str(tmp_path / "q"), "--format", "qkv", "--no-progress"]) == 0
    assert (tmp_path / "q" / "qkv.json").is_file() and not (tmp_path / "q" / "modules.json").exists()


def test_training_from_a_masked_lm_folder(tiny_model, tmp_path, labelled):
    """A `qkv pretrain` run holds a MaskedLM; training keeps its encoder and writes an Encoder folder."""
    from qkv.models.builders import build_masked_lm
    from qkv.models.io import save
    from qkv.nn.encoder import Encoder

    encoder, tokenizer = qkv.load(tiny_model)
    mlm = build_masked_lm(encoder.config)
    src = save(mlm, tmp_path / "run", tokenizer=tokenizer)
    texts, _ = labelled
    out = tmp_path / "out"
    train_embeddings(src, texts, out, ContrastiveConfig(steps=2, batch_size=4, max_len=16))
    assert isinstance(qkv.load(out).model, Encoder)
    assert qkv.embed(out, ["a text"]).shape == (1, 24)


def test_training_from_a_hugging_face_bert_folder(tiny_model, tmp_path, labelled):
    """A Hugging Face BERT folder (built locally, random weights) with its tokenizer trains too."""
    import shutil

    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    vocab = qkv.load(tiny_model).model.config.vocab_size
    cfg = BertConfig(vocab_size=vocab, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=40, max_position_embeddings=32)
    src = tmp_path / "hf"
    BertModel(cfg).save_pretrained(src)
    shutil.copy(tiny_model / "tokenizer.json", src / "tokenizer.json")
    texts, labels = labelled
    result = train_embeddings(src, texts, tmp_path / "out", ContrastiveConfig(
        mode="supervised", steps=10, batch_size=8, lr=2e-3, max_len=24, warmup=0.0), labels=labels)
    assert result.final_loss < result.initial_loss
    assert qkv.embed(tmp_path / "out", ["a text"]).shape == (1, 24)
