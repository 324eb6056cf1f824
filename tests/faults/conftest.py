"""Fixtures of the fault-injection suite: a tiny model folder, an isolated token cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("QKV_DEBUG", raising=False)
    monkeypatch.delenv("QKV_FAULT_PAUSE", raising=False)


@pytest.fixture(scope="session")
def texts() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)][:60]


@pytest.fixture(scope="session")
def tokenizer(texts):
    from qkv.data.tokenizer import train_tokenizer

    return train_tokenizer(texts, vocab_size=200, max_chars=100_000)


@pytest.fixture(scope="session")
def model_folder(tmp_path_factory, tokenizer) -> Path:
    """A tiny random qkv masked-LM folder (window 32) with its tokenizer; do not modify it."""
    from qkv.config import ModelConfig
    from qkv.models.builders import build_masked_lm
    from qkv.checkpoints.io import save

    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=tokenizer.vocab_size, max_len=32)
    folder = tmp_path_factory.mktemp("model") / "model"
    save(build_masked_lm(cfg), folder, tokenizer=tokenizer.backend)
    return folder


@pytest.fixture()
def model_copy(tmp_path, model_folder) -> Path:
    import shutil

    dst = tmp_path / "model"
    shutil.copytree(model_folder, dst)
    return dst
