"""Data writers the fine-tuning tests share (a module of their own: every test folder has a conftest.py,
so ``from conftest import`` would pick whichever was imported first)."""

from __future__ import annotations

import json
import random
from pathlib import Path

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
