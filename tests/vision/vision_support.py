"""Helpers of the vision tests: a tiny image classifier (8×8 grey pictures, 2×2 patches: a 4×4 grid and
[CLS], 3 classes, 2 layers of 2 heads) and pictures written as PNG files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from qkv.models.heads import TaskConfig
from qkv.models.vision_builders import build_image_classifier
from qkv.vision.config import model_config

LABELS = ("zero", "one", "two")


def tiny_classifier(**image):
    torch.manual_seed(0)
    config = model_config("vit-digits", {"image": {"patch": 2, "cls_token": True, **image}}, n_heads=2, n_layers=2,
                          d_model=24, d_ff=40)
    return build_image_classifier(config, TaskConfig("sequence-classification", LABELS, pooling="cls"))


def write_picture(path: Path, size=(8, 8), colour: bool = False, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    shape = (*size, 3) if colour else size
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(path)
    return path
