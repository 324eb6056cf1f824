"""Image classification on the training engine: a test-sized run learns scikit-learn's digits,
saves a model that loads and scores the same, resumes as finished; bad settings and data → one line."""

import json

import numpy as np
import pytest
import torch

from qkv.checkpoints.io import load
from qkv.data.errors import ImageDataError
from qkv.data.images import ImageSet, pixel_values
from qkv.vision.classify import ImageClassificationObjective, split_images, train_images
from qkv.vision.config import ImageTrainConfig, model_config


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("img") / "digits"
    cfg = ImageTrainConfig(out=str(out), preset="vit-digits", steps=100, eval_every=50, progress=False)
    return cfg, train_images(cfg)


def test_a_test_sized_run_learns_digits(digits_run):
    _, result = digits_run
    r = result.report
    assert result.status == "complete" and result.steps_done == 100
    assert r["eval_images"] == 360 and r["majority_baseline"] < 0.15
    assert r["accuracy"] > 0.6, r  # 10 classes: chance 0.1
    saved = json.loads((result.out / "report.json").read_text())
    assert saved["accuracy"] == r["accuracy"]
    assert (result.out / "metrics.jsonl").exists()


def test_metrics_log_images_per_second(digits_run):
    _, result = digits_run
    rows = [json.loads(line) for line in (result.out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert steps and all(r["images_per_s"] > 0 and "tokens_per_s" not in r for r in steps)


def test_the_saved_model_loads_and_predicts_the_same(digits_run):
    cfg, result = digits_run
    from qkv.data.image_datasets import open_images

    held = open_images("dataset:digits:test")
    model = load(result.out).model
    with torch.no_grad():
        pred = model(pixel_values(held.pixels)).logits.argmax(-1).numpy()
    assert (pred == held.labels).mean() == pytest.approx(result.report["accuracy"])


def test_resume_of_a_finished_run_returns_its_report(digits_run):
    cfg, result = digits_run
    again = train_images(cfg, resume=True)
    assert again.status == "complete" and again.report["accuracy"] == result.report["accuracy"]


def test_batches_are_a_pure_function_of_their_index():
    rng = np.random.default_rng(0)
    images = ImageSet(rng.integers(0, 256, (23, 1, 8, 8), dtype=np.uint8), np.arange(23) % 3, ("a", "b", "c"), "t")
    make = lambda: ImageClassificationObjective(images, images, batch_size=5, seed=3, augment=("flip", "shift", "erase"),  # noqa: E731
                                                label_smoothing=0.0, eval_sample=7, eval_batch_size=4)
    a, b = make(), make()
    for i in (6, 0, 9):  # out of order, across epochs (4 batches per epoch)
        torch.testing.assert_close(a.batch(i).pixel_values, b.batch(i).pixel_values, rtol=0, atol=0)
        assert torch.equal(a.batch(i).labels, b.batch(i).labels)
    epoch0 = torch.cat([a.batch(i).labels for i in range(4)])
    assert len(epoch0) == 20  # the last partial batch is dropped, nothing repeated within an epoch


def test_split_is_stratified_and_refuses_a_class_too_small():
    labels = np.array([0] * 10 + [1] * 5)
    images = ImageSet(np.zeros((15, 1, 2, 2), dtype=np.uint8), labels, ("a", "b"), "t")
    rest, held = split_images(images, 0.2, seed=0)
    assert list(np.bincount(held.labels)) == [2, 1] and len(rest) == 12
    tiny = ImageSet(np.zeros((3, 1, 2, 2), dtype=np.uint8), np.array([0, 0, 1]), ("a", "b"), "t")
    with pytest.raises(ImageDataError, match="class 'b' has 1 image"):
        split_images(tiny, 0.2, seed=0)


def test_a_folder_of_the_wrong_size_for_the_patch_is_one_line(tmp_path):
    from PIL import Image

    for c in ("cat", "dog"):
        (tmp_path / "pics" / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((10, 10), 40 * i, dtype=np.uint8)).save(tmp_path / "pics" / c / f"{i}.png")
    cfg = ImageTrainConfig(out=str(tmp_path / "run"), preset="vit-digits", data=str(tmp_path / "pics"), steps=2,
                           batch_size=2, progress=False, eval_fraction=0.3)
    with pytest.raises(ValueError, match="10") as e:
        train_images(cfg)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("bad, match", [
    (dict(objective="caption"), "objective"),
    (dict(preset="vit-huge"), "vit-huge"),
    (dict(augment="flip,rotate"), "rotate"),
    (dict(pooling="max"), "pooling"),
    (dict(time_budget=-1.0), "time_budget"),
])
def test_bad_settings_are_one_line(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match) as e:
        ImageTrainConfig(out=str(tmp_path), **bad)
    assert "\n" not in str(e.value)


def test_recipes_build_and_accept_overrides():
    cfg = model_config("vit-fashion", {"image": {"patch": 7}, "n_layers": 2})
    assert cfg.image.grid == (4, 4) and cfg.n_layers == 2
    assert model_config("vit-mnist1d").image.grid == (19,)
    with pytest.raises(ValueError, match="allowed"):
        model_config("nope")


def test_a_run_with_a_convolutional_stem_learns_digits_and_loads_as_it_was_saved(tmp_path):
    from qkv.data.image_datasets import open_images
    from qkv.inference import for_inference

    out = tmp_path / "stem"
    cfg = ImageTrainConfig(out=str(out), preset="vit-digits", steps=100, progress=False,
                           model={"image": {"stem": [8]}})
    result = train_images(cfg)
    assert result.status == "complete" and result.report["accuracy"] > 0.6, result.report
    model = load(out).model
    assert model.config.image.stem == (8,)
    assert tuple(model.state_dict()["encoder.embeddings.patches.stem.layers.0.weight"].shape) == (8, 1, 3, 3)
    held = open_images("dataset:digits:test")
    x = pixel_values(held.pixels)
    with torch.no_grad():
        logits = model(x).logits
        fast = for_inference(model, "bf16")(x).logits  # the stem stays float32; the maps run in bf16
    assert (logits.argmax(-1).numpy() == held.labels).mean() == pytest.approx(result.report["accuracy"])
    assert (fast.argmax(-1) == logits.argmax(-1)).float().mean() > 0.97
