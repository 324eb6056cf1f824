"""Does cross-attention look at the right source word? Proper names give gold alignment points.

Legend: L decoder layers, H heads, T target length, S source length.

Names such as *Abraham*, *Jerusalem*, *Daniel* are spelled the same in the King James and the
Reina-Valera: a capitalised word (three letters or more, not the first word of either side) found
in both the source and the reference of a pair is a gold alignment point — the decoder, when it
writes the name's first subword, should read the name in the source. :func:`name_alignment` runs
the model on each pair with teacher forcing (the decoder reads the reference, so it "emits" each
reference token at its position), takes the cross-attention row of the query that predicts the
name's first subword, and counts a hit when its argmax over the source lands on one of the name's
source subwords — per layer and head, per layer with the heads averaged, and with every layer and
head averaged. Two reference points come with it: ``chance`` (the expected hit rate of a uniformly
random source position: name subwords / source length) and ``diagonal`` (the source position at
the same relative place as the target position).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from qkv.translation.errors import TranslationError
from qkv.translation.subwords import EOS, check_subwords

__all__ = ["AlignmentReport", "name_alignment", "shared_names"]

_NAME = re.compile(r"\b[A-ZÁÉÍÓÚÑ][a-záéíóúñ]{2,}\b")


def shared_names(source: str, target: str) -> list[str]:
    """The capitalised words (≥ 3 letters) in both texts, other than either side's first word."""
    def names(text):
        found = list(_NAME.finditer(text))
        return {m.group() for m in found if m.start() > 0 and text[:m.start()].strip()}

    return sorted(names(source) & names(target))


@dataclass
class AlignmentReport:
    """Hit rates of cross-attention's argmax on the names' source subwords.

    Attributes:
        points: name occurrences scored (target side). pairs: pairs holding at least one.
        per_head: ``(L,H)`` hit rate of each layer's each head.
        per_layer: ``(L,)`` hit rate of each layer's head-averaged attention.
        averaged: hit rate of the attention averaged over every layer and head.
        chance: expected hit rate of a uniformly random source position.
        diagonal: hit rate of the source position at the target position's relative place.
    """

    points: int
    pairs: int
    per_head: np.ndarray
    per_layer: np.ndarray
    averaged: float
    chance: float
    diagonal: float

    def table(self) -> str:
        """A Markdown table: one row per layer (each head, and the heads averaged)."""
        L, H = self.per_head.shape
        lines = [f"{self.points} name occurrences in {self.pairs} pairs; all layers and heads averaged: "
                 f"{self.averaged:.3f} (chance {self.chance:.3f}, diagonal {self.diagonal:.3f})", "",
                 "| layer | " + " | ".join(f"head {h + 1}" for h in range(H)) + " | heads averaged |",
                 "|---" * (H + 2) + "|"]
        for layer in range(L):
            cells = " | ".join(f"{v:.3f}" for v in self.per_head[layer])
            lines.append(f"| {layer + 1} | {cells} | {self.per_layer[layer]:.3f} |")
        return "\n".join(lines)


def _spans(offsets, text: str, name: str) -> list[list[int]]:
    """Token indices of each whole-word occurrence of ``name`` in ``text`` (from the char offsets)."""
    out = []
    for m in re.finditer(rf"\b{re.escape(name)}\b", text):
        toks = [i for i, (a, b) in enumerate(offsets) if a < m.end() and b > m.start()]
        if toks:
            out.append(toks)
    return out


@torch.no_grad()
def name_alignment(model, tokenizer, pairs: Sequence, *, max_pairs: int | None = None) -> AlignmentReport:
    """Score cross-attention on the shared names of ``pairs`` (see the module docstring).

    Args:
        model: a trained :class:`~qkv.models.seq2seq.EncoderDecoder`.
        tokenizer: its translation tokenizer (:mod:`qkv.translation.subwords`).
        pairs: :class:`~qkv.data.pairs.Pair` s or ``(source, target)`` tuples.
        max_pairs: score at most this many pairs holding a name (in order).

    Raises:
        TranslationError: no pair holds a name both sides spell the same.
    """
    check_subwords(tokenizer)
    was = model.training
    model.eval()
    window = min(model.encoder.max_len, model.decoder.max_len)
    L = len(model.decoder.layers)
    hits_head, hits_layer, hits_avg, chance, diag = [], [], [], [], []
    n_pairs = 0
    for p in pairs:
        src, tgt = (p.source, p.target) if hasattr(p, "source") else p
        names = shared_names(src, tgt)
        if not names:
            continue
        es, et = tokenizer.encode(src), tokenizer.encode(tgt)
        if len(es.ids) + 1 > window or len(et.ids) + 1 > window:
            continue
        points = [(t[0], [i for sp in _spans(es.offsets, src, n) for i in sp])
                  for n in names for t in _spans(et.offsets, tgt, n)]
        points = [(t, gold) for t, gold in points if gold]
        if not points:
            continue
        ids = torch.tensor([es.ids + [EOS]])  # (1,S)
        labels = torch.tensor([et.ids + [EOS]])  # (1,T)
        cross = model(ids, labels=labels, output_attentions=True).cross_attentions
        A = torch.stack(cross)[:, 0].float()  # L × (1,H,T,S) -> (L,H,T,S)
        S, T = A.shape[-1], A.shape[-2]
        for t, gold in points:
            row = A[:, :, t]  # (L,H,S)
            g = torch.tensor(gold)
            hits_head.append(torch.isin(row.argmax(-1), g).float().numpy())  # (L,H)
            hits_layer.append(torch.isin(row.mean(1).argmax(-1), g).float().numpy())  # (L,)
            hits_avg.append(float(torch.isin(row.mean((0, 1)).argmax(), g)))
            chance.append(len(gold) / S)
            diag.append(float(round(t * (S - 1) / max(T - 1, 1)) in gold))
        n_pairs += 1
        if max_pairs is not None and n_pairs >= max_pairs:
            break
    model.train(was)
    if not hits_avg:
        raise TranslationError("no pair holds a name spelled the same on both sides (a capitalised word of 3 "
                               "letters or more, not the first word); give pairs with shared proper names")
    return AlignmentReport(len(hits_avg), n_pairs, np.mean(hits_head, 0), np.mean(hits_layer, 0) if L else np.zeros(0),
                           float(np.mean(hits_avg)), float(np.mean(chance)), float(np.mean(diag)))
