"""Fixtures of the fine-tuning tests: a synthetic vocabulary, a tiny BERT-shaped model folder with a
tokenizer trained on it, and synthetic labelled data written as JSONL / CSV / CoNLL files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

FIRST = ["alice", "bruno", "carla", "dmitri", "elena", "farid", "greta", "hiro"]
LAST = ["smith", "novak", "okafor", "tanaka", "garcia", "muller"]
CITY = ["paris", "lagos", "lima", "oslo", "kyoto", "quito", "dakar"]
FILLER = ["the", "met", "in", "walked", "to", "from", "and", "saw", "today", "visited", "near", "with"]
TOPIC = {"sport": ["goal", "match", "team", "coach"], "money": ["bank", "price", "market", "loan"],
         "food": ["bread", "soup", "rice", "cheese"]}


def tagged_sentence(rng: random.Random) -> tuple[list[str], list[str]]:
    """Words and IOB2 tags: PER (first name, optionally a surname), LOC (a city), O (filler)."""
    words, tags = [], []
    for _ in range(rng.randint(4, 9)):
        r = rng.random()
        if r < 0.25:
            words.append(rng.choice(FIRST))
            tags.append("B-PER")
            if rng.random() < 0.5:
                words.append(rng.choice(LAST))
                tags.append("I-PER")
        elif r < 0.45:
            words.append(rng.choice(CITY))
            tags.append("B-LOC")
        else:
            words.append(rng.choice(FILLER))
            tags.append("O")
    return words, tags


def topic_text(rng: random.Random, label: str) -> str:
    words = [rng.choice(FILLER + CITY) for _ in range(rng.randint(5, 12))]
    for _ in range(2):
        words.insert(rng.randrange(len(words) + 1), rng.choice(TOPIC[label]))
    return " ".join(words)


def write_conll(path: Path, sentences) -> Path:
    lines = ["-DOCSTART- -X- O", ""]
    for words, tags in sentences:
        lines += [f"{w} X {t}" for w, t in zip(words, tags)] + [""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


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
    from qkv.models.io import save

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
