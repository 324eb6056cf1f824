"""The grammar of the captioned canvases (:mod:`qkv.data.canvases`) and its word-level tokenizer.

A canvas holds two to four items at cells of a grid. Its caption names the items in reading order
(row by row, left to right) and, between each item and the next, the first one's place relative to
the second:

    relation of item k to item k+1   when item k+1 is …
    ``left of``                      in the same row (further right)
    ``above``                        in a lower row, the same column
    ``above and left of``            in a lower row, a column further right
    ``above and right of``           in a lower row, a column further left

    a sneaker above a bag left of a dress         (sneaker over bag; bag and dress side by side)

One caption per canvas (the grammar has no choices), so exact match is a fair score. A *link* is
one ``(name, relation, name)`` step of a caption; :func:`held_out_links` draws a seeded share of
all links that no training caption contains and every test caption contains at least once.

The tokenizer (:func:`caption_tokenizer`) is a ``tokenizers`` word-level model over the grammar's
words, split at spaces: ``[PAD]=0``, ``[BOS]=1`` (the decoder's start), ``[EOS]=2`` (ends a
caption), ``[UNK]=3``, then the words. It depends on the item names only, so a run and
``qkv caption`` make the same one; a run saves it with the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

__all__ = ["FASHION_NAMES", "RELATIONS", "SPECIALS", "PAD", "BOS", "EOS", "UNK", "relation", "caption_of",
           "links_of", "all_links", "held_out_links", "caption_words", "caption_tokenizer", "names_of_caption"]

#: One word per Fashion-MNIST class, in class-id order (T-shirt/top … Ankle boot).
FASHION_NAMES = ("top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot")
#: The relations of an item to the next one in reading order.
RELATIONS = ("left of", "above", "above and left of", "above and right of")
#: The special tokens, in id order.
SPECIALS = ("[PAD]", "[BOS]", "[EOS]", "[UNK]")
PAD, BOS, EOS, UNK = range(4)


def relation(a: tuple[int, int], b: tuple[int, int]) -> str:
    """The relation of the item at cell ``a = (row, col)`` to the one at ``b``, ``b`` after ``a`` in
    reading order.

    Raises:
        ValueError: ``b`` is not after ``a`` in reading order.
    """
    if b[0] < a[0] or (b[0] == a[0] and b[1] <= a[1]):
        raise ValueError(f"cell {b} is not after cell {a} in reading order (row by row, left to right)")
    if b[0] == a[0]:
        return "left of"
    if b[1] == a[1]:
        return "above"
    return "above and left of" if b[1] > a[1] else "above and right of"


def _ordered(items: np.ndarray) -> np.ndarray:
    """The real rows of ``items`` (``(k,3)``: class, row, col; ``-1`` rows are padding) in reading order."""
    items = np.asarray(items)
    real = items[items[:, 0] >= 0]
    return real[np.lexsort((real[:, 2], real[:, 1]))]


def links_of(items: np.ndarray) -> list[tuple[int, str, int]]:
    """The caption's links ``(class, relation, class)`` of one canvas's ``items`` (``(k,3)``)."""
    it = _ordered(items)
    rows = it.tolist()
    return [(a[0], relation((a[1], a[2]), (b[1], b[2])), b[0]) for a, b in zip(rows[:-1], rows[1:])]


def caption_of(items: np.ndarray, names: Sequence[str] = FASHION_NAMES) -> str:
    """The caption of one canvas: ``items`` ``(k,3)`` rows of (class id, row, col), ``-1`` rows ignored."""
    it = _ordered(items)
    if len(it) == 0:
        raise ValueError("a canvas with no items has no caption")
    words = [f"a {names[int(it[0, 0])]}"]
    for (c0, r0, k0), (c1, r1, k1) in zip(it[:-1].tolist(), it[1:].tolist()):
        words.append(f"{relation((r0, k0), (r1, k1))} a {names[c1]}")
    return " ".join(words)


def all_links(n_classes: int) -> list[tuple[int, str, int]]:
    """Every ``(class, relation, class)`` link, in a fixed order."""
    return [(a, r, b) for a in range(n_classes) for r in RELATIONS for b in range(n_classes)]


def held_out_links(n_classes: int, share: float, seed: int) -> frozenset[tuple[int, str, int]]:
    """A seeded ``share`` of :func:`all_links` (at least one when ``share > 0``): the links only the test
    captions contain."""
    if not 0 <= share < 1:
        raise ValueError(f"held-out share must be in [0, 1), got {share!r}")
    links = all_links(n_classes)
    k = 0 if share == 0 else max(1, round(share * len(links)))
    pick = np.random.default_rng([seed, 0xCA9]).permutation(len(links))[:k]
    return frozenset(links[i] for i in pick.tolist())


def caption_words(names: Sequence[str] = FASHION_NAMES) -> list[str]:
    """The grammar's words: ``a``, the relations' words, then the item names (each once, in order)."""
    words = ["a"] + [w for r in RELATIONS for w in r.split()] + list(names)
    return list(dict.fromkeys(words))


def caption_tokenizer(names: Sequence[str] = FASHION_NAMES) -> Tokenizer:
    """The word-level tokenizer of the grammar (see the module docstring)."""
    bad = [n for n in names if not n or " " in n or n in SPECIALS]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"item names must be distinct single words; got {list(names)}")
    vocab = {t: i for i, t in enumerate(list(SPECIALS) + caption_words(names))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIALS))
    return tok


def names_of_caption(caption: str, names: Sequence[str] = FASHION_NAMES) -> str:
    """The items' names of a caption, in its order, without relations (``a sneaker a bag a dress``) —
    the captions of the names-only baseline."""
    known = set(names)
    return " ".join(f"a {w}" for w in caption.split() if w in known)
