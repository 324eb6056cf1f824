"""The encoder trainer for the synthetic tasks: config checks and sizing, determinism, learning an
easy task well above chance, divergence reported (not raised), and the measurements (held-out
exact match, attention entropy, gradient norms at initialisation) against computations by hand."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from qkv.config import ModelConfig
from qkv.lab.encoder_config import EVAL_SEED, EncoderTaskConfig
from qkv.lab.encoder_run import attention_entropy, evaluate, init_grad_norms, train_on_task
from qkv.lab.synthetic import IGNORE, get_synthetic_task
from qkv.models.builders import build_masked_lm

#: A test-sized model: one layer, width 32 (distinct sizes: 2 heads, d_ff 48).
TINY = dict(d_model=32, n_heads=2, d_ff=48, n_layers=1, position="rope")
EASY = dict(n_symbols=8, min_len=4, train_len=8)  # copy_offset rows of 4–8 symbols, chance 1/8


def tiny_run(**changes) -> EncoderTaskConfig:
    base = dict(task="copy_offset", task_options=dict(EASY), model=dict(TINY), steps=12, batch_size=16,
                warmup_steps=2, eval_batches=2, log_every=4)
    return EncoderTaskConfig(**{**base, **changes})


# --- the config ---------------------------------------------------------------------------------------

def test_the_model_is_sized_for_the_task_and_its_longest_evaluation_row():
    cfg = EncoderTaskConfig(task="reverse", task_options=dict(n_symbols=9), eval_lengths=(64, 128))
    m = cfg.model_config()
    assert m.vocab_size == 5 + 9 and m.max_len == 256 == cfg.longest_row()  # 128 symbols + 128 slots
    assert (m.d_model, m.n_layers, m.type_vocab_size, m.dropout) == (64, 2, 0, 0.0)  # the defaults
    assert EncoderTaskConfig(task="mqar").model_config().max_len == 2 * 8 + 1 + 8
    whole = ModelConfig.from_flat(vocab_size=21, max_len=64, d_model=24, n_heads=3, d_ff=40, n_layers=1,
                        type_vocab_size=0)
    assert EncoderTaskConfig(model=whole).model_config() is whole
    json.dumps(EncoderTaskConfig(model=whole, eval_lengths=(64,)).to_dict())


@pytest.mark.parametrize("changes, message", [
    (dict(task="sort"), r"task='sort' is not allowed; allowed: mqar, two_lookup"),
    (dict(task_options=dict(shift=0)), "shift=0 must be an int ≥ 1"),
    (dict(task_options=dict(width=3)), r"unknown option\(s\) \['width'\] for synthetic task 'copy_offset'"),
    (dict(task="mqar", task_options={}, eval_lengths=(64,)),
     r"eval_lengths=\(64,\) need a length task \(copy, reverse, copy_offset, neighbours\); 'mqar' rows"),
    (dict(eval_lengths=(300,)), r"length=300 must be an int in \[2, 256\] \(copy_offset\)"),
    (dict(eval_lengths=[64]), r"eval_lengths must be a tuple of ints, got \[64\]"),
    (dict(steps=0), "steps=0 must be an int ≥ 1"),
    (dict(lr=0.0), "lr=0.0 must be a positive number"),
    (dict(clip_norm=-1.0), "clip_norm=-1.0 must be a positive number"),
    (dict(weight_decay=-0.1), "weight_decay=-0.1 must be"),
    (dict(schedule="step"), r"schedule='step' is not allowed; allowed: linear, cosine, constant"),
    (dict(seed=EVAL_SEED), r"seed=2147483647 must be < 2147483647 \(that stream is the held-out set\)"),
    (dict(model=dict(n_head=2)), r"unknown ModelConfig field\(s\) \['n_head'\]"),
    (dict(model=dict(vocab_size=30)), "model: vocab_size is the task's; leave it out of the overrides"),
    (dict(model=dict(max_len=5)), r"model.max_len=5 is shorter than the longest row \(8 tokens\)"),
    (dict(model=ModelConfig.from_flat(vocab_size=99)), "model.vocab_size=99 must be the task's 13"),
    (dict(model="tiny"), "model must be a dict of ModelConfig overrides or a ModelConfig, got str"),
    (dict(model=dict(TINY, n_heads=5)), "n_heads=5 does not divide d_model=32"),
])
def test_bad_configs_are_refused_with_one_clear_line(changes, message):
    with pytest.raises(ValueError, match=message):
        tiny_run(**changes)


def test_train_on_task_refuses_what_is_not_a_config():
    with pytest.raises(ValueError, match="config must be an EncoderTaskConfig, got dict"):
        train_on_task({"task": "copy"})


# --- runs ---------------------------------------------------------------------------------------------

def test_a_run_is_deterministic_for_its_seed():
    seen = []
    a = train_on_task(tiny_run(), progress=lambda step, loss: seen.append((step, loss)))
    b = train_on_task(tiny_run())
    assert a == b  # every measured field (timings and the model left out)
    assert tuple(seen) == a.loss_curve  # the progress callable sees the curve as it is drawn
    assert a.loss_curve == b.loss_curve and [s for s, _ in a.loss_curve] == [4, 8, 12]
    other = train_on_task(tiny_run(seed=1))
    assert other.loss_curve != a.loss_curve and other.init_loss != a.init_loss
    assert a.steps_done == 12 and not a.diverged and a.seconds > 0 and a.steps_per_s > 0
    json.dumps(a.to_dict())


def test_an_easy_setting_is_learned_well_above_chance():
    """copy_offset with shift 1 (each position names its left neighbour), 8 symbols, a 2-layer
    width-64 RoPE encoder, 80 steps of 32 rows at lr 1e-2: measured token and sequence accuracy 1.0
    for seeds 0–4 (chance 0.125), 0.5 s of training on 2 idle CPU cores."""
    cfg = EncoderTaskConfig(task="copy_offset", task_options=dict(shift=1, **EASY),
                            model=dict(position="rope"), steps=80, batch_size=32, lr=1e-2, warmup_steps=8,
                            eval_batches=2, eval_lengths=(64,))
    r = train_on_task(cfg)
    assert r.chance == 0.125 and not r.diverged
    assert r.train_eval.token_accuracy >= 0.9 and r.train_eval.sequence_accuracy >= 0.5, r.train_eval
    assert r.loss_curve[-1][1] < 0.5 * r.loss_curve[0][1]
    (long,) = r.length_evals
    assert long.length == 64 and long.n_rows == 64 and long.n_tokens == 64 * 63
    assert r.train_eval.n_rows == 64 and r.train_eval.length is None
    H = np.array(r.attention_entropy)
    assert H.shape == (2, 4) and (H >= 0).all() and (H <= r.uniform_entropy + 1e-6).all()
    H0 = np.array(r.init_attention_entropy)  # at initialisation (std 0.02 weights): all but uniform
    assert H0.shape == (2, 4) and (H0 <= r.uniform_entropy + 1e-6).all() and (H0 > r.uniform_entropy - 0.05).all()
    assert H.mean() < H0.mean() - 0.3  # trained heads have sharpened
    assert len(r.init_layer_grad_norms) == len(r.init_q_grad_norms) == len(r.init_k_grad_norms) == 2


def test_an_absurd_learning_rate_is_reported_as_diverged_not_raised():
    r = train_on_task(tiny_run(lr=1e8, steps=30))
    assert r.diverged and r.steps_done < 30
    assert not math.isfinite(r.loss_curve[-1][1]) or r.loss_curve[-1][1] > 1e6
    assert r.loss_curve[-1][0] == r.steps_done + 1  # the step that stopped it


# --- the measurements against hand computations -------------------------------------------------------

def test_init_grad_norms_are_those_of_the_first_batch_before_any_step():
    cfg = tiny_run(model=dict(TINY, n_layers=2, n_kv_heads=1))  # GQA: keys are G·D = 16 rows
    r = train_on_task(dataclasses.replace(cfg, steps=1))
    torch.manual_seed(cfg.seed)  # the same initial weights, by hand
    model = build_masked_lm(cfg.model_config())
    b = get_synthetic_task("copy_offset", **EASY).batch(0, 16, cfg.seed)
    loss = model(b.input_ids, b.attention_mask, labels=b.labels).loss
    loss.backward()
    assert r.init_loss == pytest.approx(float(loss.detach()), rel=1e-6)
    for i, layer in enumerate(model.encoder.layers):
        grads = torch.cat([p.grad.flatten() for p in layer.parameters()])
        assert r.init_layer_grad_norms[i] == pytest.approx(float(grads.norm()), rel=1e-5)
        gw, gb = layer.attention.qkv_proj.weight.grad, layer.attention.qkv_proj.bias.grad  # (32+16+16, 32)
        q = torch.cat([gw[:32].flatten(), gb[:32]])
        k = torch.cat([gw[32:48].flatten(), gb[32:48]])
        assert r.init_q_grad_norms[i] == pytest.approx(float(q.norm()), rel=1e-5)
        assert r.init_k_grad_norms[i] == pytest.approx(float(k.norm()), rel=1e-5)
    # the probe leaves no gradient behind
    again = build_masked_lm(cfg.model_config())
    init_grad_norms(again, b)
    assert all(p.grad is None for p in again.parameters())


def test_a_shared_query_key_map_reports_its_one_gradient_for_both():
    cfg = tiny_run(model=dict(TINY, n_layers=1, shared_qk=True), steps=1)
    r = train_on_task(cfg)
    torch.manual_seed(cfg.seed)
    model = build_masked_lm(cfg.model_config())
    b = get_synthetic_task("copy_offset", **EASY).batch(0, 16, cfg.seed)
    model(b.input_ids, b.attention_mask, labels=b.labels).loss.backward()
    proj = model.encoder.layers[0].attention.qkv_proj  # (2C, C): rows [0:32] queries = keys, then values
    g = torch.cat([proj.weight.grad[:32].flatten(), proj.bias.grad[:32]])
    assert r.init_q_grad_norms == r.init_k_grad_norms == pytest.approx((float(g.norm()),), rel=1e-5)


def test_attention_entropy_by_hand_on_a_padded_batch():
    task = get_synthetic_task("copy", n_symbols=5, min_len=1, train_len=6)
    torch.manual_seed(3)
    model = build_masked_lm(ModelConfig.from_flat(vocab_size=task.vocab_size, max_len=12, d_model=24, n_heads=3,
                                        d_ff=40, n_layers=2, type_vocab_size=0, dropout=0.0))
    b = task.batch(0, 5, seed=1)
    assert not b.attention_mask.all()  # padding in the batch
    got, uniform = attention_entropy(model, b)
    with torch.no_grad():
        maps = model.encoder(b.input_ids, b.attention_mask, output_attentions=True).attentions
    mask = b.attention_mask.numpy()
    want = np.zeros((2, 3))
    for layer, a in enumerate(maps):
        a = a.double().numpy()  # (B,H,T,T)
        for h in range(3):
            rows = [-(p[p > 0] * np.log(p[p > 0])).sum() for i in range(len(mask)) for t, p in
                    enumerate(a[i, h]) if mask[i, t]]
            want[layer, h] = np.mean(rows)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-4)
    n_real = mask.sum(1)
    assert uniform == pytest.approx((n_real * np.log(n_real)).sum() / n_real.sum())


class _Oracle(nn.Module):
    """Answers every scored position right, except the first scored position of every other row."""

    def forward(self, input_ids, attention_mask, labels):
        scored = labels != IGNORE
        pred = labels.clone()
        for i in range(0, len(labels), 2):
            first = int(scored[i].nonzero()[0])
            pred[i, first] = 0  # [PAD]: wrong
        logits = nn.functional.one_hot(pred[scored], 40).float()  # (N,V) as a masked LM's sparse output
        return type("Out", (), {"logits": logits})()


def test_evaluate_counts_tokens_and_rows_over_all_batches():
    task = get_synthetic_task("copy", n_symbols=7, min_len=1, train_len=9)
    score = evaluate(_Oracle(), task, batches=3, batch_size=5)
    n_tok = sum(int((task.batch(i, 5, EVAL_SEED).labels != IGNORE).sum()) for i in range(3))
    wrong_rows = 3 * 3  # rows 0, 2, 4 of each batch
    assert (score.n_tokens, score.n_rows) == (n_tok, 15)
    assert score.token_accuracy == pytest.approx((n_tok - wrong_rows) / n_tok)
    assert score.sequence_accuracy == pytest.approx(6 / 15)
    at64 = evaluate(_Oracle(), task, batches=1, batch_size=4, length=64)
    assert (at64.length, at64.n_tokens, at64.sequence_accuracy) == (64, 4 * 64, 0.5)


# --- on the training engine: time budget, run folder and resume, precision ------------------------------

class FakeClock:
    """A clock that only moves when a test moves it."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_time_budget_stops_the_run_at_its_deadline():
    clock = FakeClock()

    def tick(step, model):  # every step takes one second
        clock.t += 1.0

    r = train_on_task(tiny_run(time_budget=0.25, log_every=1), clock=clock, on_backward=tick)  # 15 s
    assert r.steps_done == 15 and not r.diverged
    assert [s for s, _ in r.loss_curve] == list(range(1, 16))
    assert tiny_run(time_budget=0.25).to_dict()["time_budget"] == 0.25
    assert "time_budget" not in tiny_run().to_dict() and "precision" not in tiny_run().to_dict()  # stored as before
    with pytest.raises(ValueError, match="time_budget=0 must be a positive number"):
        tiny_run(time_budget=0)


def test_an_interrupted_run_resumes_bit_identically(tmp_path):
    import os
    import signal

    from safetensors.torch import load_file

    cfg = tiny_run()
    whole = train_on_task(cfg, out=tmp_path / "whole")
    assert whole == train_on_task(cfg)  # a run folder changes no number

    def stop(step, model):
        if step == 7:  # a stop request while step 7 runs: it is abandoned, step 6 checkpointed
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt, match="stopped after step 6"):
        train_on_task(cfg, out=tmp_path / "part", on_backward=stop)
    assert json.loads((tmp_path / "part" / "run.json").read_text())["status"] == "interrupted"
    again = train_on_task(cfg, out=tmp_path / "part", resume=True)
    assert again == whole  # every measured field: the loss curve, the held-out scores, the entropies
    a, b = load_file(str(tmp_path / "whole" / "model.safetensors")), load_file(str(tmp_path / "part" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    done = train_on_task(cfg, out=tmp_path / "part", resume=True)  # finished: returned as it is
    assert done == whole and done.model is not None
    with pytest.raises(ValueError, match=r"different configuration: steps: 12 → 13"):
        train_on_task(tiny_run(steps=13), out=tmp_path / "part", resume=True)
    with pytest.raises(ValueError, match="already holds a run"):
        train_on_task(cfg, out=tmp_path / "part")


def test_a_diverged_run_with_a_folder_says_so(tmp_path):
    r = train_on_task(tiny_run(lr=1e8, steps=30), out=tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert r.diverged and meta["status"] == "diverged" and meta["steps_done"] == r.steps_done
    again = train_on_task(tiny_run(lr=1e8, steps=30), out=tmp_path / "run", resume=True)  # final: as it was
    assert again.diverged and again.steps_done == r.steps_done and repr(again.loss_curve) == repr(r.loss_curve)


def test_bf16_runs_and_stays_close_to_fp32():
    from qkv.training.precision import bf16_support

    ok, why = bf16_support("cpu")
    if not ok:
        pytest.skip(f"bf16 training falls back to fp32 here: {why}")
    a, b = train_on_task(tiny_run()), train_on_task(tiny_run(precision="bf16"))
    assert (a.precision, b.precision) == ("fp32", "bf16")
    la, lb = [x for _, x in a.loss_curve], [x for _, x in b.loss_curve]
    assert la != lb  # bf16 really ran ...
    assert max(abs(x - y) / x for x, y in zip(la, lb)) < 0.02  # ... and only rounding differs (measured 0.005 %)
