"""Images in: the readers of image files (PNG, JPEG through Pillow), of a folder with one sub-folder
per class, and of IDX files (the MNIST family's format), and the one conversion of pixels into a
model's input.

Legend: N images, K channels, R × W pixels (L samples of a 1-D signal).

An :class:`ImageSet` holds ``pixels`` ``(N, K, R, W)`` (or ``(N, K, L)``) — ``uint8`` for pictures,
``float32`` for signals — with integer ``labels`` and the class names. :func:`pixel_values` turns
pixels into what every qkv image model reads: ``uint8`` pictures scaled to ``[-1, 1]``
(``x / 127.5 − 1``, what Hugging Face's ViT image processor gives with its default mean and std of
0.5), float signals as they are.

Files are read as grey (Pillow modes ``1``, ``L``, ``I;16`` …: one channel) or colour (``RGB``: three
channels); a palette or an alpha channel is converted to RGB (the alpha channel is not used). In a
folder, grey images are read as colour when some are colour. Every problem is one line naming the
file and the way out: an unreadable or empty file, a file that is not an image, a class folder
without images, images of different sizes (nothing is resized behind your back).
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from qkv.data.errors import CorpusFormatError, CorpusNotFoundError, ImageDataError

__all__ = ["PixelSet", "ImageSet", "IMAGE_SUFFIXES", "read_image", "read_image_folder", "read_idx", "pixel_values",
           "load_picture"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_GREY_MODES = ("1", "L", "I", "I;16", "I;16B", "I;16L", "F")


@dataclass(frozen=True)
class PixelSet:
    """What every set of images holds (labelled images, captioned canvases): the pixels, and from
    them the count, size and channels.

    Attributes:
        pixels: ``(N,K,R,W)`` or ``(N,K,L)``; ``uint8`` pictures or ``float32`` signals.
    """

    pixels: np.ndarray

    def __len__(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def size(self) -> tuple[int, ...]:
        """``(R, W)`` or ``(L,)``."""
        return tuple(self.pixels.shape[2:])

    @property
    def channels(self) -> int:
        """K."""
        return int(self.pixels.shape[1])


@dataclass(frozen=True)
class ImageSet(PixelSet):
    """Images with labels (a :class:`PixelSet`).

    Attributes:
        pixels: ``(N,K,R,W)`` or ``(N,K,L)``; ``uint8`` pictures or ``float32`` signals.
        labels: ``(N,)`` int64 class ids.
        classes: the class names in id order.
        name: where they came from (``dataset:fashion-mnist:test``, a folder).
    """

    labels: np.ndarray
    classes: tuple[str, ...]
    name: str


def pixel_values(pixels: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``uint8`` pixels → float32 in ``[-1, 1]``; float signals as float32 (see the module docstring)."""
    if isinstance(pixels, np.ndarray) and not pixels.flags.writeable:
        pixels = pixels.copy()
    x = torch.as_tensor(pixels)
    if x.dtype == torch.uint8:
        return x.float().div_(127.5).sub_(1.0)
    return x.float()


def _open(path: Path) -> Image.Image:
    try:
        if path.stat().st_size == 0:
            raise ImageDataError(f"{path}: the file is empty; remove it or replace it with the image")
        img = Image.open(path)
        img.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        if isinstance(e, ImageDataError):
            raise
        if isinstance(e, FileNotFoundError):
            raise CorpusNotFoundError(f"{path}: no such image file") from None
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ImageDataError(f"{path}: not a readable PNG or JPEG image ({why}); remove it or save it again as "
                             "PNG") from None
    if img.width == 0 or img.height == 0:
        raise ImageDataError(f"{path}: the image has no pixels ({img.width}×{img.height})")
    return img


def _to_array(img: Image.Image, colour: bool) -> np.ndarray:
    """``(K,R,W)`` uint8: grey (K=1) or RGB (K=3)."""
    if colour:
        return np.asarray(img.convert("RGB"), dtype=np.uint8).transpose(2, 0, 1)  # (R,W,3) -> (3,R,W)
    if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # 16-bit or float grey: scaled to 8 bits
        a = np.asarray(img, dtype=np.float64)
        hi = 65535.0 if img.mode.startswith("I") else max(1.0, float(a.max()))
        return np.clip(np.round(a / hi * 255), 0, 255).astype(np.uint8)[None]
    return np.asarray(img.convert("L"), dtype=np.uint8)[None]  # (R,W) -> (1,R,W)


def _is_grey(img: Image.Image) -> bool:
    return img.mode in _GREY_MODES or (img.mode == "P" and _palette_grey(img)) or img.mode == "LA"


def _palette_grey(img: Image.Image) -> bool:
    rgb = np.asarray(img.convert("RGB"))
    return bool((rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all())


def read_image(path: str | os.PathLike, *, channels: int | None = None) -> np.ndarray:
    """One PNG or JPEG file → ``(K,R,W)`` uint8; ``channels`` 1 or 3 converts (colour to grey: ITU-R 601
    luma, Pillow's ``L``), ``None`` keeps the file's own.

    Raises:
        ImageDataError: an empty, unreadable or non-image file (one line naming it).
    """
    img = _open(Path(path))
    if channels not in (None, 1, 3):
        raise ValueError(f"channels must be 1 (grey), 3 (colour) or None (the file's own), got {channels!r}")
    colour = (not _is_grey(img)) if channels is None else channels == 3
    return _to_array(img, colour)


def load_picture(path: str | os.PathLike, size: tuple[int, int], channels: int) -> tuple[torch.Tensor, str | None]:
    """A picture as a model of ``size`` and ``channels`` reads it: ``((1,K,R,W) pixel values, note)``;
    a picture of another size is resized (bilinear) and ``note`` says so, else ``note`` is ``None``."""
    img = _open(Path(path))
    note = None
    if (img.height, img.width) != tuple(size):
        note = f"resized {img.width}×{img.height} → {size[1]}×{size[0]} (the model's size)"
        img = img.convert("RGB" if channels == 3 else "L").resize((size[1], size[0]), Image.BILINEAR)
    return pixel_values(_to_array(img, channels == 3))[None], note


def _class_files(folder: Path) -> list[tuple[str, list[Path]]]:
    if not folder.exists():
        raise CorpusNotFoundError(f"{folder}: no such folder; give a folder with one sub-folder of images per class")
    if not folder.is_dir():
        raise ImageDataError(f"{folder}: not a folder; give a folder with one sub-folder of images per class")
    classes = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise ImageDataError(f"{folder}: found {len(classes)} class sub-folder(s); an image folder has one "
                             "sub-folder per class (at least 2), each holding that class's PNG/JPEG images")
    out = []
    for c in classes:
        files = []
        for p in sorted(c.iterdir()):
            if p.name.startswith("."):
                continue
            if p.is_dir() or p.suffix.lower() not in IMAGE_SUFFIXES:
                raise ImageDataError(f"{p}: not a PNG or JPEG image in class folder {c.name!r}; a class folder "
                                     "holds only images (move it out)")
            files.append(p)
        if not files:
            raise ImageDataError(f"{c}: class folder {c.name!r} has no images; add PNG/JPEG files or remove it")
        out.append((c.name, files))
    return out


def read_image_folder(folder: str | os.PathLike, *, channels: int | None = None) -> ImageSet:
    """A folder with one sub-folder per class (its name the class name, classes in name order), each
    holding PNG/JPEG images of one size, read in name order.

    Args:
        folder: the folder. channels: 1 or 3 converts every image; ``None``: colour when any
            image is colour, else grey.

    Raises:
        ImageDataError: fewer than two class folders, an empty class folder, a non-image file,
            an unreadable or empty image, images of different sizes (one line naming the files).
    """
    folder = Path(folder)
    classes = _class_files(folder)
    images = [(label, p, _open(p)) for label, (_, files) in enumerate(classes) for p in files]
    colour = any(not _is_grey(img) for _, _, img in images) if channels is None else channels == 3
    first = images[0]
    for _, p, img in images:
        if img.size != first[2].size:
            raise ImageDataError(f"images of different sizes: {first[1]} is {first[2].width}×{first[2].height} but "
                                 f"{p} is {img.width}×{img.height}; resize them to one size first")
    pixels = np.stack([_to_array(img, colour) for _, _, img in images])  # (N,K,R,W)
    labels = np.array([label for label, _, _ in images], dtype=np.int64)
    return ImageSet(pixels, labels, tuple(name for name, _ in classes), str(folder))


_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX file (``.gz`` or plain; LeCun's MNIST format: a magic ``0 0 type ndim``, big-endian
    int32 sizes, the data) → an array of its shape.

    Raises:
        CorpusFormatError: a file that is not IDX or is cut short.
    """
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as e:
        raise CorpusFormatError(f"{path}: not readable ({e})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise CorpusFormatError(f"{path}: not an IDX file (magic {data[:4].hex() or 'missing'})")
    ndim = data[3]
    dims = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_TYPES[data[2]])
    start, n = 4 + 4 * ndim, int(np.prod(dims)) if dims else 0
    if len(data) != start + n * dtype.itemsize:
        raise CorpusFormatError(f"{path}: IDX sizes {dims} need {start + n * dtype.itemsize} bytes, the file has "
                                f"{len(data)}; the file is damaged (reinstall its package)")
    return np.frombuffer(data, dtype=dtype, offset=start, count=n).reshape(dims).astype(dtype.newbyteorder("="))
