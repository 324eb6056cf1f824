"""Failures while working, for every subcommand they apply to (the "vague" class and the "run.json says
running after a failure" class), with the fault hooks of :mod:`qkv._faults`:

* a full disk when a result is published (``QKV_FAULT_RAISE=fs.publish:ENOSPC``) is one line saying
  "No space left on device" and naming the path — for every subcommand that writes;
* a training run that fails at its first step (``QKV_FAULT_RAISE=train.step``) is one line, and leaves
  ``run.json`` ``failed`` with that line as its reason — for every training subcommand and every
  ``pretrain --objective``.

The walkers enumerate the subcommands from the command line's registry and fail for one without a case
(or a reason why the class does not apply). To add a command, add its row to :func:`_writers` /
:func:`_trainers`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from faults_support import WRITES_NOTHING

from qkv.cli import build_parser, main

#: Writers without a case here, and why.
WRITERS_ELSEWHERE = {
    "demo": "pretrain's run folder and the analysis report's writers (rows pretrain, analyze)",
    "ablate": "its workers are qkv pretrain / lab runs (rows pretrain, lab); its table goes through atomic_file",
    "eval-embeddings": "one report through atomic_file (the writer of embed's row) after a dataset-sized "
                       "evaluation, too slow for this walker",
    "translate": "--output through atomic_file (the writer of predict's row); needs an encoder-decoder folder",
    "export": "an ONNX export takes seconds; the full disk there is tests/test_fs.py's",
}

#: Subcommands that train nothing into a run folder.
TRAINS_NOTHING = {
    "demo": "a pretrain run (rows pretrain)", "convert": "converts", "predict": "predicts",
    "analyze": "measures", "inspect": "measures", "findings": "measures", "embed": "embeds",
    "index": "indexes", "search": "searches", "eval-embeddings": "evaluates", "generate": "decodes",
    "translate": "decodes (its training is pretrain --objective translation)", "caption": "decodes "
    "(its training is pretrain --objective caption)", "fill-mask": "predicts", "export": "exports",
    "serve": "serves", "ablate": "a harness of pretrain / lab runs (rows pretrain, lab)",
}

PRETRAIN_OBJECTIVES = ("mlm", "clm", "image", "caption", "translation")


def _commands() -> set[str]:
    parser = build_parser()
    return set(next(a for a in parser._actions if a.dest == "command").choices)


def _docs(tmp: Path) -> tuple[Path, Path]:
    from pydoc_data.topics import topics

    docs, rows = tmp / "docs.txt", tmp / "rows.jsonl"
    texts = [" ".join(topics[k].split()[:40]) for k in sorted(topics)[:40]]
    docs.write_text("".join(t + "\n" for t in texts))
    rows.write_text("".join(json.dumps({"text": t, "label": "ab"[i % 2]}) + "\n" for i, t in enumerate(texts)))
    return docs, rows


def _classifier(tmp: Path, model: Path) -> Path:
    """A tiny random sequence classifier with ``model``'s tokenizer (what ``qkv predict`` reads)."""
    import torch

    from qkv.checkpoints.io import load, save
    from qkv.config import ModelConfig
    from qkv.models.heads import TaskConfig
    from qkv.models.task_builders import build_task_model

    clf = tmp / "clf"
    if not clf.exists():
        torch.manual_seed(0)
        tok = load(model).tokenizer
        cfg = ModelConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_len=32)
        save(build_task_model(cfg, TaskConfig("sequence-classification", ("a", "b"))), clf, tokenizer=tok)
    return clf


def _writers(tmp: Path, model: Path, clf: Path | None = None) -> dict[str, list[str]]:
    """``case: argv`` of a command that writes, each writing into ``tmp / "out"``."""
    docs, rows = _docs(tmp)
    out = str(tmp / "out")
    return {
        "embed": ["embed", str(model), str(docs), "--out", out + ".npy"],
        "index": ["index", str(model), str(docs), "--out", out],
        "predict": ["predict", str(clf or model), str(docs), "--out", out + ".jsonl"],
        "convert": ["convert", str(model), out],
        "pretrain": ["pretrain", "--corpus", str(docs), "--out", out, "--preset", "tiny", "--vocab-size", "120",
                     "--max-len", "16", "--steps", "1", "--no-progress"],
        "finetune": ["finetune", str(model), "--task", "sequence-classification", "--train", str(rows), "--out", out,
                     "--steps", "1", "--no-progress"],
        "train-embeddings": ["train-embeddings", str(model), "--corpus", str(docs), "--out", out, "--steps", "1",
                             "--no-progress"],
        "lab": ["lab", "seq2seq", "--task", "reverse", "--out", out, "--steps", "1", "--preset", "tiny"],
        "analyze": ["analyze", str(model), "--corpus", str(docs), "--out", out, "--quiet", "--max-docs", "4",
                    "--max-len", "32"],
        "inspect": ["inspect", str(model), "a short text", "--out", out],
        "findings": ["findings", "kobayashi", str(model), "--data", str(docs), "--out", out, "--texts", "2",
                     "--max-len", "32"],
    }


def _trainers(tmp: Path, model: Path) -> dict[str, list[str]]:
    """``case: argv`` of a training run into ``tmp / "out"``; a ``pretrain`` case per objective."""
    docs, rows = _docs(tmp)
    out = str(tmp / "out")
    text = ["--corpus", str(docs), "--preset", "tiny", "--vocab-size", "120", "--max-len", "16"]
    return {
        "pretrain mlm": ["pretrain", *text, "--out", out, "--steps", "2", "--no-progress"],
        "pretrain clm": ["pretrain", "--objective", "clm", *text, "--out", out, "--steps", "2", "--no-progress"],
        "pretrain image": ["pretrain", "--objective", "image", "--preset", "vit-digits", "--out", out, "--steps", "2",
                           "--no-progress"],
        "pretrain caption": ["pretrain", "--objective", "caption", "--out", out, "--steps", "2", "--no-progress"],
        "pretrain translation": ["pretrain", "--objective", "translation", "--corpus", "dataset:bible-en-es",
                                 "--out", out, "--steps", "2", "--no-progress"],
        "finetune": ["finetune", str(model), "--task", "sequence-classification", "--train", str(rows), "--out", out,
                     "--steps", "2", "--no-progress"],
        "train-embeddings": ["train-embeddings", str(model), "--corpus", str(docs), "--out", out, "--steps", "2",
                             "--no-progress"],
        "lab seq2seq": ["lab", "seq2seq", "--task", "reverse", "--out", out, "--steps", "2", "--preset", "tiny"],
    }


def _run(argv: list[str], capsys) -> tuple[int, list[str], str]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    return code, [x for x in err.splitlines() if f"qkv {argv[0]}: error:" in x], err


def test_every_subcommand_has_a_disk_full_case_or_a_reason(tmp_path, model_folder):
    covered = set(_writers(tmp_path, model_folder)) | set(WRITES_NOTHING) | set(WRITERS_ELSEWHERE)
    assert _commands() <= covered, sorted(_commands() - covered)


def test_every_training_subcommand_and_objective_has_a_failure_case(tmp_path, model_folder):
    from qkv.training.config import OBJECTIVES
    from qkv.vision.config import OBJECTIVES as IMAGE_OBJECTIVES

    cases = _trainers(tmp_path, model_folder)
    covered = {name.split()[0] for name in cases} | set(TRAINS_NOTHING)
    assert _commands() <= covered, sorted(_commands() - covered)
    assert set(OBJECTIVES) | set(IMAGE_OBJECTIVES) <= set(PRETRAIN_OBJECTIVES)
    assert {f"pretrain {o}" for o in PRETRAIN_OBJECTIVES} <= set(cases)


@pytest.mark.parametrize("case", ["embed", "index", "predict", "convert", "pretrain", "finetune", "train-embeddings",
                                  "lab", "analyze", "inspect", "findings"])
def test_a_full_disk_is_one_line_saying_so_and_naming_the_path(case, tmp_path, model_folder, monkeypatch, capsys):
    clf = _classifier(tmp_path, model_folder) if case == "predict" else None
    argv = _writers(tmp_path, model_folder, clf)[case]
    monkeypatch.setenv("QKV_FAULT_RAISE", "fs.publish:ENOSPC")
    code, lines, err = _run(argv, capsys)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "No space left on device" in lines[0] and str(tmp_path) in lines[0], lines[0]
    assert "unexpected" not in lines[0] and "not exportable" not in lines[0], lines[0]


_NEEDS = {"pretrain caption": "dataset-fashion-mnist (Debian)", "pretrain translation": "sword-text-kjv and "
          "sword-text-sparv (Debian)"}


@pytest.mark.parametrize("case", ["pretrain mlm", "pretrain clm", "pretrain image",
                                  pytest.param("pretrain caption", marks=pytest.mark.slow),  # reads Fashion-MNIST
                                  pytest.param("pretrain translation", marks=pytest.mark.slow),  # aligns the Bibles
                                  "finetune", "train-embeddings", "lab seq2seq"])
def test_a_run_failing_at_its_first_step_leaves_run_json_failed_with_the_reason(case, tmp_path, model_folder,
                                                                                 monkeypatch, capsys):
    argv = _trainers(tmp_path, model_folder)[case]
    monkeypatch.setenv("QKV_FAULT_RAISE", "train.step")
    code, lines, err = _run(argv, capsys)
    out = tmp_path / "out"
    if case in _NEEDS and not (out / "run.json").exists() and "fault injected" not in err:
        pytest.skip(f"{case} needs {_NEEDS[case]}: {err.strip()[-200:]}")
    assert code == 2 and len(lines) == 1 and "fault injected at train.step" in lines[0], err
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "failed", meta.get("status")
    assert "fault injected at train.step" in meta["error"] and "\n" not in meta["error"], meta["error"]
