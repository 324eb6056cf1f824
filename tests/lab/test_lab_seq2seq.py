"""A test-sized run: the encoder-decoder learns to reverse 4–6 digits (preset tiny, 300 steps), its
cross-attention is the anti-diagonal, the run folder loads, and ``qkv inspect`` draws the maps."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import qkv
from qkv.lab.seq2seq import evaluate, train
from qkv.lab.tasks import get_task


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab") / "reverse"
    task = get_task("reverse", min_len=4, max_len=6)
    return task, train(task, preset="tiny", steps=300, seed=0, out=out, eval_examples=256, progress=False), out


def test_reverse_is_learned(run):
    task, result, out = run
    assert result.exact_match >= 0.99, result  # measured 1.0 (seeds 0, 1)
    assert result.chance < 1e-3 and result.steps == 300
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["exact_match"] == result.exact_match and metrics["task"] == "reverse"


def test_the_folder_loads_and_generates_the_same(run):
    task, result, out = run
    model, tok = qkv.load(out / "model")
    assert tok.get_vocab()["3"] == task.vocab.index("3")
    assert evaluate(model, task, 64) == evaluate(result.model, task, 64)


def test_cross_attention_follows_the_reversal(run):
    """Decoder position t emits source token n-1-t: the head-averaged cross-attention argmax of row
    t should be source position n-1-t (the textbook's point: cross-attention aligns)."""
    task, result, _ = run
    model = result.model.eval()
    b = task.batch(0, 64, seed=12345)
    hits = total = 0
    with torch.no_grad():
        out = model(b.input_ids, b.attention_mask, labels=b.labels, output_attentions=True)
    cross = out.cross_attentions[-1].mean(1)  # (B,H,T,S) -> (B,T,S)
    for i, src in enumerate(b.sources):
        n = len(src)
        arg = cross[i, :n].argmax(-1).tolist()  # rows 0…n-1 emit the n source tokens reversed
        hits += sum(a == n - 1 - t for t, a in enumerate(arg))
        total += n
    assert hits / total >= 0.8, hits / total


def test_inspect_draws_cross_attention_maps(run, tmp_path):
    from qkv.analysis.viewer import run_inspect

    _, _, out = run
    ins, paths = run_inspect(out / "model", "3 1 4 1 5", tmp_path / "ins")
    assert ins.output_tokens[:6] == ["5", "1", "4", "1", "3", "[EOS]"]
    L, H, T, S = ins.cross_attentions.shape
    assert S == 5 and T == len(ins.target_tokens) and ins.decoder_attentions.shape == (L, H, T, T)
    assert paths["cross_1"].is_file() and paths["encoder_1"].is_file() and paths["decoder_1"].is_file()
    anti = np.argmax(ins.cross_attentions[-1].mean(0)[:5], -1)
    assert (anti == np.arange(4, -1, -1)).mean() >= 0.8


def test_bad_budgets_are_refused_before_training():
    with pytest.raises(ValueError, match="steps"):
        train("reverse", steps=0, progress=False)
    with pytest.raises(ValueError, match="preset"):
        train("reverse", preset="huge", progress=False)
