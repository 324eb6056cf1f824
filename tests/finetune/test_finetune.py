"""End to end: qkv finetune / qkv predict on synthetic tasks with a tiny model (seconds each)."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import torch

from finetune_support import write_jsonl
from qkv.cli import main
from qkv.finetune.config import FinetuneConfig
from qkv.finetune.examples import FinetuneDataError
from qkv.finetune.run import finetune
from qkv.training.rundir import RunError

FAST = dict(batch_size=16, lr=3e-3, warmup_steps=5, progress=False, eval_sample=60, baselines=())


def _cfg(model, train, out, task="sequence-classification", **kw):
    return FinetuneConfig.from_dict({"model": str(model), "task": task, "train": [str(t) for t in train],
                                     "out": str(out), **FAST, **kw})


def test_token_classification_learns_a_synthetic_tagging_task_and_conll_round_trips(tiny_bert, conll_files, tmp_path,
                                                                                      capsys):
    train, held = conll_files
    out = tmp_path / "ner"
    rc = main(["finetune", str(tiny_bert), "--task", "token-classification", "--train", str(train), "--eval",
               str(held), "--out", str(out), "--epochs", "8", "--batch-size", "16", "--lr", "3e-3",
               "--no-progress", "--baselines", "word-tag"])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["fine_tuned"]["token_accuracy"] >= 0.99, report["fine_tuned"]
    assert report["fine_tuned"]["entity_f1"] >= 0.97
    assert "most frequent tag per word" in report["baselines"]
    assert "entity" in capsys.readouterr().out.lower()
    pred = tmp_path / "pred.jsonl"
    assert main(["predict", str(out), str(held), "--out", str(pred), "--no-progress"]) == 0
    rows = [json.loads(line) for line in pred.read_text().splitlines()]
    from qkv.finetune.examples import read_examples

    gold = read_examples(held, "token-classification")
    assert [r["tokens"] for r in rows] == gold.inputs
    tags = [t for r in rows for t in r["tags"]]
    truth = [t for s in gold.targets for t in s]
    assert np.mean([a == b for a, b in zip(tags, truth)]) >= 0.99


def test_sequence_classification_report_files_and_int_labels(tiny_bert, tmp_path):
    import random

    from finetune_support import TOPIC, topic_text

    rng = random.Random(4)
    names = list(TOPIC)
    rows = [{"text": topic_text(rng, names[k]), "label": 10 * k + 3} for _ in range(80) for k in range(3)]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    res = finetune(_cfg(tiny_bert, [train], tmp_path / "run", epochs=6, lr=1e-2, baselines=("tfidf", "frozen")))
    rep = res.report["fine_tuned"]
    assert res.status == "complete" and rep["accuracy"] >= 0.95, rep
    assert set(res.report["baselines"]) == {"TF-IDF + logistic regression",
                                            "frozen mean-pooled vectors + logistic regression"}
    for b in res.report["baselines"].values():  # compared example by example with the model
        pr = b["paired"]
        assert pr["model_only"] + pr["baseline_only"] <= 48 and 0 <= pr["p_value"] <= 1
    for name in ("report.json", "report.md", "confusion.png", "eval_predictions.jsonl", "curve.png", "qkv.json"):
        assert (tmp_path / "run" / name).is_file(), name
    assert (tmp_path / "run" / "confusion.png").read_bytes()[:4] == b"\x89PNG"
    first = json.loads((tmp_path / "run" / "eval_predictions.jsonl").read_text().splitlines()[0])
    assert isinstance(first["label"], int) and isinstance(first["predicted"], int)
    texts = tmp_path / "new.txt"
    texts.write_text("the bank price market loan\nthe goal match team\n")
    assert main(["predict", str(tmp_path / "run"), str(texts), "--out", str(tmp_path / "p.jsonl"),
                 "--no-progress"]) == 0
    pred = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [p["label"] for p in pred] == [13, 3]
    assert abs(sum(pred[0]["probabilities"].values()) - 1) < 1e-4
    import qkv

    model = qkv.load(tmp_path / "run").model
    assert type(model).__name__ == "SequenceClassifier" and model.task.labels == ("3", "13", "23")
    from qkv.finetune.predict import predict_file

    predict_file(qkv.load(tmp_path / "run"), str(texts), tmp_path / "q.jsonl", progress=False, device="cpu")
    again = [json.loads(line) for line in (tmp_path / "q.jsonl").read_text().splitlines()]
    assert [p["label"] for p in again] == ["13", "3"]  # from the head: its labels are strings


def test_regression_learns_a_count(tiny_bert, tmp_path):
    import random

    rng = random.Random(6)
    rows = []
    for _ in range(300):
        n = rng.randint(0, 4)
        words = [rng.choice(["the", "met", "in", "paris", "walked"]) for _ in range(8)] + ["goal"] * n
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": float(n)})
    data = write_jsonl(tmp_path / "r.jsonl", rows)
    res = finetune(_cfg(tiny_bert, [data], tmp_path / "reg", task="regression", epochs=30, pooling="mean",
                        baselines=("tfidf",)))
    rep = res.report["fine_tuned"]
    assert rep["pearson"] > 0.9 and rep["rmse"] < 0.6, rep
    assert "TF-IDF + ridge" in res.report["baselines"]


def test_interrupted_run_resumes_bit_identically(tiny_bert, topic_files, tmp_path):
    train, held = topic_files
    kw = dict(eval=[str(held)], steps=12, save_every=4, eval_every=6)
    whole = finetune(_cfg(tiny_bert, [train], tmp_path / "whole", **kw))

    def stop_at_7(step, model):
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)

    copy = tmp_path / "train.jsonl"
    lines = train.read_text(encoding="utf-8").splitlines(keepends=True)
    copy.write_text("".join(lines), encoding="utf-8")
    cfg = _cfg(tiny_bert, [copy], tmp_path / "part", **kw)
    first = finetune(cfg, on_backward=stop_at_7)
    assert first.status == "interrupted" and first.steps_done == 6  # the step being computed is abandoned
    before = (tmp_path / "part" / "run.json").read_text()
    copy.write_text("".join(reversed(lines)), encoding="utf-8")  # the same path, other data
    with pytest.raises(RunError) as e:
        finetune(cfg, resume=True)
    assert str(e.value) == (f"--resume: the data differ from those {tmp_path / 'part'} was started with (their "
                            "sha256 does not match run.json); resume with the same files, or start a new run")
    assert (tmp_path / "part" / "run.json").read_text() == before
    copy.write_text("".join(lines), encoding="utf-8")
    second = finetune(cfg, resume=True)
    assert second.status == "complete" and second.steps_done == 12
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "part" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert second.report["fine_tuned"] == whole.report["fine_tuned"]
    again = finetune(cfg, resume=True)  # a complete run stays complete
    assert again.report == second.report


def test_fine_tuned_model_exports_to_hugging_face_with_equal_logits(tiny_bert, topic_files, tmp_path):
    transformers = pytest.importorskip("transformers")
    train, held = topic_files
    finetune(_cfg(tiny_bert, [train], tmp_path / "run", eval=[str(held)], steps=10))
    assert main(["convert", str(tmp_path / "run"), str(tmp_path / "hf"), "--to", "hf"]) == 0
    import qkv

    ours = qkv.load(tmp_path / "run").model
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(5, ours.config.vocab_size, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    with torch.no_grad():
        diff = (ours(ids, mask).logits - theirs(input_ids=ids, attention_mask=mask).logits).abs().max()
    assert diff < 1e-5
    assert theirs.config.id2label == {0: "food", 1: "money", 2: "sport"}


@pytest.mark.parametrize("case", ["unknown-eval-label", "empty", "no-label-column", "head-mismatch", "window",
                                  "vocab"])
def test_bad_input_fails_before_training_and_writes_nothing(tiny_bert, topic_files, tmp_path, case, capsys):
    train, held = topic_files
    out = tmp_path / "run"
    args = ["finetune", str(tiny_bert), "--task", "sequence-classification", "--train", str(train), "--out",
            str(out), "--no-progress", "--steps", "2", "--baselines", "none"]
    if case == "unknown-eval-label":
        bad = write_jsonl(tmp_path / "ev.jsonl", [{"text": "x", "label": "weather"}])
        args += ["--eval", str(bad)]
        needle = "held-out label 'weather'"
    elif case == "empty":
        (tmp_path / "empty.jsonl").write_text("\n")
        args += ["--eval", str(tmp_path / "empty.jsonl")]
        needle = "no examples"
    elif case == "no-label-column":
        (tmp_path / "x.csv").write_text("text,topic\nhello,a\n")
        args[5] = str(tmp_path / "x.csv")
        needle = "no field/column 'label'"
    elif case == "window":
        args += ["--max-len", "200"]
        needle = "exceeds the model's window"
    elif case == "vocab":  # a tokenizer with more ids than the model's embedding table
        import shutil

        from tokenizers import Tokenizer

        shutil.copytree(tiny_bert, tmp_path / "grown")
        grown = Tokenizer.from_file(str(tmp_path / "grown" / "tokenizer.json"))
        grown.add_tokens(["brandnewword"])
        grown.save(str(tmp_path / "grown" / "tokenizer.json"))
        args[1] = str(tmp_path / "grown")
        needle = f"the tokenizer has {grown.get_vocab_size()} tokens but the model's vocabulary only"
    else:
        finetune(_cfg(tiny_bert, [train], tmp_path / "first", eval=[str(held)], steps=2))
        capsys.readouterr()  # that run's own output (its warm-up warning)
        four = write_jsonl(tmp_path / "four.jsonl", [{"text": "a b", "label": lab} for lab in "wxyz"])
        args[1], args[5] = str(tmp_path / "first"), str(four)
        args += ["--eval", str(four)]
        needle = "--reset-head"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert not out.exists()
    if case == "head-mismatch":  # replacing the head is allowed when asked for
        assert main(args + ["--reset-head"]) == 0


def test_config_is_validated():
    base = dict(model="m", task="sequence-classification", train=["a.jsonl"], out="o")
    for bad, needle in [({"task": "qa"}, "task='qa'"), ({"pooling": "max"}, "pooling"), ({"steps": 0}, "steps"),
                        ({"steps": 3, "time_budget": 1.0}, "both set"), ({"stride": 500, "max_len": 128}, "stride"),
                        ({"baselines": ["bm25"]}, "unknown baseline"), ({"labels": ["a", "a"]}, "distinct"),
                        ({"threads": "adaptive"}, "time_budget"), ({"lr": "big"}, "lr")]:
        with pytest.raises(ValueError, match=needle):
            FinetuneConfig.from_dict({**base, **bad})
    with pytest.raises(ValueError, match="unknown FinetuneConfig field"):
        FinetuneConfig.from_dict({**base, "epoch": 3})
    cfg = FinetuneConfig.from_dict(base)
    assert FinetuneConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(FinetuneDataError, match="not a folder"):
        finetune(cfg.replace(out="/tmp/qkv-never-written", train=("dataset:reuters8",)))


def test_a_time_budgeted_run_ends_at_its_deadline_and_resumes_complete(tiny_bert, topic_files, tmp_path):
    """--time-budget: no step count; 2 s a step against a 1-minute budget is exactly 30 steps."""
    train, held = topic_files

    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock = Clock()
    cfg = _cfg(tiny_bert, [train], tmp_path / "timed", eval=[str(held)], time_budget=1.0, truncate=True)
    res = finetune(cfg, clock=clock, on_backward=lambda step, model: setattr(clock, "t", clock.t + 2.0))
    assert res.status == "complete" and res.steps_done == 30
    meta = json.loads((tmp_path / "timed" / "run.json").read_text())
    assert meta["train_config"]["steps"] is None and meta["elapsed_s"] == pytest.approx(60.0)
    assert "accuracy" in meta["report"]
    assert finetune(cfg, resume=True).report == res.report


def test_torchrun_two_ranks_match_one_process_with_double_batch(tiny_bert, topic_files, tmp_path):
    """Two processes with batch 4 compute what one process with batch 8 computes (no dropout), with
    the model whole in each (``ddp``) and sharded over them (``fsdp``)."""
    import random
    import subprocess
    import sys

    train, held = topic_files
    common = ["finetune", str(tiny_bert), "--task", "sequence-classification", "--train", str(train), "--eval",
              str(held), "--steps", "6", "--eval-every", "3", "--eval-sample", "20", "--log-every", "1", "--lr", "3e-3",
              "--classifier-dropout", "0", "--baselines", "none", "--no-progress", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = tmp_path / "one"
    r = subprocess.run([sys.executable, "-m", "qkv", *common, "--out", str(one), "--batch-size", "8"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    la = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    for strategy in ("ddp", "fsdp"):
        two = tmp_path / strategy
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port",
               str(random.randint(20000, 40000)), "-m", "qkv", *common, "--out", str(two), "--batch-size", "4",
               "--strategy", strategy]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        lb = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
        assert len(la) == len(lb) >= 6
        for ra, rb in zip(la, lb):
            for key in ("loss", "eval_loss", "accuracy"):
                if key in ra:
                    assert abs(ra[key] - rb[key]) < 1e-5, (strategy, key, ra, rb)
        assert (two / "report.json").is_file()


def test_a_run_stopped_before_its_report_is_finished_by_resume(tiny_bert, topic_files, tmp_path):
    train, held = topic_files
    cfg = _cfg(tiny_bert, [train], tmp_path / "run", eval=[str(held)], steps=4)
    first = finetune(cfg)
    for name in ("report.json", "report.md", "eval_predictions.jsonl"):
        (tmp_path / "run" / name).unlink()  # as if the process died after training
    again = finetune(cfg, resume=True)
    assert again.status == "complete" and again.steps_done == 4
    assert again.report["fine_tuned"] == first.report["fine_tuned"]
    assert (tmp_path / "run" / "report.md").is_file()


def test_a_model_below_a_baseline_is_warned_about(tiny_bert, topic_files, tmp_path, capsys):
    from qkv.finetune.report import below_baselines

    train, held = topic_files
    res = finetune(_cfg(tiny_bert, [train], tmp_path / "run", eval=[str(held)], steps=1, warmup_steps=0, lr=1e-6,
                        baselines=("tfidf",)))
    mine, theirs = res.report["fine_tuned"]["accuracy"], res.report["baselines"]["TF-IDF + logistic regression"]
    assert theirs["accuracy"] > mine  # one step at a tiny rate: chance level
    err = capsys.readouterr().err
    assert f"qkv: warning: the fine-tuned model (accuracy {mine:.4f}) scored below every baseline it was compared " \
           f"with (TF-IDF + logistic regression {theirs['accuracy']:.4f})" in err
    assert res.report["warnings"] == [err.split("qkv: warning: ")[1].strip()]
    assert below_baselines("regression", {"rmse": 1.0}, {"mean": {"rmse": 2.0}}) is None
    assert "scored below a baseline" in below_baselines("regression", {"rmse": 1.0},
                                                       {"mean": {"rmse": 0.5}, "other": {"rmse": 3.0}})
