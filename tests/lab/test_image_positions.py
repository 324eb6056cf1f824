"""``qkv lab image-positions``: the patch shuffles move whole patches (checked against patches cut by hand),
the same way for every image or each its own way; a tiny run over two seeds writes its runs and verdict;
bad options → one line."""

import json

import numpy as np
import pytest

from qkv.cli import main
from qkv.config_image import ImageConfig
from qkv.data.images import ImageSet
from qkv.errors import QkvError
from qkv.lab.image_positions import shuffle_patches


def _patches(x: np.ndarray, p: int) -> list[np.ndarray]:
    """The p×p patches of an (R,W) array in reading order, cut by hand."""
    return [x[r:r + p, c:c + p] for r in range(0, x.shape[0], p) for c in range(0, x.shape[1], p)]


def _set(n=3, size=(6, 9)):
    x = np.arange(n * size[0] * size[1], dtype=np.int64).reshape(n, 1, *size) % 251
    return ImageSet(x.astype(np.uint8), np.arange(n) % 2, ("a", "b"), "t")


def test_a_fixed_shuffle_moves_the_same_patches_in_every_image():
    image = ImageConfig(size=(6, 9), patch=3)  # a 2×3 grid
    images = _set()
    out = shuffle_patches(images, image, np.random.default_rng(0), per_image=False)
    perm = np.random.default_rng(0).permutation(6)
    for i in range(3):
        want = [_patches(images.pixels[i, 0], 3)[j] for j in perm]
        got = _patches(out.pixels[i, 0], 3)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert sorted(out.pixels.ravel()) == sorted(images.pixels.ravel())


def test_a_per_image_shuffle_moves_each_image_its_own_way():
    image = ImageConfig(size=(8, 8), patch=2)  # 16 patches
    images = _set(4, (8, 8))
    out = shuffle_patches(images, image, np.random.default_rng(1), per_image=True)
    orders = []
    for i in range(4):
        mine = _patches(images.pixels[i, 0], 2)
        orders.append(tuple(next(j for j, m in enumerate(mine) if np.array_equal(m, g))
                            for g in _patches(out.pixels[i, 0], 2)))
    assert len(set(orders)) > 1 and all(sorted(o) == list(range(16)) for o in orders)


def test_signals_and_overlapping_patches():
    image = ImageConfig(size=(12,), patch=4)
    x = np.arange(24, dtype=np.float32).reshape(2, 1, 12)
    out = shuffle_patches(ImageSet(x, np.zeros(2, int), ("a",), "s"), image, np.random.default_rng(0), per_image=False)
    perm = np.random.default_rng(0).permutation(3)
    np.testing.assert_array_equal(out.pixels[0, 0], np.concatenate([x[0, 0, 4 * j:4 * j + 4] for j in perm]))
    with pytest.raises(QkvError, match="overlap; run with patches side by side"):
        shuffle_patches(_set(), ImageConfig(size=(7, 9), patch=3, stride=2), np.random.default_rng(0), per_image=False)


def test_a_tiny_run_over_two_seeds_writes_the_verdict(tmp_path, capsys):
    out = tmp_path / "lab"
    argv = ["lab", "image-positions", "--out", str(out), "--seeds", "2", "--steps", "2", "--batch-size", "16",
            "--variants", "learned,none,shuffled-per-image"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| learned |" in printed and "learned vs none (do positions help?)" in printed
    verdict = json.loads((out / "verdict.json").read_text())
    assert set(verdict["accuracy"]) == {"learned", "none", "shuffled-per-image"}
    assert [c["b"] for c in verdict["comparisons"]] == ["none", "shuffled-per-image"]
    assert (out / "none-s1" / "report.json").is_file() and (out / "verdict.md").is_file()
    stored = json.loads((out / "none-s1" / "run.json").read_text())
    assert stored["model_config"]["image"]["position"] == "none" and stored["train_config"]["augment"] == []
    learned = json.loads((out / "learned-s0" / "run.json").read_text())
    assert learned["model_config"]["image"]["position"] == "learned"
    assert main(argv) == 0  # finished runs are reused
    assert capsys.readouterr().out.count("(finished earlier)") == 6


def test_the_learned_variant_learns_positions_whatever_the_recipes_scheme(tmp_path, capsys):
    from PIL import Image

    from qkv.vision.config import RECIPES

    assert RECIPES["vit-fashion"]["model"]["image"]["position"] != "learned"  # the case this test is about
    assert RECIPES["vit-fashion"]["model"]["image"]["stem"]  # and this
    for c in ("top", "bottom"):
        (tmp_path / "pics" / c).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(np.full((28, 28), 40 * i, dtype=np.uint8)).save(tmp_path / "pics" / c / f"{i}.png")
    out = tmp_path / "lab"
    assert main(["lab", "image-positions", "--out", str(out), "--preset", "vit-fashion", "--data",
                 str(tmp_path / "pics"), "--seeds", "1", "--steps", "1", "--batch-size", "4",
                 "--variants", "learned,none"]) == 0
    for variant, scheme in (("learned", "learned"), ("none", "none")):
        stored = json.loads((out / f"{variant}-s0" / "run.json").read_text())
        assert stored["model_config"]["image"]["position"] == scheme
        assert stored["model_config"]["image"]["stem"] == []  # whatever the recipe's stem


def test_one_seed_shows_no_spread_and_no_test(tmp_path, capsys):
    out = tmp_path / "lab"
    assert main(["lab", "image-positions", "--out", str(out), "--seeds", "1", "--steps", "2", "--batch-size", "16",
                 "--variants", "learned,none"]) == 0
    printed, md = capsys.readouterr().out, (out / "verdict.md").read_text()
    assert "nan" not in printed and "nan" not in md
    assert "no test with one seed" in md and "not decided: 1 seed" in md


@pytest.mark.parametrize("extra, fragment", [
    (["--variants", "learned,sideways"], "allowed learned, none"),
    (["--seeds", "0"], "--seeds 0 must be ≥ 1"),
    (["--model", "{oops"], "is not JSON"),
    (["--model", '{"image": {"stride": 2}}', "--variants", "shuffled-fixed"], "overlap"),
    (["--model", '{"image": {"position": "rope-2d"}}'], "drop image.position from --model"),
    (["--model", '{"image": {"stem": [8]}}'], "drop image.stem from --model"),
])
def test_bad_options_are_one_line(tmp_path, extra, fragment, capsys):
    code = main(["lab", "image-positions", "--out", str(tmp_path / "l"), "--steps", "1", "--batch-size", "16",
                 "--seeds", "1", *extra])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
