"""Causal-LM pretraining (--objective clm): labels, baselines by hand, the run, resume, refusals."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import qkv
from qkv.data.pipeline import clm_labels
from qkv.models.causal_lm import CausalLM
from qkv.training.config import TrainConfig
from qkv.training.loop import pretrain
from qkv.training.baselines import CountModel, baseline_perplexities

TINY = dict(objective="clm", preset="tiny", model={"max_len": 40, "dropout": 0.0, "norm": "pre"}, vocab_size=300,
            max_len=24, batch_size=6, warmup_steps=2, eval_every=4, eval_batches=3, eval_batch_size=8,
            save_every=3, log_every=1, progress=False, corpus=("dataset:pydoc",))


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path / "cache"))


def test_labels_skip_padding_and_the_closing_sep_only():
    CLS, SEP, PAD = 2, 3, 0
    ids = torch.tensor([[CLS, 7, SEP, 8, 9, SEP], [CLS, 5, 6, SEP, PAD, PAD]])
    mask = ids != PAD
    mask[0] = True
    labels = clm_labels(ids, mask, SEP)
    assert labels.tolist() == [[CLS, 7, SEP, 8, 9, -100], [CLS, 5, 6, -100, -100, -100]]


def test_count_baselines_against_a_hand_computation():
    # pairs (previous → next): 1→2, 1→2, 2→1, 1→3 over V = 4
    prev, nxt = np.array([1, 1, 2, 1]), np.array([2, 2, 1, 3])
    m = CountModel(prev, nxt, 4)
    # unigram, add-one: c = [0, 1, 2, 1], N = 4 → p = (c + 1) / 8
    assert np.allclose(m.p_unigram(np.array([0, 1, 2, 3])), [1 / 8, 2 / 8, 3 / 8, 2 / 8])
    # bigram, λ = 0.5: p(2 | 1) = 0.5 · 2/3 + 0.5 · 3/8; an unseen context falls back to the unigram
    got = m.p_bigram(np.array([1, 0]), np.array([2, 2]), 0.5)
    assert np.allclose(got, [0.5 * 2 / 3 + 0.5 * 3 / 8, 3 / 8])


def test_baselines_are_scored_on_the_held_out_blocks_from_training_counts(tmp_path):
    from qkv.data.pipeline import prepare_pretraining_data

    data = prepare_pretraining_data("dataset:pydoc", vocab_size=300, max_len=24, cache_dir=tmp_path / "c")
    idx = np.arange(min(20, len(data.eval)))
    b = baseline_perplexities(data.train, data.eval, idx, data.tokenizer.vocab_size)
    assert 1 < b["bigram_perplexity"] < b["unigram_perplexity"] < data.tokenizer.vocab_size
    # the count of scored tokens is the model's: every real position but [CLS] and each closing [SEP]
    blocks = data.eval.batch(idx)
    labels = clm_labels(blocks.input_ids, blocks.attention_mask, data.tokenizer.special.sep)
    assert b["baseline_tokens"] == int((labels[:, 1:] != -100).sum())


def test_clm_run_writes_a_causal_lm_with_perplexity_beside_the_baselines(tmp_path, capsys):
    out = tmp_path / "run"
    result = pretrain(TrainConfig(out=str(out), steps=8, **TINY))
    assert result.status == "complete"
    ev = result.final_eval
    for key in ("eval_loss", "perplexity", "accuracy", "unigram_perplexity", "bigram_perplexity", "scored_tokens"):
        assert key in ev, key
    assert math.isclose(ev["perplexity"], math.exp(ev["eval_loss"]), rel_tol=1e-9)
    model = qkv.load(out).model
    assert isinstance(model, CausalLM) and model.decoder.causal
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("bigram_perplexity" in r for r in rows)
    assert json.loads((out / "run.json").read_text())["train_config"]["objective"] == "clm"


def test_clm_run_crashed_mid_way_resumes_bit_identically(tmp_path):
    """A clm run that dies at step 5 (its last checkpoint: step 3) and is resumed ends with the
    weights and the metrics of the uninterrupted run."""
    full, part = tmp_path / "full", tmp_path / "part"
    pretrain(TrainConfig(out=str(full), steps=9, **TINY))

    def crash(step, model):
        if step == 5:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain(TrainConfig(out=str(part), steps=9, **TINY), on_backward=crash)
    assert not (part / "model.safetensors").exists()
    pretrain(TrainConfig(out=str(part), steps=9, **TINY), resume=True)
    a, b = load_file(str(full / "model.safetensors")), load_file(str(part / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k not in ("tokens_per_s", "elapsed_s")}  # noqa: E731
                       for x in (p / "metrics.jsonl").read_text().splitlines()]
    assert strip(full) == strip(part)


@pytest.mark.parametrize("field,value,flag", [("select_rate", 0.3, "--select-rate"), ("whole_word", True, "--whole-word"),
                                              ("unigram_bias", False, "--no-unigram-bias"), ("mask_rate", 0.5, "--mask-rate")])
def test_masked_lm_options_are_refused_with_clm(tmp_path, field, value, flag):
    with pytest.raises(ValueError, match=flag):
        TrainConfig(out=str(tmp_path / "r"), **{**TINY, field: value})


def test_unknown_objective_is_refused(tmp_path):
    with pytest.raises(ValueError, match="objective"):
        TrainConfig(out=str(tmp_path / "r"), **{**TINY, "objective": "gpt"})


def test_init_from_must_match_the_objective(tmp_path):
    out = tmp_path / "run"
    pretrain(TrainConfig(out=str(out), steps=3, **TINY))
    mlm = {k: v for k, v in TINY.items() if k not in ("objective", "vocab_size")}
    with pytest.raises(ValueError, match="causal LM"):
        pretrain(TrainConfig(out=str(tmp_path / "mlm"), steps=2, init_from=str(out), **mlm))
    again = pretrain(TrainConfig(out=str(tmp_path / "more"), steps=2, init_from=str(out),
                                 **{k: v for k, v in TINY.items() if k != "vocab_size"}))
    assert again.status == "complete"


def test_cli_objective_clm_prints_the_baselines(tmp_path):
    env = {"QKV_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    args = ["--objective", "clm", "--corpus", "dataset:pydoc", "--out", str(tmp_path / "run"), "--preset", "tiny",
            "--model", json.dumps({"max_len": 40, "dropout": 0.0}), "--vocab-size", "300", "--max-len", "24",
            "--batch-size", "4", "--steps", "3", "--eval-every", "3", "--eval-batches", "2", "--no-progress"]
    r = subprocess.run([sys.executable, "-m", "qkv", "pretrain", *args], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "bigram baseline" in r.stdout and "unigram" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "qkv", "pretrain", *args[:-1], "--select-rate", "0.2",
                          "--no-progress"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "--select-rate" in bad.stderr and "Traceback" not in bad.stderr
