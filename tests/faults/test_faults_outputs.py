"""Outputs never overwrite inputs or earlier results: for every subcommand, either cases where its output
would be one of its inputs or an earlier result (refused with one line, the file unchanged) or the reason it
writes nothing a user could lose. The walker fails when a subcommand has no row. To add a command, add its
row to :func:`_cases` (or to :data:`NOTHING_AT_STAKE`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from faults_support import WRITES_NOTHING

from qkv.cli import build_parser, main

#: Subcommands that write nothing (their results go to standard output or a network socket) or that
#: continue their own folder by design — and why nothing of the user's is at stake.
NOTHING_AT_STAKE = {
    **WRITES_NOTHING,
    "ablate": "--out is its harness folder: a rerun continues it (finished runs kept), by design",
}


def _digest(path: Path) -> str:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def _cases(tmp: Path, model: Path) -> dict[str, tuple[list[str], Path, str]]:
    """``name: (argv, protected path, fragment of the message)``."""
    user = tmp / "user"
    user.mkdir(exist_ok=True)
    (user / "thesis.tex").write_text("mine")
    docs = tmp / "docs.jsonl"
    docs.write_text('{"text": "one document"}\n{"text": "another one"}\n')
    old = tmp / "old.npy"
    old.write_bytes(b"an earlier result")
    old_json = tmp / "old.json"
    old_json.write_text("{}")
    onnx = tmp / "old.onnx"
    onnx.write_bytes(b"an earlier export")
    vit, pic = _image_inputs(tmp)
    train = tmp / "train.jsonl"
    train.write_text("".join(f'{{"text": "document {i}", "label": "{"ab"[i % 2]}"}}\n' for i in range(8)))
    return {
        "embed onto its input": (["embed", str(model), str(docs), "--out", str(docs)], docs, "is the input"),
        "embed onto an earlier result": (["embed", str(model), str(docs), "--out", str(old)], old, "--force"),
        "predict onto its input": (["predict", str(model), str(docs), "--out", str(docs)], docs, "is the input"),
        "index into user files": (["index", str(model), str(docs), "--out", str(user)], user, "not an empty folder"),
        "convert onto user files": (["convert", str(model), str(user)], user, "not part of a model"),
        "export onto an earlier export": (["export", str(model), "--onnx", str(onnx)], onnx, "--force"),
        "pretrain into user files": (["pretrain", "--corpus", str(docs), "--out", str(user)], user, "empty"),
        "finetune into user files": (["finetune", str(model), "--task", "sequence-classification", "--train",
                                      str(train), "--out", str(user)], user, "not an empty folder"),
        "lab seq2seq into user files": (["lab", "seq2seq", "--task", "reverse", "--out", str(user)], user, "empty"),
        "lab image-positions into user files": (["lab", "image-positions", "--out", str(user)], user, "did not write"),
        "predict pictures onto an earlier result": (["predict", str(vit), str(pic), "--out", str(old_json)], old_json,
                                                    "--force"),
        "predict pictures onto a picture": (["predict", str(vit), str(pic), "--out", str(pic)], pic, "is the input"),
        "inspect a picture into a model folder": (["inspect", str(vit), str(pic), "--out", str(vit)], vit,
                                                  "did not write"),
        "analyze an image model into user files": (["analyze", str(vit), "--data", "dataset:digits:test", "--out",
                                                    str(user)], user, "did not write"),
        "train-embeddings into user files": (["train-embeddings", str(model), "--corpus", str(docs), "--out",
                                              str(user)], user, "empty"),
        "eval-embeddings onto an earlier result": (["eval-embeddings", str(model), "--dataset", "reuters8", "--out",
                                                    str(old_json)], old_json, "--force"),
        "demo into user files": (["demo", "--out", str(user)], user, "left untouched"),
        "analyze onto its corpus": (["analyze", str(model), "--corpus", str(user), "--out", str(user)], user, ""),
        "inspect into a model folder": (["inspect", str(model), "a text", "--out", str(model)], model, "did not write"),
        "findings into user files": (["findings", "kobayashi", str(model), "--data", str(docs), "--out", str(user)],
                                     user, "did not write"),
        "translate onto its input": (["translate", str(model), "--input", str(docs), "--output", str(docs)], docs,
                                     "is the input"),
        "translate onto an earlier result": (["translate", str(model), "--input", str(docs), "--output", str(old)],
                                             old, "--force"),
    }


def _image_inputs(tmp: Path) -> tuple[Path, Path]:
    """A tiny image classifier folder (8×8 grey pictures) and a picture of its size."""
    import numpy as np
    import torch
    from PIL import Image

    from qkv.checkpoints.io import save
    from qkv.models.heads import TaskConfig
    from qkv.models.vision_builders import build_image_classifier
    from qkv.vision.config import model_config

    vit, pic = tmp / "vit", tmp / "pic.png"
    if not vit.exists():
        torch.manual_seed(0)
        save(build_image_classifier(model_config("vit-digits", {"image": {"patch": 2}}, n_layers=1),
                                    TaskConfig("sequence-classification", ("a", "b"))), vit)
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(pic)
    return vit, pic


def test_every_subcommand_has_an_output_case_or_writes_nothing(tmp_path, model_folder):
    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    covered = {name.split()[0] for name in _cases(tmp_path, model_folder)} | set(NOTHING_AT_STAKE)
    assert commands <= covered, sorted(commands - covered)


def test_no_output_overwrites_an_input_or_an_earlier_result(tmp_path, model_folder, capsys):
    failures = []
    for name, (argv, protected, fragment) in _cases(tmp_path, model_folder).items():
        before = _digest(protected)
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        lines = [x for x in err.splitlines() if ": error:" in x]
        if code != 2 or len(lines) != 1 or fragment not in lines[0] or _digest(protected) != before:
            failures.append(f"{name}: exit {code}, changed {_digest(protected) != before}, stderr {err[-300:]!r}")
    assert not failures, "\n".join(failures)
