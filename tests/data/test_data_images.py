"""The image readers on files the test writes: PNG and JPEG, grey and colour (and 16-bit grey, a
palette, an alpha channel), a folder with one sub-folder per class, IDX files; every bad input —
an unreadable or empty image, a class folder without images, a stray file, mixed sizes — one line.
Named image datasets: their specs and the line naming the install command."""

import gzip
import struct

import numpy as np
import pytest
from PIL import Image

from qkv.data.errors import CorpusFormatError, DatasetNotInstalledError, ImageDataError, UnknownDatasetError
from qkv.data import image_datasets
from qkv.data.canvases import CaptionSet
from qkv.data.image_datasets import open_images
from qkv.data.images import (ImageSet, PixelSet, load_picture, pixel_values, read_idx, read_image,
                             read_image_folder)


def _grey(seed, size=(6, 5)):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def _colour(seed, size=(6, 5)):
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def test_png_grey_and_colour_are_read_exactly(tmp_path):
    Image.fromarray(_grey(0)).save(tmp_path / "g.png")
    Image.fromarray(_colour(1)).save(tmp_path / "c.png")
    np.testing.assert_array_equal(read_image(tmp_path / "g.png"), _grey(0)[None])
    np.testing.assert_array_equal(read_image(tmp_path / "c.png"), _colour(1).transpose(2, 0, 1))
    grey_of_colour = np.asarray(Image.fromarray(_colour(1)).convert("L"))
    np.testing.assert_array_equal(read_image(tmp_path / "c.png", channels=1), grey_of_colour[None])
    np.testing.assert_array_equal(read_image(tmp_path / "g.png", channels=3), np.repeat(_grey(0)[None], 3, 0))


def test_jpeg_16_bit_palette_and_alpha(tmp_path):
    Image.fromarray(np.full((4, 4), 200, dtype=np.uint8)).save(tmp_path / "j.jpg", quality=100)
    assert read_image(tmp_path / "j.jpg").shape == (1, 4, 4)
    assert abs(int(read_image(tmp_path / "j.jpg").mean()) - 200) <= 1
    Image.fromarray((np.arange(12).reshape(3, 4) * 5000).astype(np.uint16)).save(tmp_path / "w.png")
    np.testing.assert_array_equal(read_image(tmp_path / "w.png")[0, 0],
                                  np.round(np.arange(4) * 5000 / 65535 * 255).astype(np.uint8))
    Image.fromarray(_colour(2)).convert("P").save(tmp_path / "p.png")
    assert read_image(tmp_path / "p.png").shape == (3, 6, 5)
    rgba = np.concatenate([_colour(3), np.full((6, 5, 1), 128, np.uint8)], axis=-1)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    np.testing.assert_array_equal(read_image(tmp_path / "a.png"), _colour(3).transpose(2, 0, 1))


def _class_folder(root, layout):
    for label, images in layout.items():
        (root / label).mkdir(parents=True)
        for i, array in enumerate(images):
            Image.fromarray(array).save(root / label / f"{i}.png")
    return root


def test_a_class_folder_is_read_in_name_order(tmp_path):
    root = _class_folder(tmp_path / "pics", {"cat": [_grey(0), _grey(1)], "dog": [_colour(2)], "ant": [_grey(3)]})
    (root / "cat" / ".DS_Store").write_bytes(b"x")  # hidden: skipped
    s = read_image_folder(root)
    assert s.classes == ("ant", "cat", "dog") and s.labels.tolist() == [0, 1, 1, 2]
    assert s.pixels.shape == (4, 3, 6, 5) and s.pixels.dtype == np.uint8  # one colour image: all colour
    np.testing.assert_array_equal(s.pixels[1], np.repeat(_grey(0)[None], 3, 0))
    assert read_image_folder(root, channels=1).pixels.shape == (4, 1, 6, 5)
    assert open_images(str(root)).classes == s.classes


@pytest.mark.parametrize("make,msg", [
    (lambda r: (r / "b" / "x.png").write_bytes(b""), "x.png: the file is empty"),
    (lambda r: (r / "b" / "x.png").write_bytes(b"not a png"), "x.png: not a readable PNG or JPEG image"),
    (lambda r: (r / "b" / "notes.txt").write_text("hi"), "notes.txt: not a PNG or JPEG image in class folder 'b'"),
    (lambda r: (r / "c").mkdir(), "class folder 'c' has no images"),
    (lambda r: Image.fromarray(_grey(5, (7, 7))).save(r / "b" / "y.png"), "images of different sizes: .* is 5×6 but .*y.png is 7×7"),
])
def test_bad_folders_are_one_line(tmp_path, make, msg):
    root = _class_folder(tmp_path / "pics", {"a": [_grey(0)], "b": [_grey(1)]})
    make(root)
    with pytest.raises(ImageDataError, match=msg) as e:
        read_image_folder(root)
    assert "\n" not in str(e.value)


def test_a_folder_that_is_not_a_class_folder(tmp_path):
    with pytest.raises(ImageDataError, match="found 0 class sub-folder"):
        read_image_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        read_image_folder(tmp_path / "nope")


def test_pixel_values_and_a_picture_for_a_model(tmp_path):
    torch_x = pixel_values(np.array([0, 255, 51], dtype=np.uint8))
    np.testing.assert_allclose(torch_x.numpy(), [-1.0, 1.0, 51 / 127.5 - 1], atol=1e-7)
    assert pixel_values(np.array([0.25], dtype=np.float32)).item() == 0.25  # signals as they are
    Image.fromarray(_colour(0, (10, 12))).save(tmp_path / "big.png")
    x, note = load_picture(tmp_path / "big.png", (6, 5), 1)
    assert x.shape == (1, 1, 6, 5) and note == "resized 12×10 → 5×6 (the model's size)"
    assert load_picture(tmp_path / "big.png", (10, 12), 3)[1] is None


def _idx(path, array, type_code=0x08):
    header = bytes([0, 0, type_code, array.ndim]) + b"".join(struct.pack(">i", n) for n in array.shape)
    data = header + array.astype(">u1" if type_code == 0x08 else ">i4").tobytes()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)


def test_idx_files(tmp_path):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _idx(tmp_path / "a-idx3-ubyte.gz", a)
    np.testing.assert_array_equal(read_idx(tmp_path / "a-idx3-ubyte.gz"), a)
    _idx(tmp_path / "b-idx1", np.array([1, -2, 3]), 0x0C)
    assert read_idx(tmp_path / "b-idx1").tolist() == [1, -2, 3]
    (tmp_path / "bad").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x09abc")
    with pytest.raises(CorpusFormatError, match="need 17 bytes, the file has 11"):
        read_idx(tmp_path / "bad")
    (tmp_path / "png").write_bytes(b"\x89PNG....")
    with pytest.raises(CorpusFormatError, match="not an IDX file"):
        read_idx(tmp_path / "png")


def test_named_image_datasets(monkeypatch, tmp_path):
    digits = open_images("dataset:digits:test")
    assert digits.pixels.shape == (360, 1, 8, 8) and sorted(set(digits.labels.tolist())) == list(range(10))
    assert len(open_images("dataset:digits")) == 1437
    with pytest.raises(UnknownDatasetError, match="image datasets: fashion-mnist, digits, mnist1d"):
        open_images("dataset:cifar10")
    with pytest.raises(UnknownDatasetError, match="no split 'validation'"):
        open_images("dataset:digits:validation")
    monkeypatch.setattr(image_datasets, "FASHION_MNIST_DIR", tmp_path)
    with pytest.raises(DatasetNotInstalledError, match="apt-get install dataset-fashion-mnist"):
        open_images("dataset:fashion-mnist")


def test_fashion_mnist_when_installed():
    if not image_datasets.FASHION_MNIST_DIR.is_dir():
        pytest.skip("Debian's dataset-fashion-mnist is not installed (make data)")
    test = open_images("dataset:fashion-mnist:test")
    assert test.pixels.shape == (10000, 1, 28, 28) and test.classes[9] == "Ankle boot"
    assert np.bincount(test.labels).tolist() == [1000] * 10


def test_mnist1d_is_generated_offline_and_leaves_numpys_state():
    pytest.importorskip("mnist1d")
    state = np.random.get_state()[1].copy()
    train = open_images("dataset:mnist1d")
    assert train.pixels.shape == (4000, 1, 40) and train.pixels.dtype == np.float32
    np.testing.assert_array_equal(np.random.get_state()[1], state)
    assert len(open_images("dataset:mnist1d:test")) == 1000


def test_labelled_images_and_captioned_canvases_share_one_pixel_set():
    pixels = np.zeros((5, 3, 6, 7), np.uint8)  # N=5, K=3, R=6, W=7: distinct sizes so that a swapped axis fails
    images = ImageSet(pixels, np.arange(5), ("a", "b", "c", "d", "e"), "t")
    canvases = CaptionSet(pixels, tuple("x" * (i + 1) for i in range(5)), np.zeros((5, 2, 3), np.int64), ("a",),
                          (2, 2), 3, frozenset(), "c")
    for s in (images, canvases):
        assert isinstance(s, PixelSet) and (len(s), s.channels, s.size) == (5, 3, (6, 7))
    signals = ImageSet(np.zeros((4, 1, 40), np.float32), np.zeros(4, np.int64), ("a",), "s")
    assert (len(signals), signals.channels, signals.size) == (4, 1, (40,))
