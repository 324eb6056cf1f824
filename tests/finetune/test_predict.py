"""qkv predict's padding-free path: score_packed against the padded score of the model as it trained
(to 1e-5, every task), batching limits, and the reduced precisions against float32."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from finetune_support import TOPIC, tagged_sentence, topic_text, write_conll, write_jsonl
from qkv.cli import main
from qkv.finetune.config import FinetuneConfig
from qkv.finetune.run import finetune
from qkv.finetune.encode import encode_sequences, encode_tagged
from qkv.finetune.inputs import load_task_model
from qkv.finetune.predict import score, score_packed
from qkv.hardware import precision_unsupported
from qkv.inference import for_inference

FAST = dict(batch_size=16, lr=3e-3, warmup_steps=5, progress=False, eval_sample=40, baselines=(), epochs=2)


def _run(tiny_bert, tmp_path, task):
    rng = random.Random(5)
    if task == "token-classification":
        train = write_conll(tmp_path / "train.conll", [tagged_sentence(rng) for _ in range(80)])
    else:
        names = list(TOPIC)
        rows = [{"text": topic_text(rng, names[k]), "label": names[k] if task != "regression" else float(k)}
                for _ in range(30) for k in range(3)]
        train = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = FinetuneConfig.from_dict({"model": str(tiny_bert), "task": task, "train": [str(train)],
                                    "out": str(tmp_path / "run"), "max_len": 16, **FAST})
    assert finetune(cfg).status == "complete"
    return tmp_path / "run"


def _encoded(tok, task, max_len):
    rng = random.Random(9)
    if task == "token-classification":
        sents = [tagged_sentence(rng)[0] for _ in range(25)]
        return encode_tagged(tok, sents, [[0] * len(s) for s in sents], max_len=max_len)
    texts = [" ".join(topic_text(rng, k) for _ in range(rng.randint(1, 3))) for k in list(TOPIC) * 8]
    return encode_sequences(tok, texts, [0] * len(texts), max_len=max_len, stride=max_len - 2, truncate=False)


@pytest.mark.parametrize("task", ["sequence-classification", "regression", "token-classification"])
def test_packed_scores_equal_the_padded_ones(tiny_bert, tmp_path, task):
    model, tok, meta = load_task_model(_run(tiny_bert, tmp_path, task))
    enc = _encoded(tok, task, meta["max_len"])
    assert len(set(enc.lengths.tolist())) > 2  # windows of several lengths
    ref = score(model, enc, task=task, batch_size=7, device="cpu", pad_id=tok.pad_id, with_loss=False)
    fast = for_inference(model, "fp32")
    for batch_size, batch_tokens in [(256, 4096), (3, None), (256, 20)]:
        got = score_packed(fast, enc, task=task, batch_size=batch_size, batch_tokens=batch_tokens)
        source, other = (ref.tags, got.tags) if task == "token-classification" else (ref.probs, got.probs)
        assert sorted(other) == sorted(source) == list(range(len(enc.ids)))
        for r in source:
            if task == "token-classification":
                np.testing.assert_array_equal(other[r], source[r])
            else:
                np.testing.assert_allclose(other[r], source[r], atol=1e-5, rtol=0)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_predict_in_reduced_precision_is_close_to_fp32(tiny_bert, tmp_path, precision):
    run = _run(tiny_bert, tmp_path, "sequence-classification")
    texts = tmp_path / "new.txt"
    rng = random.Random(3)
    texts.write_text("".join(topic_text(rng, k) + "\n" for k in list(TOPIC) * 10))
    assert main(["predict", str(run), str(texts), "--out", str(tmp_path / "fp32.jsonl"), "--no-progress"]) == 0
    why = precision_unsupported(precision, torch.device("cpu"))
    args = ["predict", str(run), str(texts), "--out", str(tmp_path / "low.jsonl"), "--no-progress",
            "--device", "cpu", "--precision", precision, "--batch-tokens", "64"]
    if why is not None:
        assert main(args) == 2
        pytest.skip(f"{precision} not offered here: {why}")
    assert main(args) == 0
    a, b = ([json.loads(line) for line in (tmp_path / f).read_text().splitlines()] for f in ("fp32.jsonl", "low.jsonl"))
    assert [r["id"] for r in a] == [r["id"] for r in b]
    pa = np.array([list(r["probabilities"].values()) for r in a])  # (E,L)
    pb = np.array([list(r["probabilities"].values()) for r in b])
    assert np.abs(pa - pb).max() < 0.02, np.abs(pa - pb).max()
    assert np.abs(pa - pb).max() > 1e-7  # it really ran in reduced precision


@pytest.mark.parametrize("task", ["sequence-classification", "regression"])
def test_predictor_in_memory_gives_what_predict_writes(tiny_bert, tmp_path, task):
    from qkv.finetune.predict import Predictor

    run = _run(tiny_bert, tmp_path, task)
    rng = random.Random(4)
    texts = [topic_text(rng, k) for k in list(TOPIC) * 3]
    (tmp_path / "new.txt").write_text("".join(t + "\n" for t in texts))
    assert main(["predict", str(run), str(tmp_path / "new.txt"), "--out", str(tmp_path / "p.jsonl"),
                 "--no-progress", "--device", "cpu"]) == 0
    written = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert main(["predict", str(run), str(tmp_path / "new.txt"), "--out", str(tmp_path / "p.jsonl"),
                 "--no-progress"]) == 2  # an earlier result is kept unless --force
    assert [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()] == written
    got = Predictor(run, device="cpu").predict(texts)
    assert got.windows == len(texts) and got.long == 0 and len(got.records) == len(texts)
    for rec, line in zip(got.records, written):
        assert {"id": line["id"], **rec}.keys() == line.keys()
        if task == "regression":
            assert rec["value"] == line["value"]
        else:  # the file rounds to 6 decimals; in memory they are exact and sum to 1
            assert rec["label"] == line["label"]
            assert {k: round(p, 6) for k, p in rec["probabilities"].items()} == line["probabilities"]
            assert abs(sum(rec["probabilities"].values()) - 1) < 1e-6
    assert Predictor(run, device="cpu").predict([]).records == []


def test_predict_never_writes_over_its_input(tmp_path, tiny_bert, capsys):
    """``qkv predict MODEL in.txt --out in.txt`` is refused before anything runs; the input is intact
    (also through a symbolic link to it)."""
    from qkv.cli import main

    src = tmp_path / "in.txt"
    src.write_text("good movie\nbad film\n")
    link = tmp_path / "link.txt"
    link.symlink_to(src)
    for out in (src, link):
        assert main(["predict", str(tiny_bert), str(src), "--out", str(out)]) == 2
        assert "is the input" in capsys.readouterr().err  # refused for that, before the model is read
        assert src.read_text() == "good movie\nbad film\n"


def test_the_encoding_errors_option_the_message_names_exists(tmp_path, tiny_bert, capsys):
    """A Latin-1 input names --encoding-errors replace, and predict and finetune both take it."""
    import qkv
    from qkv.cli import build_parser, main
    from qkv.models.heads import TaskConfig
    from qkv.models.task_builders import attach_task_head

    model, tok = qkv.load(tiny_bert)
    qkv.save(attach_task_head(model, TaskConfig("sequence-classification", ("a", "b"))), tmp_path / "clf",
             tokenizer=tok)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    assert main(["predict", str(tmp_path / "clf"), str(bad), "--out", str(tmp_path / "p.jsonl")]) == 2
    assert "--encoding-errors replace" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "clf"), str(bad), "--out", str(tmp_path / "p.jsonl"),
                 "--encoding-errors", "replace"]) == 0
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 1  # read, the bad byte replaced
    for argv in (["predict", "m", "i", "--out", "o", "--encoding-errors", "replace"],
                 ["finetune", "m", "--task", "regression", "--train", "t", "--out", "o", "--encoding-errors",
                  "replace"]):
        assert build_parser(argv[0]).parse_args(argv).encoding_errors == "replace"
