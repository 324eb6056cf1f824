"""Captioned canvases: the grammar written out by hand, canvases built from pictures the test makes (in memory,
and as Fashion-MNIST IDX files for dataset:fashion-captions; each
class a picture of one grey level, so every cell can be read back), the held-out links only in test,
determinism, one-line errors; the installed Fashion-MNIST set when it is there."""

import gzip

import numpy as np
import pytest

from qkv.data import canvases, image_datasets
from qkv.data.canvases import CanvasSpec, build_canvases, open_captions
from qkv.data.caption_grammar import (
    FASHION_NAMES,
    all_links,
    caption_of,
    caption_tokenizer,
    held_out_links,
    links_of,
    names_of_caption,
    relation,
)
from qkv.data.errors import DatasetNotInstalledError, ImageDataError, UnknownDatasetError
from qkv.data.images import ImageSet

CELL = 6


def _pictures(per_class=3, cell=CELL, name="fixture"):
    """Class c: pictures of grey level 20·(c+1) (all pixels), so a cell says which class is in it."""
    labels = np.repeat(np.arange(10), per_class)
    pixels = np.broadcast_to((20 * (labels + 1)).astype(np.uint8)[:, None, None, None], (len(labels), 1, cell, cell))
    return ImageSet(np.ascontiguousarray(pixels), labels, FASHION_NAMES, name)


SPEC = CanvasSpec(grid=(2, 3), cell=CELL, items=(2, 4), held_out=0.1, train=120, test=40, seed=3)


def test_relations_and_captions_by_hand():
    assert relation((0, 0), (0, 2)) == "left of"
    assert relation((0, 1), (1, 1)) == "above"
    assert relation((0, 0), (1, 2)) == "above and left of"
    assert relation((0, 2), (1, 0)) == "above and right of"
    with pytest.raises(ValueError, match="not after cell"):
        relation((1, 0), (0, 1))
    # items given out of order and with a padding row: the caption reads them row by row
    items = np.array([[3, 1, 1], [7, 0, 0], [-1, -1, -1], [8, 1, 0]])
    assert caption_of(items) == "a sneaker above a bag left of a dress"
    assert links_of(items) == [(7, "above", 8), (8, "left of", 3)]
    assert names_of_caption("a sneaker above a bag left of a dress") == "a sneaker a bag a dress"


def test_held_out_links_are_a_seeded_share():
    links = all_links(10)
    assert len(links) == 400 and len(set(links)) == 400
    held = held_out_links(10, 0.1, seed=0)
    assert len(held) == 40 and held <= set(links)
    assert held == held_out_links(10, 0.1, seed=0) and held != held_out_links(10, 0.1, seed=1)


def test_tokenizer_has_the_specials_first_and_every_word():
    tok = caption_tokenizer()
    assert [tok.token_to_id(t) for t in ("[PAD]", "[BOS]", "[EOS]", "[UNK]")] == [0, 1, 2, 3]
    text = "a boot above and right of a top left of a trouser"
    ids = tok.encode(text).ids
    assert 3 not in ids and tok.decode(ids) == text
    assert tok.get_vocab_size() == 4 + 1 + 5 + 10  # specials, "a", left/of/above/and/right, the names


def test_canvases_put_each_item_in_its_cell():
    data = build_canvases(_pictures(), SPEC, "train")
    assert data.pixels.shape == (120, 1, 12, 18) and data.pixels.dtype == np.uint8
    for i in range(len(data)):
        real = data.items[i][data.items[i][:, 0] >= 0]
        assert 2 <= len(real) <= 4
        assert [tuple(r) for r in real[:, 1:]] == sorted(tuple(r) for r in real[:, 1:])  # reading order
        want = np.zeros((12, 18), np.uint8)
        for c, r, q in real:
            want[r * CELL:(r + 1) * CELL, q * CELL:(q + 1) * CELL] = 20 * (c + 1)
        assert np.array_equal(data.pixels[i, 0], want)
        assert data.captions[i] == caption_of(data.items[i])


def test_held_out_links_only_in_test_and_in_every_test_caption():
    train, test = build_canvases(_pictures(), SPEC, "train"), build_canvases(_pictures(), SPEC, "test")
    held = train.held_out
    assert held == test.held_out and len(held) == 40
    assert not any(link in held for items in train.items for link in links_of(items))
    assert all(any(link in held for link in links_of(items)) for items in test.items)


def test_canvases_are_deterministic():
    a, b = build_canvases(_pictures(), SPEC, "test"), build_canvases(_pictures(), SPEC, "test")
    assert np.array_equal(a.pixels, b.pixels) and a.captions == b.captions
    other = build_canvases(_pictures(), CanvasSpec(**{**SPEC.__dict__, "seed": 4}), "test")
    assert other.captions != a.captions


def test_bad_pictures_and_specs_are_one_line():
    with pytest.raises(ImageDataError, match="need grey 6×6 item pictures"):
        build_canvases(_pictures(cell=8), SPEC, "train")
    few = _pictures()
    few = ImageSet(few.pixels[few.labels != 4], few.labels[few.labels != 4], few.classes, "few")
    with pytest.raises(ImageDataError, match="no picture of class"):
        build_canvases(few, SPEC, "train")
    with pytest.raises(UnknownDatasetError, match="splits train and test"):
        build_canvases(_pictures(), SPEC, "validation")
    with pytest.raises(ValueError, match="items="):
        CanvasSpec(grid=(1, 2), items=(2, 3))
    with pytest.raises(ValueError, match="grid="):
        CanvasSpec(grid=(1, 1))


def test_open_captions_names_and_errors(monkeypatch, tmp_path):
    with pytest.raises(UnknownDatasetError, match="dataset:fashion-captions"):
        open_captions("dataset:mnist-captions")
    with pytest.raises(UnknownDatasetError, match="no split 'validation'"):
        open_captions("dataset:fashion-captions:validation")
    monkeypatch.setattr(image_datasets, "FASHION_MNIST_DIR", tmp_path)
    with pytest.raises(DatasetNotInstalledError, match="make data"):
        open_captions("dataset:fashion-captions")


def _idx(path, array):
    """An IDX file as Fashion-MNIST's (gzip; magic ``0 0 0x08 ndim``, big-endian sizes, the bytes)."""
    head = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(head + array.astype(np.uint8).tobytes())


def test_open_captions_reads_fashion_mnist_files_the_test_writes(monkeypatch, tmp_path):
    pics = _pictures(per_class=2, cell=28)
    _idx(tmp_path / "t10k-images-idx3-ubyte.gz", pics.pixels[:, 0])
    _idx(tmp_path / "t10k-labels-idx1-ubyte.gz", pics.labels)
    monkeypatch.setattr(image_datasets, "FASHION_MNIST_DIR", tmp_path)
    monkeypatch.setattr(canvases, "FASHION_CAPTIONS", CanvasSpec(train=30, test=12))
    data = open_captions("dataset:fashion-captions:test")
    assert len(data) == 12 and data.size == (56, 56) and data.name == "dataset:fashion-captions:test"
    for i in range(len(data)):  # every item's cell holds a picture of its class: grey level 20·(class+1)
        for c, r, q in data.items[i][data.items[i][:, 0] >= 0]:
            assert (data.pixels[i, 0, r * 28:(r + 1) * 28, q * 28:(q + 1) * 28] == 20 * (c + 1)).all()
    with pytest.raises(DatasetNotInstalledError, match="make data"):  # no train files written
        open_captions("dataset:fashion-captions:train")


def test_fashion_captions_when_installed():
    if not image_datasets.FASHION_MNIST_DIR.is_dir():
        pytest.skip("Debian's dataset-fashion-mnist is not installed (make data)")
    test = open_captions("dataset:fashion-captions:test")
    assert len(test) == 2000 and test.size == (56, 56) and test.channels == 1
    assert all(any(link in test.held_out for link in links_of(items)) for items in test.items)
    assert test.captions[:2] == open_captions("dataset:fashion-captions:test").captions[:2]
