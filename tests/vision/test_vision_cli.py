"""``qkv pretrain --objective image`` through the command line: a short digits run prints its
held-out accuracy and run folder; image options with a text objective (and the reverse) → one line."""

import json

from qkv.cli import main


def test_pretrain_objective_image_runs_and_reports(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["pretrain", "--objective", "image", "--preset", "vit-digits", "--steps", "4", "--batch-size", "16",
                 "--augment", "shift", "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "held-out accuracy" in printed and "on 360 images (dataset:digits:test" in printed
    run = json.loads((out / "run.json").read_text())
    assert run["train_config"]["augment"] == ["shift"] and run["train_config"]["batch_size"] == 16


def test_text_and_image_options_do_not_mix(tmp_path, capsys):
    assert main(["pretrain", "--objective", "image", "--corpus", "dataset:pydoc", "--out", str(tmp_path / "a")]) == 2
    assert "--corpus: text option(s), not used by --objective image" in capsys.readouterr().err
    assert main(["pretrain", "--corpus", "dataset:pydoc", "--pooling", "cls", "--out", str(tmp_path / "b")]) == 2
    assert "--pooling: image option(s), used by --objective image or caption only" in capsys.readouterr().err
