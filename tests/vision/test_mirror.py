"""Test-time mirroring: probabilities averaged with the mirror image's, checked against the model run
on pictures mirrored by NumPy; the held-out accuracy with mirroring; ``qkv predict --mirror``; a run
trained with ``flip`` reports both accuracies."""

import json

import numpy as np
import torch

from qkv.checkpoints.io import load
from qkv.cli import main
from qkv.data.images import ImageSet, pixel_values, read_image
from qkv.vision.classify import accuracy, train_images
from qkv.vision.config import ImageTrainConfig
from qkv.vision.mirror import class_probabilities
from vision_support import LABELS, tiny_classifier


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _reference(model, pixels: np.ndarray) -> np.ndarray:
    """The mean of the probabilities of each picture and of its mirror (NumPy does the mirroring)."""
    with torch.no_grad():
        plain = model(pixel_values(pixels)).logits.double().numpy()
        mirrored = model(pixel_values(np.ascontiguousarray(pixels[..., ::-1]))).logits.double().numpy()
    return (_softmax(plain) + _softmax(mirrored)) / 2


def test_mirrored_probabilities_are_the_mean_over_the_picture_and_its_mirror():
    model = tiny_classifier().eval()
    pixels = np.random.default_rng(0).integers(0, 256, (5, 1, 8, 8), dtype=np.uint8)
    with torch.no_grad():
        got = class_probabilities(model, pixel_values(pixels), mirror=True).numpy()
        plain = class_probabilities(model, pixel_values(pixels)).numpy()
    np.testing.assert_allclose(got, _reference(model, pixels), atol=1e-6)
    np.testing.assert_allclose(got.sum(-1), 1, atol=1e-6)
    assert not np.allclose(got, plain, atol=1e-4)  # the mirror changed something: random weights see direction


def test_accuracy_with_mirroring_scores_the_averaged_probabilities():
    model = tiny_classifier()
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (40, 1, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, 3, 40)
    images = ImageSet(pixels, labels, LABELS, "random")
    got = accuracy(model, images, batch_size=7, mirror=True)
    p = _reference(model.eval(), pixels)
    assert got["accuracy"] == float((p.argmax(-1) == labels).mean())
    np.testing.assert_allclose(got["eval_loss"], -np.log(p[np.arange(40), labels]).mean(), rtol=1e-5)
    for c, name in enumerate(LABELS):
        assert got["per_class"][name] == float((p.argmax(-1)[labels == c] == c).mean())


def test_predict_mirror_writes_the_averaged_probabilities(tmp_path, classifier_folder, pictures, capsys):
    out = tmp_path / "m.jsonl"
    assert main(["predict", str(classifier_folder), str(pictures[0]), str(pictures[1]), "--mirror",
                 "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    want = _reference(load(classifier_folder).model.eval(), np.stack([read_image(p) for p in pictures[:2]]))
    for row, p in zip(rows, want):
        np.testing.assert_allclose(list(row["probabilities"].values()), p, atol=1e-6)
        assert row["label"] == LABELS[int(p.argmax())]


def test_mirror_with_a_text_model_is_one_line(tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("a line\n")
    assert main(["predict", str(tmp_path), str(text), "--mirror", "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "--mirror is for image classifiers" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_run_trained_with_flip_reports_the_mirrored_accuracy_too(tmp_path, capsys):
    cfg = ImageTrainConfig(out=str(tmp_path / "run"), preset="vit-digits", steps=30, eval_every=30, augment=("flip",),
                           progress=False)
    report = train_images(cfg).report
    model = load(tmp_path / "run").model
    again = accuracy(model, _held_digits(), mirror=True)
    assert report["accuracy_mirrored"] == again["accuracy"]
    assert set(report["per_class_mirrored"]) == set(report["per_class"])
    assert json.loads((tmp_path / "run" / "run.json").read_text())["report"]["accuracy_mirrored"] == again["accuracy"]
    plain = ImageTrainConfig(out=str(tmp_path / "plain"), preset="vit-digits", steps=5, progress=False)
    assert "accuracy_mirrored" not in train_images(plain).report


def _held_digits() -> ImageSet:
    from qkv.vision.classify import read_image_data
    return read_image_data(ImageTrainConfig(out="unused", preset="vit-digits").resolved())[1]
