"""Continued pretraining: --init-from a Hugging Face BERT folder (with and without an MLM head)
or a qkv run, with that model's tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

from qkv.training.config import TrainConfig
from qkv.training.loop import pretrain

transformers = pytest.importorskip("transformers")

RUN = dict(vocab_size=300, max_len=24, batch_size=4, warmup_steps=1, eval_every=1000, eval_batches=2,
           eval_batch_size=8, save_every=1000, log_every=1, progress=False, corpus=("dataset:pydoc",), steps=3)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path / "cache"))


def _hf_folder(tmp_path, *, masked_lm: bool):
    """A random-weight HF BERT (distinct sizes) saved with a WordPiece tokenizer trained on pydoc."""
    from qkv.data.corpus import CorpusOptions, open_corpus
    from qkv.data.tokenizer import train_tokenizer

    tok = train_tokenizer(open_corpus(["dataset:pydoc"], CorpusOptions()), vocab_size=300)
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=24, num_hidden_layers=2,
                                  num_attention_heads=3, intermediate_size=40, max_position_embeddings=40,
                                  type_vocab_size=2)
    torch.manual_seed(3)
    cls = transformers.BertForMaskedLM if masked_lm else transformers.BertModel
    model = cls(cfg).eval()
    folder = tmp_path / ("hf-mlm" if masked_lm else "hf-encoder")
    model.save_pretrained(folder)
    tok.save(folder)
    return folder, model


def _first_step_state(cfg):
    seen = {}

    def hook(step, model):
        if step == 1:  # after the first backward, before the first update: the initial weights
            seen.update({k: v.detach().clone() for k, v in model.state_dict().items()})
    pretrain(cfg, on_backward=hook)
    return seen


def test_init_from_an_hf_encoder_without_head_ties_a_new_head_and_uses_its_tokenizer(tmp_path):
    folder, hf = _hf_folder(tmp_path, masked_lm=False)
    cfg = TrainConfig(out=str(tmp_path / "run"), init_from=str(folder), model={"dropout": 0.0}, **RUN)
    state = _first_step_state(cfg)
    emb = hf.embeddings.word_embeddings.weight.detach()
    assert torch.equal(state["encoder.embeddings.tokens.weight"], emb)
    q = hf.encoder.layer[1].attention.self.query.weight.detach()
    fused = [v for k, v in state.items() if k.startswith("encoder.layers.1.") and "qkv_proj.weight" in k]
    assert fused and torch.equal(fused[0][:24], q)
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["model_config"]["d_model"] == 24 and meta["model_config"]["n_layers"] == 2
    assert meta["model_config"]["dropout"] == 0.0  # the override applied on top of the folder's config
    tok_run = json.loads((tmp_path / "run" / "tokenizer.json").read_text())["model"]["vocab"]
    tok_src = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    assert tok_run == tok_src
    import qkv

    model = qkv.load(tmp_path / "run").model  # a masked LM now, decoder tied to the embeddings
    assert model.decoder_weight.data_ptr() == model.encoder.embeddings.tokens.weight.data_ptr()


def test_init_from_an_hf_masked_lm_keeps_its_head(tmp_path):
    folder, hf = _hf_folder(tmp_path, masked_lm=True)
    cfg = TrainConfig(out=str(tmp_path / "run"), init_from=str(folder), **RUN)
    state = _first_step_state(cfg)
    assert torch.equal(state["head.bias"], hf.cls.predictions.bias.detach())
    assert torch.equal(state["head.dense.weight"], hf.cls.predictions.transform.dense.weight.detach())


def test_init_from_a_qkv_run_continues_from_its_weights(tmp_path):
    first = TrainConfig(out=str(tmp_path / "a"), preset="tiny", model={"max_len": 40, "dropout": 0.0}, **RUN)
    pretrain(first)
    import qkv

    before = qkv.load(tmp_path / "a").model.state_dict()
    state = _first_step_state(TrainConfig(out=str(tmp_path / "b"), init_from=str(tmp_path / "a"), **RUN))
    assert all(torch.equal(state[k], v) for k, v in before.items() if k in state)


def test_init_from_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        pretrain(TrainConfig(out=str(tmp_path / "run"), init_from=str(tmp_path / "missing"), **RUN))
    with pytest.raises(ValueError, match="drop --tokenizer"):
        TrainConfig(out="x", corpus="y", init_from="m", tokenizer="t")
    folder, _ = _hf_folder(tmp_path, masked_lm=False)
    with pytest.raises(ValueError, match="exceeds the model's window"):
        pretrain(TrainConfig(out=str(tmp_path / "run2"), init_from=str(folder), **{**RUN, "max_len": 64}))


def test_init_from_a_fine_tuned_classifier_uses_its_encoder(tmp_path):
    """A BertForSequenceClassification folder: its encoder (and pooler) start the run, the task head is
    left out, a new masked-LM head is tied to its word embeddings."""
    from qkv.data.corpus import CorpusOptions, open_corpus
    from qkv.data.tokenizer import train_tokenizer

    tok = train_tokenizer(open_corpus(["dataset:pydoc"], CorpusOptions()), vocab_size=300)
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=24, num_hidden_layers=2,
                                  num_attention_heads=3, intermediate_size=40, max_position_embeddings=40,
                                  num_labels=3)
    torch.manual_seed(4)
    hf = transformers.BertForSequenceClassification(cfg).eval()
    folder = tmp_path / "hf-cls"
    hf.save_pretrained(folder)
    tok.save(folder)
    run = TrainConfig(out=str(tmp_path / "run"), init_from=str(folder), model={"dropout": 0.0}, **RUN)
    state = _first_step_state(run)
    assert torch.equal(state["encoder.embeddings.tokens.weight"], hf.bert.embeddings.word_embeddings.weight.detach())
    assert not any(k.startswith("classifier") for k in state)
