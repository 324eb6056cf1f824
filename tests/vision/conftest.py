"""Fixtures of the vision tests: a tiny image classifier folder and pictures written as PNG files."""

from __future__ import annotations

from pathlib import Path

import pytest

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
