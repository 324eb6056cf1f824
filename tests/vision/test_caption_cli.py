"""``qkv caption MODEL PICTURE…`` prints the library's captions, one per picture; an unreadable, empty or
wrongly sized picture, or a model that is not a captioner → one line, exit 2. ``qkv pretrain --objective
caption`` on the installed canvases (skipped without them, naming make data)."""

import json

import numpy as np
import pytest
from caption_support import tiny_canvases
from PIL import Image

from qkv.checkpoints.io import save
from qkv.cli import main
from qkv.data import image_datasets
from qkv.models.vision_builders import build_vision_encoder
from qkv.vision.config import model_config


def _pngs(tmp_path, n=3):
    _, held = tiny_canvases()
    paths = []
    for i in range(n):
        path = tmp_path / f"canvas{i}.png"
        Image.fromarray(held.pixels[i, 0]).save(path)
        paths.append(str(path))
    return paths


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qkv caption: error: ") and "Traceback" not in err, err
    return lines[0]


def test_caption_prints_one_caption_per_picture(tiny_run, tmp_path, capsys):
    paths = _pngs(tmp_path)
    assert main(["caption", str(tiny_run.out), *paths]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [e["caption"] for e in tiny_run.report["examples"][:3]]
    assert main(["caption", str(tiny_run.out), paths[0], "--with-names"]) == 0
    assert capsys.readouterr().out == f"{paths[0]}\t{printed[0]}\n"


def test_bad_pictures_are_one_line(tiny_run, tmp_path, capsys):
    good = _pngs(tmp_path, 1)[0]
    empty, junk, big = tmp_path / "empty.png", tmp_path / "junk.png", tmp_path / "big.png"
    empty.write_bytes(b"")
    junk.write_text("not a picture")
    Image.fromarray(np.zeros((20, 24), np.uint8)).save(big)
    for path, fragment in ((empty, "the file is empty"), (junk, "not a readable PNG or JPEG"),
                           (big, "the picture is 24×20 pixels but the model reads 16×16"),
                           (tmp_path / "nowhere.png", "no such image file")):
        assert main(["caption", str(tiny_run.out), good, str(path)]) == 2
        assert fragment in _error(capsys)
    assert main(["caption", str(tiny_run.out), good, "--max-new-tokens", "99"]) == 2
    assert "--max-new-tokens" in _error(capsys)


def test_a_model_that_is_not_a_captioner_is_one_line(tmp_path, capsys):
    folder = save(build_vision_encoder(model_config("vit-digits")), tmp_path / "vit")
    assert main(["caption", str(folder), str(tmp_path / "x.png")]) == 2
    assert "not a caption model: this is a model of type VisionEncoder" in _error(capsys)


@pytest.mark.skipif(not image_datasets.FASHION_MNIST_DIR.is_dir(),
                    reason="Debian's dataset-fashion-mnist is not installed (make data)")
def test_pretrain_objective_caption_on_the_installed_canvases(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["pretrain", "--objective", "caption", "--preset", "caption-tiny", "--steps", "3", "--batch-size", "8",
            "--eval-sample", "20", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "2000 canvases with held-out combinations" in printed and "qkv caption" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["eval_canvases"] == 2000 and report["held_out"] == "dataset:fashion-captions:test"
    assert (out / "report.md").is_file()
    assert main(["pretrain", "--resume", "--out", str(out), "--no-progress"]) == 0  # the run's kind: caption
    assert "2000 canvases" in capsys.readouterr().out
