"""Fixtures of the fine-tuning tests: a synthetic vocabulary, a tiny BERT-shaped model folder with a
tokenizer trained on it, and synthetic labelled data written as JSONL / CSV / CoNLL files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from finetune_support import CITY, FILLER, FIRST, LAST, TOPIC, tagged_sentence, topic_text, write_conll, write_jsonl  # noqa: F401


@pytest.fixture(scope="session")
def vocab_texts() -> list[str]:
    rng = random.Random(0)
    words = FIRST + LAST + CITY + FILLER + [w for ws in TOPIC.values() for w in ws]
    return [" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)]


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory, vocab_texts) -> Path:
    """A tiny random BERT-shaped qkv encoder (post-LN, learned positions; 32 wide, 4 heads, 2 layers,
    window 64) with a WordPiece tokenizer that has every synthetic word as one piece."""
    from qkv.config import ModelConfig
    from qkv.data.tokenizer import train_tokenizer
    from qkv.models.builders import build_encoder
    from qkv.checkpoints.io import save

    tok = train_tokenizer(vocab_texts, vocab_size=200)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=tok.vocab_size, d_model=32, n_heads=4, d_ff=64, max_len=64,
                             dropout=0.0)
    folder = tmp_path_factory.mktemp("tiny-bert") / "model"
    save(build_encoder(cfg), folder, tokenizer=tok.backend)
    return folder


@pytest.fixture(scope="session")
def topic_files(tmp_path_factory) -> tuple[Path, Path]:
    """Synthetic 3-topic classification, train (240) and held-out (60) JSONL files."""
    rng = random.Random(1)
    root = tmp_path_factory.mktemp("topics")
    rows = [{"text": topic_text(rng, lab), "label": lab} for _ in range(100) for lab in TOPIC]
    rng.shuffle(rows)
    return write_jsonl(root / "train.jsonl", rows[:240]), write_jsonl(root / "eval.jsonl", rows[240:])


@pytest.fixture(scope="session")
def conll_files(tmp_path_factory) -> tuple[Path, Path]:
    rng = random.Random(2)
    root = tmp_path_factory.mktemp("conll")
    train = [tagged_sentence(rng) for _ in range(300)]
    held = [tagged_sentence(rng) for _ in range(60)]
    return write_conll(root / "train.conll", train), write_conll(root / "eval.conll", held)
