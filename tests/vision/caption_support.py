"""A tiny canvas set (8-pixel cells, each class one fixed texture) and a captioning run trained on it,
shared by the captioning tests."""

from __future__ import annotations

import numpy as np

from qkv.data.canvases import CanvasSpec, build_canvases
from qkv.data.caption_grammar import FASHION_NAMES
from qkv.data.images import ImageSet
from qkv.vision.caption_config import CaptionTrainConfig
from qkv.vision.captioning import train_captions

SPEC = CanvasSpec(grid=(2, 2), cell=8, items=(2, 3), held_out=0.1, train=400, test=60, seed=0)


def pictures(per_class: int, seed: int, cell: int = 8) -> ImageSet:
    """Class c: one fixed random texture plus a little noise of the picture's own."""
    rng = np.random.default_rng(seed)
    base = np.random.default_rng(123).integers(0, 256, (10, cell, cell))
    labels = np.repeat(np.arange(10), per_class)
    pixels = np.clip(base[labels] + rng.integers(-20, 21, (len(labels), cell, cell)), 0, 255)
    return ImageSet(pixels.astype(np.uint8)[:, None], labels, FASHION_NAMES, f"textures (seed {seed})")


def tiny_canvases():
    """(train, held out): training canvases from one set of pictures, held-out ones from another."""
    return build_canvases(pictures(5, 0), SPEC, "train"), build_canvases(pictures(5, 1), SPEC, "test")


def train_tiny(out, **changes):
    cfg = CaptionTrainConfig(out=str(out), preset="caption-tiny", progress=False, eval_sample=60, **changes)
    return train_captions(cfg, data=tiny_canvases())
