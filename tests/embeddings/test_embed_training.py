"""Contrastive training: the loss against a hand computation, and a few steps that lower it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import qkv
from qkv.cli import main
from qkv.embeddings.errors import EmbeddingError
from qkv.embeddings.contrastive import contrastive_loss, train_embeddings
from qkv.embeddings.contrastive_config import ContrastiveConfig


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
    from qkv.checkpoints.io import save
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


# --- on the training engine: time budget, run folder and resume, precision, one process -------------------

class FakeClock:
    """A clock that only moves when a test moves it."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _weights(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_a_time_budget_stops_training_at_its_deadline(tiny_model, tmp_path, labelled):
    texts, _ = labelled
    clock = FakeClock()
    cfg = ContrastiveConfig(steps=100, batch_size=4, max_len=16, time_budget=0.1, log_every=1)  # 6 s
    result = train_embeddings(tiny_model, texts, tmp_path / "out", cfg, clock=clock,
                              on_backward=lambda step, model: setattr(clock, "t", clock.t + 1.0))
    assert result.status == "complete" and result.steps_done == 6 and len(result.losses) == 6
    record = json.loads((tmp_path / "out" / "embedding.json").read_text())["training"]
    assert record["steps"] == 6 and record["config"]["time_budget"] == 0.1


def test_an_interrupted_run_resumes_bit_identically(tiny_model, tmp_path, labelled):
    import os
    import signal

    texts, labels = labelled
    cfg = ContrastiveConfig(mode="supervised", steps=8, batch_size=6, lr=2e-3, max_len=16, log_every=1)
    whole = train_embeddings(tiny_model, texts, tmp_path / "whole", cfg, labels=labels)

    def stop(step, model):
        if step == 5:  # a stop request while step 5 runs: it is abandoned, step 4 checkpointed
            os.kill(os.getpid(), signal.SIGINT)

    part = train_embeddings(tiny_model, texts, tmp_path / "part", cfg, labels=labels, on_backward=stop)
    assert part.status == "interrupted" and part.steps_done == 4 and not (tmp_path / "part" / "embedding.json").exists()
    again = train_embeddings(tiny_model, texts, tmp_path / "part", cfg, labels=labels, resume=True)
    assert again.losses == whole.losses and again.final_loss == whole.final_loss
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    np.testing.assert_array_equal(qkv.embed(tmp_path / "part", texts[:3]), qkv.embed(tmp_path / "whole", texts[:3]))
    assert train_embeddings(tiny_model, texts, tmp_path / "part", cfg, labels=labels, resume=True).losses == whole.losses
    train_embeddings(tiny_model, texts[:-1], tmp_path / "other", cfg, labels=labels[:-1], on_backward=stop)
    with pytest.raises(EmbeddingError, match="the texts or labels differ"):
        train_embeddings(tiny_model, texts, tmp_path / "other", cfg, labels=labels, resume=True)


def test_the_batches_are_a_pure_function_of_their_index(tiny_model, labelled):
    from qkv.embeddings.contrastive import ContrastiveObjective

    texts, labels = labelled
    ids = [np.arange(3, 3 + 1 + i % 5) for i in range(len(texts))]
    cfg = ContrastiveConfig(mode="supervised", batch_size=6)
    obj = ContrastiveObjective(ids, cfg, 0, np.asarray([i % 3 for i in range(len(texts))]))
    later = obj.batch(7)
    obj.batch(3)
    again = obj.batch(7)
    assert torch.equal(later.input_ids, again.input_ids) and torch.equal(later.labels, again.labels)
    assert not torch.equal(obj.batch(8).input_ids, later.input_ids) or not torch.equal(obj.batch(8).labels, later.labels)


def test_bf16_runs_and_stays_close_to_fp32(tiny_model, tmp_path, labelled):
    from qkv.training.precision import bf16_support

    ok, why = bf16_support("cpu")
    if not ok:
        pytest.skip(f"bf16 training falls back to fp32 here: {why}")
    texts, _ = labelled
    cfg = dict(steps=6, batch_size=6, lr=2e-3, max_len=16, log_every=1)
    a = train_embeddings(tiny_model, texts, tmp_path / "a", ContrastiveConfig(**cfg))
    b = train_embeddings(tiny_model, texts, tmp_path / "b", ContrastiveConfig(**cfg, precision="bf16"))
    assert json.loads((tmp_path / "b" / "embedding.json").read_text())["training"]["precision"] == "bf16"
    assert a.losses != b.losses and max(abs(x - y) / x for x, y in zip(a.losses, b.losses)) < 0.05


def test_more_than_one_process_is_refused(tiny_model, tmp_path, labelled, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(EmbeddingError, match="run it without torchrun"):
        train_embeddings(tiny_model, labelled[0], tmp_path / "x", ContrastiveConfig(steps=1))
    assert not (tmp_path / "x").exists()


def test_the_command_line_takes_time_budget_precision_and_resume(tiny_model, tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": f"document {i} about {'cats' if i % 2 else 'dogs'}"})
                                for i in range(20)), encoding="utf-8")
    out = tmp_path / "m"
    args = ["train-embeddings", str(tiny_model), "--corpus", str(corpus), "--batch-size", "4", "--out", str(out),
            "--format", "qkv", "--precision", "fp32", "--no-progress"]
    assert main([*args, "--time-budget", "0.002"]) == 0
    assert "loss on a fixed batch" in capsys.readouterr().out
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and meta["train_config"]["time_budget"] == 0.002
    assert main([*args, "--time-budget", "0.002", "--resume"]) == 0  # finished: returned as it is
    assert main([*args, "--time-budget", "0.002"]) == 2
    assert "already holds a run; continue it with --resume" in capsys.readouterr().err
    assert main([*args, "--steps", "3", "--resume"]) == 2
    assert "steps: 300 → 3" in capsys.readouterr().err
