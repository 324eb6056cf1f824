"""Fill in a masked word: a masked LM's top-k tokens for one mask token, beside the unigram baseline.

The mask token is the tokenizer's own (``[MASK]`` for BERT, ``<mask>`` for RoBERTa; its ``mask`` role,
:mod:`qkv.data.special_tokens`). Outputs in the shape of ``transformers``' fill-mask pipeline:
:func:`qkv.pipelines.pipeline`.

    examples = fill_mask(model, tokenizer, ["thanks in [MASK] for any help"], k=5)
    examples[0].top      # [("advance", 0.83), ("anticipation", 0.04), …]

The unigram baseline predicts every masked token from its frequency alone — the best a model
can do without looking at the context, and what a model whose attention is uniform over a bag
of words comes close to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from qkv.data.tokenizer import WordPieceTokenizer

__all__ = ["MASK", "FillMask", "fill_mask", "mask_token", "masked_ids", "unigram_distribution"]

#: BERT's mask token (a tokenizer's own is :func:`mask_token`).
MASK = "[MASK]"


@dataclass(frozen=True)
class FillMask:
    """One sentence with one masked token.

    Attributes:
        text: the sentence, ``[MASK]`` in place of the hidden word.
        answer: the hidden word (``None`` when not given).
        top: the model's ``k`` most probable tokens with their probabilities.
        answer_prob, answer_rank: the model's probability of the answer and its rank (1 = top).
        unigram_top, unigram_answer_prob, unigram_answer_rank: the same for the unigram baseline.
    """

    text: str
    answer: str | None
    top: list[tuple[str, float]]
    answer_prob: float | None
    answer_rank: int | None
    unigram_top: list[tuple[str, float]]
    unigram_answer_prob: float | None
    unigram_answer_rank: int | None


def unigram_distribution(tokens: np.ndarray, vocab_size: int, special_ids=()) -> np.ndarray:
    """``(V,)`` token frequencies of ``tokens`` (add-one smoothed, special tokens at zero)."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size)[:vocab_size] + 1.0
    counts[list(special_ids)] = 0.0
    return counts / counts.sum()


def _top(probs: np.ndarray, tokenizer: WordPieceTokenizer, k: int) -> list[tuple[str, float]]:
    order = np.argsort(-probs, kind="stable")[:k]
    return [(tokenizer.id_to_token(int(i)), float(probs[i])) for i in order]


def _answer(probs: np.ndarray, answer_id: int | None) -> tuple[float | None, int | None]:
    if answer_id is None:
        return None, None
    p = float(probs[answer_id])
    return p, int((probs > probs[answer_id]).sum()) + 1


def mask_token(tokenizer: WordPieceTokenizer) -> str:
    """The text of the tokenizer's mask token (``[MASK]``, ``<mask>``)."""
    return tokenizer.specials.token("mask") or MASK


def masked_ids(tokenizer: WordPieceTokenizer, text: str) -> tuple[list[int], int]:
    """The model input of a text with one mask token: ``[CLS] left [MASK] right [SEP]`` ids (each
    side encoded on its own; the tokenizer's own template and mask token) and the position of the mask.

    Raises:
        ValueError: the text has no mask token or more than one.
    """
    mask = mask_token(tokenizer)
    if text.count(mask) != 1:
        raise ValueError(f"fill_mask needs exactly one {mask} per text, got {text.count(mask)} in {text!r}")
    left, right = text.split(mask)
    sp = tokenizer.specials
    ids = ([*sp.prefix] + tokenizer.encode(left, add_special_tokens=False) + [tokenizer.special.mask]
           + tokenizer.encode(right, add_special_tokens=False) + [*sp.suffix])
    return ids, ids.index(tokenizer.special.mask)


@torch.no_grad()
def fill_mask(model, tokenizer: WordPieceTokenizer, texts: list[str], *, answers: list[str] | None = None,
              unigram: np.ndarray | None = None, k: int = 5) -> list[FillMask]:
    """The model's top-``k`` for the one ``[MASK]`` of each text (and the unigram baseline's).

    Args:
        model: a masked LM (``model(ids, mask).logits`` is ``(1,T,V)``).
        tokenizer: its tokenizer.
        texts: sentences with exactly one ``[MASK]`` each.
        answers: the hidden words; each must be one token of the vocabulary.
        unigram: ``(V,)`` baseline probabilities (:func:`unigram_distribution`); ``None``: no baseline.

    Raises:
        ValueError: a text without exactly one ``[MASK]``, or an answer that is not one token.
    """
    if answers is not None and len(answers) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(answers)} answers")
    was_training = model.training
    model.eval()
    results = []
    try:
        for i, text in enumerate(texts):
            ids, where = masked_ids(tokenizer, text)
            x = torch.tensor([ids])  # (1,T)
            logits = model(x, torch.ones_like(x, dtype=torch.bool)).logits[0, where]  # (1,T,V) -> (V,)
            probs = torch.softmax(logits.double(), -1).numpy()
            probs[list(tokenizer.special.ids)] = 0.0  # never a special token
            probs /= probs.sum()
            answer = answers[i] if answers is not None else None
            answer_id = None
            if answer is not None:
                pieces = tokenizer.encode(answer, add_special_tokens=False)
                if len(pieces) != 1:
                    raise ValueError(f"answer {answer!r} is {len(pieces)} tokens of this vocabulary; fill_mask "
                                     "scores one-token answers only")
                answer_id = pieces[0]
            a_p, a_r = _answer(probs, answer_id)
            u_top, (u_p, u_r) = ([], (None, None)) if unigram is None else (_top(unigram, tokenizer, k),
                                                                            _answer(unigram, answer_id))
            results.append(FillMask(text, answer, _top(probs, tokenizer, k), a_p, a_r, u_top, u_p, u_r))
    finally:
        model.train(was_training)
    return results
