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


def open_chromium(tmp_path):
    """A headless Chromium driver, or ``None`` with the reason when Chromium, chromedriver or selenium is absent."""
    import importlib.util
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser or not shutil.which("chromedriver"):
        return None, "headless Chromium absent: apt-get install -y chromium chromium-driver"
    if importlib.util.find_spec("selenium") is None:
        return None, "selenium is not installed: pip install selenium"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=opts), None
