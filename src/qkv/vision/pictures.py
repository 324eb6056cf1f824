"""Pictures into an image model, for the commands that take them (``qkv predict``, ``qkv inspect``):
which folders hold an image model, which arguments are pictures, and reading pictures exactly as the
model reads them.

Legend: N pictures, K channels, R × W pixels.

* :func:`is_image_model_folder` — a qkv folder of an image kind, or a Hugging Face ViT folder, told
  from its config file alone (nothing is loaded), so that a command can choose its path before it
  loads anything.
* :func:`is_picture_spec` — an existing PNG/JPEG file, or a folder holding some (at any depth).
* :func:`load_image_model` — :func:`qkv.load` of an image model; a text model is one line saying so.
* :func:`picture_files` — the files behind the arguments (a folder: its images at any depth, in
  path order).
* :func:`read_pictures` — the files as the model's pixel values: a picture of another size is
  refused (nothing is resized behind your back); grey and colour are converted to the model's
  channels, and a note says so.

Every problem is one line naming the file and the way out.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from qkv.checkpoints.bundled import model_folder
from qkv.checkpoints.io import declared_kind, load
from qkv.config_image import ImageConfig
from qkv.data.errors import CorpusNotFoundError, ImageDataError
from qkv.data.images import IMAGE_SUFFIXES, pixel_values, read_image
from qkv.errors import QkvError
from qkv.models.kinds import IMAGE_KINDS

__all__ = ["is_image_model_folder", "is_picture_spec", "load_image_model", "picture_files", "read_pictures",
           "describe_size"]


def is_image_model_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds an image model: ``qkv.json`` of an image kind, or a Hugging Face
    ``config.json`` of ``model_type`` ``vit`` (read from the config file only)."""
    try:
        folder = model_folder(path)
    except QkvError:
        return False
    return declared_kind(folder) in (*IMAGE_KINDS, "vit")


def _is_picture_file(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES


def is_picture_spec(spec: str | os.PathLike) -> bool:
    """Whether ``spec`` names an existing picture file (``.png``/``.jpg``/``.jpeg``) or a folder
    holding at least one."""
    path = Path(spec)
    try:
        if path.is_dir():
            return any(_is_picture_file(p) for p in path.rglob("*") if p.is_file())
        return path.is_file() and _is_picture_file(path)
    except OSError:  # not a path at all (a text longer than a file name may be, …)
        return False


def load_image_model(path, *, command: str, what: str = "an image model"):
    """``(model, tokenizer)`` of the image model in ``path`` (or what :func:`qkv.load` returned).

    Raises:
        QkvError: the folder holds a text model (one line naming the command's text use).
        CheckpointError: not a loadable folder.
    """
    model, tokenizer = path if isinstance(path, tuple) else load(path)
    if getattr(getattr(model, "config", None), "image", None) is None:
        raise QkvError(f"{path if not isinstance(path, tuple) else 'the model'} is a text model "
                       f"({type(model).__name__}); it reads text, not pictures — give {command} {what} "
                       "(qkv pretrain --objective image), or give this model text")
    return model, tokenizer


def picture_files(specs: list[str] | tuple[str, ...]) -> list[Path]:
    """The picture files ``specs`` name: a file itself, a folder's PNG/JPEG files at any depth in path
    order (hidden ones left out).

    Raises:
        CorpusNotFoundError: a path that does not exist.
        ImageDataError: a file that is not PNG/JPEG, or a folder without pictures.
    """
    files: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if not path.exists():
            raise CorpusNotFoundError(f"{path}: no such picture or folder; give PNG/JPEG files or a folder of them")
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_picture_file(p)
                           and not any(part.startswith(".") for part in p.relative_to(path).parts))
            if not found:
                raise ImageDataError(f"{path}: the folder holds no PNG/JPEG pictures; add some or give the files")
            files.extend(found)
        elif not _is_picture_file(path):
            raise ImageDataError(f"{path}: not a PNG or JPEG picture (an image model reads pictures); give .png, "
                                 ".jpg or .jpeg files or a folder of them")
        else:
            files.append(path)
    return files


def describe_size(image: ImageConfig) -> str:
    """``"1×28×28"``: channels × size."""
    return "×".join(map(str, (image.channels, *image.size)))


def read_pictures(files: list[Path], image: ImageConfig) -> tuple[torch.Tensor, list[str]]:
    """``files`` as the model reads them: ``((N,K,R,W) pixel values, notes)``.

    Raises:
        ImageDataError: an empty or unreadable file; a picture whose size is not the model's
            ``image.size``; a model that reads 1-D signals.
    """
    if len(image.size) != 2:
        raise ImageDataError(f"the model reads 1-D signals of length {image.size[0]}, not pictures; give it "
                             "signals through the library (qkv.data.images.pixel_values)")
    notes, converted = [], []
    arrays = []
    for path in files:
        own = read_image(path)  # (K,R,W) uint8, the file's own channels
        if tuple(own.shape[1:]) != tuple(image.size):
            raise ImageDataError(f"{path}: the picture is {own.shape[2]}×{own.shape[1]} pixels but the model reads "
                                 f"{image.size[1]}×{image.size[0]}; resize it to {image.size[1]}×{image.size[0]} "
                                 "first (qkv does not resize behind your back)")
        if own.shape[0] != image.channels:
            converted.append(path.name)
            own = read_image(path, channels=image.channels)
        arrays.append(own)
    if converted:
        kind = "grey" if image.channels == 1 else "colour"
        notes.append(f"{len(converted)} picture(s) converted to {kind}, as the model reads them: "
                     + ", ".join(converted[:3]) + (" …" if len(converted) > 3 else ""))
    return pixel_values(np.stack(arrays)), notes  # (N,K,R,W)
