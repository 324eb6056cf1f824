"""Fixtures of the vision tests: a tiny image classifier folder, pictures written as PNG files, and the
captioning run the captioning tests share (trained once per session, one thread)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from caption_support import train_tiny

from qkv.checkpoints.io import save
from vision_support import tiny_classifier, write_picture


@pytest.fixture(scope="session")
def classifier_folder(tmp_path_factory) -> Path:
    """A tiny random image classifier saved as a qkv folder; do not modify it."""
    folder = tmp_path_factory.mktemp("vision") / "classifier"
    save(tiny_classifier(), folder)
    return folder


@pytest.fixture()
def pictures(tmp_path) -> list[Path]:
    """Three 8×8 grey PNG pictures in tmp_path/pics (one in a sub-folder)."""
    return [write_picture(tmp_path / "pics" / "a.png", seed=1), write_picture(tmp_path / "pics" / "b.png", seed=2),
            write_picture(tmp_path / "pics" / "sub" / "c.png", seed=3)]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train_tiny(tmp_path_factory.mktemp("cap") / "run", eval_every=150)
    finally:
        torch.set_num_threads(old)
