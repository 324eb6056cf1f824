"""No command writes through a symbolic link out of its output (the "insecure" class): for every subcommand
that writes, its output is prepared holding a link to a file elsewhere — the output file itself is the link
(with ``--force``), or the output folder holds a link named as a file the command writes — and the file
elsewhere must be unchanged afterwards, with nothing new beside it, whatever the command answers (it may
refuse in one line, or replace the link by its own file). The walker fails when a writing subcommand has no
case (the subcommands that write nothing: :data:`test_faults_outputs.WRITES_NOTHING`, with its reasons).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from test_faults_outputs import WRITES_NOTHING, _image_inputs

from qkv.cli import build_parser, main

#: subcommands whose case runs half a minute or more (a grid of runs): marked slow
SLOW = {"ablate"}


def _cases(tmp: Path, model: Path) -> dict[str, tuple[list[str], str]]:
    """``name: (argv with OUT for the output path, how OUT is prepared)``: ``file`` — OUT is a link to the
    victim file; ``folder:NAME`` — OUT is a folder holding a link NAME to the victim file."""
    docs = tmp / "docs.jsonl"
    docs.write_text('{"text": "one document"}\n{"text": "another one"}\n')
    train = tmp / "train.jsonl"
    train.write_text("".join(f'{{"text": "document {i}", "label": "{"ab"[i % 2]}"}}\n' for i in range(8)))
    vit, pic = _image_inputs(tmp)
    m, d = str(model), str(docs)
    return {
        "embed": (["embed", m, d, "--out", "OUT", "--force", "--no-progress"], "file"),
        "predict": (["predict", str(vit), str(pic), "--out", "OUT", "--force"], "file"),
        "export": (["export", m, "--onnx", "OUT", "--force", "--no-check"], "file"),
        "eval-embeddings": (["eval-embeddings", m, "--dataset", str(train), "--out", "OUT", "--force", "--no-progress"],
                            "file"),
        "translate": (["translate", m, "--input", d, "--output", "OUT", "--force"], "file"),
        "index": (["index", m, d, "--out", "OUT"], "folder:vectors.npy"),
        "convert": (["convert", m, "OUT"], "folder:model.safetensors"),
        "pretrain": (["pretrain", "--corpus", d, "--out", "OUT", "--preset", "tiny", "--max-len", "16", "--steps", "1",
                                  "--no-progress"],
                     "folder:run.json"),
        "finetune": (["finetune", m, "--task", "sequence-classification", "--train", str(train), "--out", "OUT",
                      "--steps", "1", "--no-progress"], "folder:run.json"),
        "train-embeddings": (["train-embeddings", m, "--corpus", d, "--out", "OUT", "--steps", "1", "--no-progress"],
                             "folder:run.json"),
        "lab": (["lab", "seq2seq", "--task", "reverse", "--out", "OUT", "--steps", "2", "--no-progress"],
                "folder:model.safetensors"),
        "inspect": (["inspect", m, "a text", "--out", "OUT", "--methods", "raw", "--no-ablation", "--no-importance"],
                    "folder:viewer.html"),
        "analyze": (["analyze", m, "--corpus", d, "--out", "OUT", "--quiet", "--ablation-contexts", "0"],
                    "folder:report.md"),
        "findings": (["findings", "kobayashi", m, "--data", d, "--out", "OUT", "--texts", "2"], "folder:kobayashi.json"),
        "demo": (["demo", "--out", "OUT", "--minutes", "0.05"], "folder:report.md"),
        "ablate": (["ablate", "--grid", "heads", "--corpus", d, "--out", "OUT", "--steps", "1"], "folder:results.md"),
    }


def _listing(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_every_writing_subcommand_has_a_symlink_case(tmp_path, model_folder):
    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    writing = commands - {c for c, why in WRITES_NOTHING.items() if c != "ablate"}  # ablate writes its folder
    cases = _cases(tmp_path, model_folder)
    assert writing <= set(cases), f"no symlink case for: {sorted(writing - set(cases))}"


@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c
                                     for c in ("embed", "predict", "export", "eval-embeddings", "translate", "index",
                                               "convert", "pretrain", "finetune", "train-embeddings", "lab",
                                               "inspect", "analyze", "findings", "demo", "ablate")])
def test_no_command_writes_through_a_link_out_of_its_output(command, tmp_path, model_folder, capsys):
    argv, how = _cases(tmp_path, model_folder)[command]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "victim"
    victim.write_bytes(b"a file of the user's, outside the output")
    before = _listing(elsewhere)
    if how == "file":
        out = tmp_path / {"export": "x.onnx", "predict": "p.jsonl", "eval-embeddings": "e.json",
                          "translate": "t.txt"}.get(command, "e.npy")
        out.symlink_to(victim)
    else:
        out = tmp_path / "out"
        out.mkdir()
        (out / how.split(":")[1]).symlink_to(victim)
    try:
        code = main([str(out) if a == "OUT" else a for a in argv])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert _listing(elsewhere) == before, f"{command} wrote through the link (exit {code}): {err[-300:]!r}"
    assert code in (0, 2) and "Traceback" not in err, f"{command}: exit {code}, {err[-300:]!r}"
    if code == 2:
        assert len([x for x in err.splitlines() if ": error:" in x]) == 1, err
    if command == "translate":  # the suite's model does not translate: check its writer, atomic_write_text
        from qkv._fs import atomic_write_text

        atomic_write_text(out, "a translation\n")
        assert _listing(elsewhere) == before and not out.is_symlink() and out.read_text() == "a translation\n"
