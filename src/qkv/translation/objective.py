"""Training a translation model on the one engine: length-bucketed batches of encoded pairs and the
sequence-to-sequence objective with label smoothing, held-out BLEU as its metric.

Legend: B pairs in a batch, S source length, T target length (both with their ``[EOS]``).

Batches are built once from the encoded pairs: sorted by (target, source) length — ties in a
seeded order — and cut into batches of at most ``batch_tokens`` padded tokens per side, so that a
batch holds verses of similar length and little padding. Epoch ``e`` visits the batches in a
permutation seeded by ``(seed, e)``; :meth:`TranslationBatches.batch` ``(i)`` is therefore a pure
function of ``i`` (what resumption needs). A pair whose source or target does not fit the model's
window is not trained on: :attr:`TranslationBatches.left_out` counts them (the run reports it).

Under ``torchrun`` (K processes) rank ``r`` trains on batches ``r, K + r, 2K + r, …`` of that
sequence: micro-batch ``i`` of rank ``r`` is batch ``i·K + r``, so K processes accumulating ``g``
micro-batches each take the same ``g·K`` batches per optimiser step as one process accumulating
``g·K`` (the engine normalises the loss by the target tokens of all of them). The held-out pairs are
split the same way: each rank translates every K-th pair, the translations are gathered and every
rank scores them all; the teacher-forced loss is summed over the ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from qkv.checkpoints.io import save
from qkv.models.mlm import IGNORE_INDEX
from qkv.training.distributed import all_sum, gather_lists
from qkv.translation.metrics import score
from qkv.translation.subwords import EOS, PAD
from qkv.translation.translate import translate

__all__ = ["TranslationBatch", "TranslationBatches", "TranslationObjective", "encode_side"]


def encode_side(tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Each text's subword ids followed by ``[EOS]`` (int64 arrays)."""
    return [np.asarray(e.ids + [EOS], dtype=np.int64) for e in tokenizer.encode_batch(list(texts))]


@dataclass
class TranslationBatch:
    """``input_ids (B,S)``, ``attention_mask (B,S)`` (1 = real), ``labels (B,T)`` (-100 = padding)."""

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor


def _pad(rows: list[np.ndarray], value: int) -> Tensor:
    out = np.full((len(rows), max(len(r) for r in rows)), value, dtype=np.int64)  # (B, longest)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return torch.from_numpy(out)


def make_batch(sources: list[np.ndarray], targets: list[np.ndarray]) -> TranslationBatch:
    """A right-padded :class:`TranslationBatch` of encoded pairs."""
    ids = _pad(sources, PAD)  # (B,S)
    return TranslationBatch(ids, (ids != PAD).long(), _pad(targets, IGNORE_INDEX))


class TranslationBatches:
    """The training batches of encoded pairs (see the module docstring).

    Args:
        sources, targets: encoded pairs (:func:`encode_side`), aligned.
        batch_tokens: padded tokens per side per batch at most (≥ the window).
        max_len: the model's window: longer pairs are left out (counted).
        seed: the order of ties and of every epoch.
    """

    def __init__(self, sources: list[np.ndarray], targets: list[np.ndarray], *, batch_tokens: int, max_len: int,
                 seed: int):
        if batch_tokens < max_len:
            raise ValueError(f"batch_tokens={batch_tokens} must be at least the window max_len={max_len}")
        keep = [i for i in range(len(sources)) if len(sources[i]) <= max_len and len(targets[i]) <= max_len]
        self.left_out = len(sources) - len(keep)
        if not keep:
            raise ValueError(f"no pair fits the window of {max_len} tokens; build a model with a larger max_len")
        self.sources, self.targets, self.seed = sources, targets, seed
        tie = np.random.default_rng(seed).permutation(len(sources))
        order = sorted(keep, key=lambda i: (len(targets[i]), len(sources[i]), tie[i]))
        self.batches: list[list[int]] = []
        current: list[int] = []
        width = 0  # the longest side in ``current``: every row is padded to it
        for i in order:
            w = max(len(targets[i]), len(sources[i]), width)
            if current and w * (len(current) + 1) > batch_tokens:
                self.batches.append(current)
                current, w = [], max(len(targets[i]), len(sources[i]))
            current.append(i)
            width = w
        self.batches.append(current)
        self.pairs = len(keep)

    def __len__(self) -> int:
        return len(self.batches)

    def batch(self, index: int) -> TranslationBatch:
        epoch, k = divmod(index, len(self.batches))
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.batches))
        rows = self.batches[int(perm[k])]
        return make_batch([self.sources[i] for i in rows], [self.targets[i] for i in rows])


class TranslationObjective:
    """Cross-entropy of the target given the source (teacher forcing, label smoothing ``smoothing``),
    on :class:`TranslationBatches`; held out: BLEU and chrF of greedy translations of ``held_out``
    pairs ``(source, target)`` and their teacher-forced loss. ``rank`` of ``world_size``: the share
    of batches and held-out pairs this process takes (see the module docstring)."""

    metric, metric_label, loss_label = "bleu", "BLEU (greedy)", "loss"

    def __init__(self, batches: TranslationBatches, tokenizer, held_out: Sequence[tuple[str, str]], *,
                 smoothing: float = 0.1, eval_batch_size: int = 64, rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        self.batches, self.tokenizer, self.held_out = batches, tokenizer, list(held_out)
        self.smoothing, self.eval_batch_size = smoothing, eval_batch_size
        self.rank, self.world_size = rank, world_size

    def batch(self, index: int) -> TranslationBatch:
        return self.batches.batch(index * self.world_size + self.rank)

    def units(self, batch: TranslationBatch) -> Tensor:
        return (batch.labels != IGNORE_INDEX).sum()

    def loss(self, model, batch: TranslationBatch) -> Tensor:
        return model(batch.input_ids, batch.attention_mask, labels=batch.labels, label_smoothing=self.smoothing,
                     sparse_logits=True).loss

    @torch.no_grad()
    def _eval_loss(self, model, pairs: list[tuple[str, str]]) -> float:
        """The teacher-forced loss over ``pairs`` of every rank (each rank gives its own share)."""
        window = model.encoder.max_len
        src = encode_side(self.tokenizer, [s for s, _ in pairs]) if pairs else []
        tgt = encode_side(self.tokenizer, [t for _, t in pairs]) if pairs else []
        fits = [i for i in range(len(src)) if len(src[i]) <= window and len(tgt[i]) <= window]
        total = torch.zeros(2, dtype=torch.float64)  # (loss sum, target tokens)
        for a in range(0, len(fits), self.eval_batch_size):
            rows = fits[a:a + self.eval_batch_size]
            b = make_batch([src[i] for i in rows], [tgt[i] for i in rows])
            k = int((b.labels != IGNORE_INDEX).sum())
            total[0] += float(model(b.input_ids, b.attention_mask, labels=b.labels, sparse_logits=True).loss) * k
            total[1] += k
        total = all_sum(total)
        return float(total[0] / max(float(total[1]), 1.0))

    def _translations(self, model, pairs: list[tuple[str, str]]) -> list[str]:
        """Greedy translations of every held-out pair: this rank's share, gathered from all ranks."""
        mine = translate(model, self.tokenizer, [s for s, _ in pairs], batch_size=self.eval_batch_size,
                         too_long="copy") if pairs else []
        hyps: list[str] = [""] * len(self.held_out)
        for r, part in enumerate(gather_lists(mine)):
            hyps[r::self.world_size] = part
        return hyps

    def evaluate(self, model) -> dict:
        if not self.held_out:
            return {}
        was = model.training
        model.eval()
        mine = self.held_out[self.rank::self.world_size]
        try:
            s = score(self._translations(model, mine), [t for _, t in self.held_out])
            loss = self._eval_loss(model, mine)
        finally:
            model.train(was)
        return {"bleu": round(s.bleu, 3), "chrf": round(s.chrf, 3), "eval_loss": round(loss, 5),
                "eval_pairs": len(self.held_out), "eval_ppl": round(math.exp(min(loss, 50.0)), 3)}

    def describe(self, ev: dict) -> str:
        return (f"held-out BLEU {ev['bleu']:.2f}, chrF {ev['chrf']:.2f}, loss {ev['eval_loss']:.3f} "
                f"({ev['eval_pairs']} pairs, greedy)")

    def save(self, model, out: Path) -> None:
        save(model, Path(out) / "model", tokenizer=self.tokenizer)
