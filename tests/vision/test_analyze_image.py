"""``qkv analyze`` of an image model: each head's mean attention distance per layer on held-out images (the
run's own, or --data), as a table, JSON and the Figure-7-style plot; the numbers are the library's; bad
input → one line."""

import json

import numpy as np
import pytest
from PIL import Image

from qkv.checkpoints.io import load, save
from qkv.cli import main
from qkv.config import ModelConfig
from qkv.config_image import ImageConfig
from qkv.data.images import pixel_values, read_image
from qkv.models.builders import build_masked_lm
from qkv.vision.analyze_image import uniform_distance
from qkv.vision.attention_maps import image_attentions, mean_attention_distance


def test_distances_on_a_folder_are_the_librarys(tmp_path, classifier_folder, pictures, capsys):
    out = tmp_path / "a"
    assert main(["analyze", str(classifier_folder), "--data", str(tmp_path / "pics"), "--out", str(out),
                 "--batch-size", "2"]) == 0
    printed = capsys.readouterr().out
    assert "3 images" in printed and "| L1 |" in printed
    got = json.loads((out / "attention_distance.json").read_text())
    model = load(classifier_folder).model
    x = pixel_values(np.stack([read_image(p) for p in sorted(pictures)]))
    want = mean_attention_distance(image_attentions(model, x), model.config.image)
    np.testing.assert_allclose(got["distances"], want, atol=1e-5)
    assert got["uniform"] == pytest.approx(uniform_distance(model.config.image), abs=1e-6)
    with Image.open(out / "attention_distance.png") as img:
        img.verify()
    assert "| Layer | H0 | H1 | mean |" in (out / "attention_distance.md").read_text()


def test_uniform_distance_of_a_two_by_two_grid():
    # patch centres 2 pixels apart: distances 0 (×4), 2 (×8), 2√2 (×4) over 16 pairs
    assert uniform_distance(ImageConfig(size=(4, 4), patch=2)) == pytest.approx((8 * 2 + 4 * 8 ** 0.5) / 16)


def test_a_run_folder_uses_its_own_held_out_images(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", "--objective", "image", "--preset", "vit-digits", "--steps", "2", "--batch-size", "16",
                 "--out", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(run), "--out", str(tmp_path / "a"), "--images", "40"]) == 0
    printed = capsys.readouterr().out
    assert "40 images (the run's held-out images (dataset:digits:test))" in printed


def test_wrong_inputs_are_one_line(tmp_path, classifier_folder, capsys):
    text_model = tmp_path / "text"
    save(build_masked_lm(ModelConfig.preset("tiny", vocab_size=50, max_len=16)), text_model)
    cases = [([str(classifier_folder)], "is not an image run folder"),
             ([str(classifier_folder), "--corpus", "dataset:pydoc"], "give its images with --data"),
             ([str(classifier_folder), "--data", "dataset:mnist1d:test"], "the model reads 1×8×8"),
             ([str(text_model), "--data", "dataset:digits"], "--data is for image models"),
             ([str(text_model)], "--corpus is required for a text model"),
             ([str(classifier_folder), "--data", "dataset:digits:test", "--images", "0"], "--images 0")]
    for argv, fragment in cases:
        code = main(["analyze", *argv, "--out", str(tmp_path / "a")])
        err = capsys.readouterr().err
        if "mnist1d" in argv[-1] and "pip install" in err:
            continue  # the package is not installed: its one line instead
        assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, (argv, err)
