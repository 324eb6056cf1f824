"""Named offline image datasets, ``dataset:NAME[:SPLIT]``, and a user's image folder — what the
image commands' ``--data`` names (:func:`open_images`).

===============  ==========================================  ================  =========  ==========
name             source (installed data files)               splits            images     licence
===============  ==========================================  ================  =========  ==========
fashion-mnist    Debian ``dataset-fashion-mnist`` (IDX gz)   train 60,000 /    28×28 grey MIT
                                                             test 10,000
digits           scikit-learn's ``load_digits`` (ships with  train 1,437 /     8×8 grey   BSD-3
                 scikit-learn)                               test 360
mnist1d          PyPI ``mnist1d``, generated offline by its  train 4,000 /     1×40       Apache-2.0
                 ``make_dataset`` (default arguments, seed   test 1,000        signals
                 42: the published data set)
===============  ==========================================  ================  =========  ==========

``digits`` has no split of its own: a seeded fifth (360 images, NumPy ``default_rng(0)``) is held out. ``mnist1d``'s
package can download its pickle; qkv never asks it to — it builds the set from the templates, which
gives the published arrays, and leaves NumPy's global random state as it found it.

Any other ``--data`` is a folder with one sub-folder per class (:func:`qkv.data.images.read_image_folder`).
A missing package is one line naming the command that installs it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qkv.data.errors import DatasetNotInstalledError, UnknownDatasetError
from qkv.data.images import ImageSet, read_idx, read_image_folder

__all__ = ["IMAGE_DATASETS", "ImageDatasetInfo", "open_images", "FASHION_MNIST_DIR", "FASHION_CLASSES"]

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")


@dataclass(frozen=True)
class ImageDatasetInfo:
    """A named image dataset."""

    name: str
    splits: tuple[str, ...]
    description: str
    licence: str
    install: str  # the command that installs its data


IMAGE_DATASETS: dict[str, ImageDatasetInfo] = {
    "fashion-mnist": ImageDatasetInfo(
        "fashion-mnist", ("train", "test"), "Fashion-MNIST (Zalando): 70,000 28×28 grey pictures of 10 kinds of "
        "clothing, 60,000 train / 10,000 test", "MIT", "make data  (or: sudo apt-get install dataset-fashion-mnist)"),
    "digits": ImageDatasetInfo(
        "digits", ("train", "test"), "scikit-learn's handwritten digits: 1,797 8×8 grey images of 0–9 (UCI optical "
        "digits), a seeded fifth held out: 1,437 train / 360 test", "BSD-3-Clause (scikit-learn)",
        "pip install scikit-learn"),
    "mnist1d": ImageDatasetInfo(
        "mnist1d", ("train", "test"), "MNIST-1D (Greydanus 2020): 5,000 one-dimensional signals of length 40 made "
        "from 10 digit templates, 4,000 train / 1,000 test", "Apache-2.0", "pip install mnist1d"),
}


def _fashion(split: str) -> ImageSet:
    prefix = "train" if split == "train" else "t10k"
    images, labels = FASHION_MNIST_DIR / f"{prefix}-images-idx3-ubyte.gz", FASHION_MNIST_DIR / f"{prefix}-labels-idx1-ubyte.gz"
    if not images.is_file() or not labels.is_file():
        raise DatasetNotInstalledError(f"dataset 'fashion-mnist' reads {images} from the Debian package "
                                       f"dataset-fashion-mnist, which is not installed; install it:  "
                                       f"{IMAGE_DATASETS['fashion-mnist'].install}")
    pixels = read_idx(images)[:, None]  # (N,28,28) -> (N,1,28,28)
    return ImageSet(pixels, read_idx(labels).astype(np.int64), FASHION_CLASSES, f"dataset:fashion-mnist:{split}")


def _digits(split: str) -> ImageSet:
    try:
        from sklearn.datasets import load_digits  # scikit-learn's import takes 1.0–1.4 s: only for this dataset
    except ImportError:
        raise DatasetNotInstalledError("dataset 'digits' ships with scikit-learn, which is not installed:  "
                                       "pip install scikit-learn") from None
    data = load_digits()
    test = np.zeros(len(data.target), dtype=bool)
    test[np.random.default_rng(0).permutation(len(test))[:360]] = True  # a seeded fifth held out
    keep = test if split == "test" else ~test
    pixels = np.round(data.images[keep] * (255 / 16)).astype(np.uint8)[:, None]  # 0…16 -> 0…255, (N,1,8,8)
    return ImageSet(pixels, data.target[keep].astype(np.int64), tuple(str(d) for d in range(10)),
                    f"dataset:digits:{split}")


def _mnist1d(split: str) -> ImageSet:
    try:  # an optional package (pulls matplotlib and requests on import): only when this dataset is read
        data_module = importlib.import_module("mnist1d.data")
    except ImportError:
        raise DatasetNotInstalledError("dataset 'mnist1d' is generated by the PyPI package mnist1d, which is not "
                                       "installed:  pip install mnist1d") from None
    state = np.random.get_state()
    try:
        data = data_module.make_dataset(data_module.get_dataset_args())  # offline: seed 42, the published set
    finally:
        np.random.set_state(state)
    x, y = (data["x"], data["y"]) if split == "train" else (data["x_test"], data["y_test"])
    return ImageSet(np.asarray(x, dtype=np.float32)[:, None], np.asarray(y, dtype=np.int64),
                    tuple(str(d) for d in range(10)), f"dataset:mnist1d:{split}")


_READERS = {"fashion-mnist": _fashion, "digits": _digits, "mnist1d": _mnist1d}


def open_images(spec: str) -> ImageSet:
    """``dataset:NAME[:SPLIT]`` (split default ``train``) or a class folder → :class:`ImageSet`.

    Raises:
        UnknownDatasetError: an unknown name or split (the message lists the allowed ones).
        DatasetNotInstalledError: its package is missing (the message names the install command).
        ImageDataError, CorpusNotFoundError: a folder qkv cannot read (see :func:`read_image_folder`).
    """
    if not isinstance(spec, str) or not spec:
        raise UnknownDatasetError(f"image data is a folder or dataset:NAME[:SPLIT], got {spec!r}")
    if not spec.startswith("dataset:"):
        return read_image_folder(spec)
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[1].lower() not in IMAGE_DATASETS:
        raise UnknownDatasetError(f"unknown image dataset in {spec!r}; image datasets: {', '.join(IMAGE_DATASETS)} "
                                  "(written dataset:NAME[:SPLIT]), or a folder with one sub-folder per class")
    info = IMAGE_DATASETS[parts[1].lower()]
    split = parts[2].lower() if len(parts) == 3 and parts[2] else "train"
    if split not in info.splits:
        raise UnknownDatasetError(f"image dataset {info.name!r} has no split {split!r}; its splits: "
                                  f"{', '.join(info.splits)}")
    return _READERS[info.name](split)
