"""Captioned canvases: pictures of two to four Fashion-MNIST items at cells of a grid, each with the
one caption the grammar (:mod:`qkv.data.caption_grammar`) gives it — ``dataset:fashion-captions``.

Legend: N canvases, R × W pixels (``grid × cell``), k items of a canvas.

A canvas is ``grid[0] × grid[1]`` cells of ``cell × cell`` pixels on black; ``k`` items (2–4 by
default, each count equally likely) go to ``k`` distinct cells drawn at random, each item a random
picture of a random class. Training canvases take their pictures from Fashion-MNIST's train split,
test canvases from its test split — no picture is in both. Combinations are held out too: a seeded
tenth of the caption's ``(item, relation, item)`` links (:func:`~qkv.data.caption_grammar.held_out_links`)
never appear in a training caption, and every test caption holds at least one of them (classes are
drawn again until it does, or until it does not for training). So the test set asks for
relations between items that the model never saw related that way.

Everything is a pure function of :class:`CanvasSpec` (its ``seed``) and the item pictures:
``dataset:fashion-captions:train`` is the same 30,000 canvases on every machine. Pictures of other
sizes than ``cell`` are refused (nothing is resized behind your back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from qkv.data.caption_grammar import FASHION_NAMES, caption_of, held_out_links, links_of
from qkv.data.errors import ImageDataError, UnknownDatasetError
from qkv.data.image_datasets import open_images
from qkv.data.images import ImageSet, PixelSet

__all__ = ["CanvasSpec", "CaptionSet", "build_canvases", "open_captions", "CAPTION_DATASETS", "FASHION_CAPTIONS"]

#: The named caption data sets (``dataset:NAME[:SPLIT]``).
CAPTION_DATASETS = ("fashion-captions",)


@dataclass(frozen=True)
class CanvasSpec:
    """How canvases are made.

    Attributes:
        grid: cells per column and per row ``(rows, cols)``.
        cell: the side of a cell in pixels (the item pictures' size).
        items: the fewest and most items on a canvas.
        held_out: share of the ``(item, relation, item)`` links kept for the test captions.
        train, test: canvases per split.
        seed: of everything drawn.
    """

    grid: tuple[int, int] = (2, 2)
    cell: int = 28
    items: tuple[int, int] = (2, 4)
    held_out: float = 0.1
    train: int = 30_000
    test: int = 2_000
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid", tuple(self.grid))
        object.__setattr__(self, "items", tuple(self.items))
        if len(self.grid) != 2 or not all(isinstance(g, int) and g >= 1 for g in self.grid) or self.grid[0] * self.grid[1] < 2:
            raise ValueError(f"grid={self.grid!r} must be (rows, cols) of at least 2 cells")
        lo, hi = self.items if len(self.items) == 2 else (0, 0)
        if not (isinstance(lo, int) and isinstance(hi, int) and 2 <= lo <= hi <= self.grid[0] * self.grid[1]):
            raise ValueError(f"items={self.items!r} must be (fewest, most) with 2 ≤ fewest ≤ most ≤ "
                             f"{self.grid[0] * self.grid[1]} cells")
        for name in ("cell", "train", "test"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be an int ≥ 1")
        if not 0 <= self.held_out < 1:
            raise ValueError(f"held_out={self.held_out!r} must be a share in [0, 1)")

    @property
    def size(self) -> tuple[int, int]:
        """``(R, W)`` of a canvas."""
        return self.grid[0] * self.cell, self.grid[1] * self.cell


#: ``dataset:fashion-captions``: 56×56 canvases, a 2 × 2 grid of 28-pixel cells.
FASHION_CAPTIONS = CanvasSpec()


@dataclass(frozen=True)
class CaptionSet(PixelSet):
    """Canvases with their captions (a :class:`~qkv.data.images.PixelSet`).

    Attributes:
        pixels: ``(N,1,R,W)`` uint8.
        captions: N captions.
        items: ``(N, most, 3)`` int64 rows of (class id, row, col) in reading order; ``-1`` rows pad.
        names: one word per class id. grid, cell: the layout.
        held_out: the links only test captions hold (:func:`~qkv.data.caption_grammar.held_out_links`).
        name: where they came from.
    """

    captions: tuple[str, ...]
    items: np.ndarray
    names: tuple[str, ...]
    grid: tuple[int, int]
    cell: int
    held_out: frozenset
    name: str


def _draw_classes(rng: np.random.Generator, cells: np.ndarray, n_classes: int, held: frozenset,
                  want_held: bool) -> np.ndarray:
    """Classes for items at ``cells`` (reading order) whose links avoid (train) or include (test) ``held``."""
    for _ in range(10_000):
        classes = rng.integers(0, n_classes, len(cells))
        items = np.column_stack([classes, cells])
        has = any(link in held for link in links_of(items))
        if has == want_held:
            return classes
    raise ImageDataError("could not draw a canvas with the held-out links asked for; raise CanvasSpec.held_out")


def build_canvases(pictures: ImageSet, spec: CanvasSpec, split: str, *,
                   names: Sequence[str] = FASHION_NAMES) -> CaptionSet:
    """``spec``'s ``split`` canvases (``train``: no held-out link; ``test``: at least one) from ``pictures``.

    Args:
        pictures: grey ``cell × cell`` item pictures with class ids (a split of Fashion-MNIST).
        spec: the layout, counts and seed. split: ``train`` or ``test``.
        names: one word per class of ``pictures``.

    Raises:
        ImageDataError: pictures of another size or with colour, classes without pictures, names
            that do not match the classes.
    """
    if split not in ("train", "test"):
        raise UnknownDatasetError(f"caption canvases have splits train and test, not {split!r}")
    if pictures.channels != 1 or pictures.size != (spec.cell, spec.cell):
        raise ImageDataError(f"{pictures.name}: canvases need grey {spec.cell}×{spec.cell} item pictures, these are "
                             f"{pictures.channels}×{'×'.join(map(str, pictures.size))}; set CanvasSpec.cell to their size")
    if len(names) != len(pictures.classes):
        raise ImageDataError(f"{len(names)} item names for {len(pictures.classes)} classes of {pictures.name}; give one "
                             "word per class")
    by_class = [np.flatnonzero(pictures.labels == c) for c in range(len(names))]
    empty = [names[c] for c, idx in enumerate(by_class) if len(idx) == 0]
    if empty:
        raise ImageDataError(f"{pictures.name}: no picture of class(es) {', '.join(empty)}; every class needs one")
    held = held_out_links(len(names), spec.held_out, spec.seed)
    if split == "test" and not held:
        raise ImageDataError("the test canvases hold a held-out link each; CanvasSpec.held_out must be > 0")
    n = spec.train if split == "train" else spec.test
    rng = np.random.default_rng([spec.seed, 0 if split == "train" else 1])
    (R, W), rows, cols, most = spec.size, spec.grid[0], spec.grid[1], spec.items[1]
    pixels = np.zeros((n, 1, R, W), dtype=np.uint8)
    items = np.full((n, most, 3), -1, dtype=np.int64)
    captions = []
    for i in range(n):
        k = int(rng.integers(spec.items[0], spec.items[1] + 1))
        flat = np.sort(rng.choice(rows * cols, size=k, replace=False))  # reading order
        cells = np.column_stack([flat // cols, flat % cols])  # (k,2) row, col
        classes = _draw_classes(rng, cells, len(names), held, want_held=split == "test")
        for j, (c, (r, q)) in enumerate(zip(classes.tolist(), cells.tolist())):
            pic = pictures.pixels[by_class[c][int(rng.integers(len(by_class[c])))], 0]  # (cell,cell)
            pixels[i, 0, r * spec.cell:(r + 1) * spec.cell, q * spec.cell:(q + 1) * spec.cell] = pic
            items[i, j] = (c, r, q)
        captions.append(caption_of(items[i], names))
    return CaptionSet(pixels, tuple(captions), items, tuple(names), spec.grid, spec.cell, held,
                      f"{pictures.name} canvases ({split})")


def open_captions(spec: str) -> CaptionSet:
    """``dataset:fashion-captions[:train|:test]`` (default ``train``) → :class:`CaptionSet`.

    Raises:
        UnknownDatasetError: another name or split. DatasetNotInstalledError: Fashion-MNIST is not
            installed (the message names ``make data``).
    """
    parts = spec.split(":") if isinstance(spec, str) else []
    if len(parts) not in (2, 3) or parts[0] != "dataset" or parts[1].lower() not in CAPTION_DATASETS:
        raise UnknownDatasetError(f"unknown caption data {spec!r}; caption data sets: "
                                  f"{', '.join('dataset:' + n + '[:train|:test]' for n in CAPTION_DATASETS)}")
    split = parts[2].lower() if len(parts) == 3 and parts[2] else "train"
    if split not in ("train", "test"):
        raise UnknownDatasetError(f"caption data set {parts[1]!r} has no split {split!r}; its splits: train, test")
    pictures = open_images(f"dataset:fashion-mnist:{split}")
    out = build_canvases(pictures, FASHION_CAPTIONS, split)
    return CaptionSet(out.pixels, out.captions, out.items, out.names, out.grid, out.cell, out.held_out,
                      f"dataset:fashion-captions:{split}")
