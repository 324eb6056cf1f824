"""Three published findings about attention, measured on any qkv model (``qkv findings``).

Legend: B texts, T tokens, L layers, H heads, K classes. Layers and heads from 0 (``L0H3``).

* :func:`abnar_zuidema` (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"): per layer
  ℓ, the Spearman rank correlation, over a text's input tokens, between blank-out importance (the drop
  of the predicted class's probability — or logit, which does not saturate — when the token is
  replaced by ``[UNK]``) and three attention
  views read at the classifier's query rows — raw attention of layer ℓ (heads averaged), attention
  rollout and attention flow through layers 0 … ℓ — averaged over texts.
* :func:`michel_pruning` (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?"):
  head importance ``E|∂L/∂ξ_h|`` on one set of labelled texts, then heads switched off (zero-ablated)
  least important first, accuracy measured on another set; optionally each head alone.
* :func:`kobayashi_shares` (Kobayashi et al. 2020, "Attention is Not Only a Weight"): per layer, the
  share of attention going to ``[CLS]``, ``[SEP]`` and punctuation, by the weights α (heads averaged)
  and by the norms ``‖Σ_h α_h f_h(x)‖`` (each row as shares of its sum), averaged over query tokens.

Each returns a dataclass with ``to_dict()`` and ``table()`` (header, rows) for the report.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from torch import nn

from qkv.analysis.attribution import attention_flow, attention_rollout, value_norms
from qkv.analysis.hooked import Batch, call, layer_paths, run_with_cache
from qkv.analysis.interventions import ablation_effects, classification_metrics, head_importance, pruning_curve
from qkv.analysis.naming import head_label, layer_label
from qkv.analysis.saliency import class_logit, class_probability, leave_one_out

__all__ = ["TARGETS", "AbnarZuidema", "abnar_zuidema", "MichelPruning", "michel_pruning", "KobayashiShares",
           "kobayashi_shares", "CATEGORIES"]

_VIEWS = ("raw", "rollout", "flow")
#: What blank-out importance measures in :func:`abnar_zuidema`.
TARGETS = ("probability", "logit")


def _query_rows(model: nn.Module, n: int) -> list[int]:
    """The positions the classifier reads: ``[CLS]`` (pooler, cls) or every token (mean and other poolings)."""
    pooling = getattr(getattr(model, "task", None), "pooling", "cls")
    return [0] if pooling in ("cls", "pooler") else list(range(n))


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


@dataclass
class AbnarZuidema:
    """Per layer, the mean (and standard deviation over texts) of the rank correlation of each view with
    blank-out importance; ``top1``: the share of texts whose most important token (by blank-out) is the
    view's largest, against ``chance`` (the mean of 1 / content tokens); ``n_texts`` texts, ``queries``
    the rows read (``"[CLS]"`` or ``"mean of all"``)."""

    mean: dict[str, np.ndarray]
    std: dict[str, np.ndarray]
    n_texts: int
    queries: str
    accuracy: float | None = None
    target: str = "probability"
    top1: dict[str, np.ndarray] | None = None
    chance: float | None = None

    def table(self) -> tuple[list[str], list[list[str]]]:
        views = list(self.mean)
        top = self.top1 or {}
        rows = [[layer_label(i), *(f"{self.mean[v][i]:+.2f} ± {self.std[v][i]:.2f}" for v in views),
                 *(f"{top[v][i]:.2f}" for v in views if v in top)] for i in range(len(self.mean[views[0]]))]
        return ["layer", *views, *(f"top-1 {v}" for v in views if v in top)], rows

    def to_dict(self) -> dict:
        return {"finding": "abnar-zuidema", "n_texts": self.n_texts, "queries": self.queries, "accuracy": self.accuracy,
                "target": self.target, "chance": self.chance,
                "top1": None if self.top1 is None else {k: v.tolist() for k, v in self.top1.items()},
                "mean": {k: v.tolist() for k, v in self.mean.items()},
                "std": {k: v.tolist() for k, v in self.std.items()}}


@torch.no_grad()
def _attention(model: nn.Module, one: Batch) -> list[torch.Tensor]:
    names = [f"{p}.attention.weights" for p in layer_paths(model)]
    _, kept = run_with_cache(model, one, names)
    return [kept[n].double() for n in names]  # L × (1,H,T,T)


def abnar_zuidema(model: nn.Module, batch: Batch, *, replacement_id: int, flow: bool = True,
                  labels: torch.Tensor | None = None, target: str = "probability") -> AbnarZuidema:
    """Rank correlations of raw attention, rollout and flow with blank-out importance, per layer.

    Args:
        model: a qkv sequence classifier.
        batch: the texts, ``[CLS] … [SEP]`` (special tokens are left out of the correlation).
        replacement_id: the token a blanked-out token becomes (``[UNK]``).
        flow: also attention flow (``len(queries) · T`` max-flow problems per layer and text).
        labels: ``(B,)`` gold labels, for the accuracy printed beside the table (optional).
        target: blank-out measured on the predicted class's ``"probability"`` or its ``"logit"``.
    """
    if target not in TARGETS:
        raise ValueError(f"target {target!r}: choose one of {', '.join(TARGETS)}")
    with torch.no_grad():
        logits = call(model, batch).logits  # (B,K)
    predicted = logits.argmax(-1)  # (B,)
    score = class_probability(predicted) if target == "probability" else class_logit(predicted)
    blank = leave_one_out(model, batch, score, replacement_id=replacement_id)  # (B,T)
    views = [v for v in _VIEWS if v != "flow" or flow]
    L = len(layer_paths(model))
    per_text = {v: [] for v in views}
    hits = {v: [] for v in views}
    chance = []
    for b in range(len(batch)):
        one = batch.row(b)
        n = one.input_ids.shape[1]
        if n < 4:  # fewer than two content tokens: no ranking
            continue
        rows = _query_rows(model, n)
        weights = _attention(model, one)
        maps = {"raw": torch.stack([w[0].mean(0) for w in weights]),  # (L,T,T)
                "rollout": attention_rollout(weights, all_layers=True)[:, 0]}  # (L,T,T)
        if flow:
            f = attention_flow(weights, all_layers=True, queries=rows)[:, 0]  # (L,Q,T)
            maps["flow"] = f
        imp = blank[b, 1:n - 1].double().numpy()  # content tokens only
        chance.append(1 / (n - 2))
        for v in views:
            m = maps[v] if v == "flow" else maps[v][:, rows]  # (L,Q,T)
            seen = m.mean(1)[:, 1:n - 1].numpy()  # (L,T-2): the rows the classifier reads, averaged
            per_text[v].append([_spearman(seen[layer], imp) for layer in range(L)])
            hits[v].append([float(np.argmax(seen[layer]) == np.argmax(imp)) for layer in range(L)])
    if not per_text[views[0]]:
        raise ValueError("no text has two content tokens or more: nothing to rank")
    arrays = {v: np.array(per_text[v]) for v in views}  # (N,L)
    acc = None if labels is None else float((predicted == labels).double().mean())
    return AbnarZuidema({v: np.nanmean(a, 0) for v, a in arrays.items()}, {v: np.nanstd(a, 0) for v, a in arrays.items()},
                        len(arrays[views[0]]), "[CLS]" if _query_rows(model, 4) == [0] else "mean of all", acc, target,
                        {v: np.mean(hits[v], 0) for v in views}, float(np.mean(chance)))


@dataclass
class MichelPruning:
    """Head importance ``(L,H)``, accuracy after pruning the ``counts`` least important heads, the heads
    pruned at the largest count within ``tolerance`` of the intact accuracy, and (optional) each head alone."""

    importance: np.ndarray
    counts: list[int]
    accuracy: list[float]
    order: list[tuple[int, int]]
    tolerance: float = 0.01
    single: np.ndarray | None = None
    n_eval: int = 0
    n_importance: int = 0

    @property
    def prunable(self) -> int:
        """The most heads pruned (on the curve) with accuracy at most ``tolerance`` below the intact model's."""
        ok = [c for c, a in zip(self.counts, self.accuracy) if a >= self.accuracy[0] - self.tolerance - 1e-12]
        return max(ok)

    def table(self) -> tuple[list[str], list[list[str]]]:
        total = self.importance.size
        return ["heads pruned", "share", "accuracy", "change"], [
            [str(c), f"{c / total:.0%}", f"{a:.4f}", f"{a - self.accuracy[0]:+.4f}"]
            for c, a in zip(self.counts, self.accuracy)]

    def to_dict(self) -> dict:
        return {"finding": "michel", "importance": self.importance.tolist(), "counts": self.counts,
                "accuracy": self.accuracy, "tolerance": self.tolerance, "prunable": self.prunable,
                "pruned_heads": [head_label(*h) for h in self.order[: self.prunable]],
                "single_head_accuracy_change": None if self.single is None else self.single.tolist(),
                "n_eval": self.n_eval, "n_importance": self.n_importance}


def michel_pruning(model: nn.Module, eval_batches: list[tuple[Batch, torch.Tensor]],
                   importance_batches: list[tuple[Batch, torch.Tensor]], *, step: int = 4,
                   single: bool = False, tolerance: float = 0.01) -> MichelPruning:
    """Michel et al.'s importance, then accuracy with the ``0, step, 2·step, …`` least important heads off.

    Args:
        eval_batches: ``(batch, labels)`` pairs the accuracy is measured on.
        importance_batches: ``(batch, labels)`` pairs the importance is estimated on (keep them apart).
        single: also each head switched off alone (L·H evaluations).
    """
    labels_of = {id(b): y for b, y in importance_batches}
    importance = head_importance(model, [b for b, _ in importance_batches],
                                 lambda out, b: F.cross_entropy(out.logits, labels_of[id(b)], reduction="none"))
    L, H = importance.shape
    counts = list(range(0, L * H, step))
    evaluate = classification_metrics(eval_batches)
    steps = pruning_curve(model, importance, evaluate, fractions=[c / (L * H) for c in counts])
    order = [tuple(int(x) for x in np.unravel_index(i, (L, H))) for i in np.argsort(importance, axis=None, kind="stable")]
    alone = ablation_effects(model, evaluate).effects["accuracy"] if single else None
    return MichelPruning(importance, [len(s.pruned) for s in steps], [s.metrics["accuracy"] for s in steps], order,
                         tolerance, alone, sum(len(y) for _, y in eval_batches),
                         sum(len(y) for _, y in importance_batches))


#: What :func:`kobayashi_shares` sorts key tokens into.
CATEGORIES = ("[CLS]", "[SEP]", "punctuation", "other")


def _category(token: str) -> int:
    if token in ("[CLS]", "[SEP]"):
        return CATEGORIES.index(token)
    return 2 if token and all(ch in string.punctuation for ch in token) else 3


@dataclass
class KobayashiShares:
    """``alpha`` and ``norm``: ``(L, 4)`` mean shares of a query's attention on each of :data:`CATEGORIES`;
    ``token_share``: the share of keys in each category (what uniform attention would give)."""

    alpha: np.ndarray
    norm: np.ndarray
    token_share: np.ndarray
    n_texts: int
    n_tokens: int

    def table(self) -> tuple[list[str], list[list[str]]]:
        head = ["layer"] + [f"{c} {w}" for c in CATEGORIES[:3] for w in ("α", "‖αf‖")]
        rows = [[layer_label(i)] + [f"{m[i, c]:.3f}" for c in range(3) for m in (self.alpha, self.norm)]
                for i in range(len(self.alpha))]
        return head, rows

    def to_dict(self) -> dict:
        return {"finding": "kobayashi", "categories": list(CATEGORIES), "alpha": self.alpha.tolist(),
                "norm": self.norm.tolist(), "token_share": self.token_share.tolist(), "n_texts": self.n_texts,
                "n_tokens": self.n_tokens}


@torch.no_grad()
def kobayashi_shares(model: nn.Module, batch: Batch) -> KobayashiShares:
    """Shares of attention on ``[CLS]``, ``[SEP]`` and punctuation by weight and by norm, per layer.

    ``batch`` needs its token strings (:func:`~qkv.analysis.hooked.encode_texts` keeps them).
    """
    if batch.tokens is None:
        raise ValueError("the batch has no token strings; make it with qkv.analysis.hooked.encode_texts")
    mask = batch.attention_mask  # (B,T)
    cats = torch.full(mask.shape, 3, dtype=torch.long)
    for b, toks in enumerate(batch.tokens):
        cats[b, : len(toks)] = torch.tensor([_category(t) for t in toks])
    onehot = F.one_hot(cats, len(CATEGORIES)).double() * mask[..., None]  # (B,S,4): padding keys count nowhere
    norms = value_norms(model, batch)
    _, kept = run_with_cache(model, batch, [f"{p}.attention.weights" for p in layer_paths(model)])
    alpha, normed = [], []
    rows = mask.double()  # (B,T) the queries averaged over
    for layer, p in enumerate(layer_paths(model)):
        a = kept[f"{p}.attention.weights"].double().mean(1)  # (B,H,T,S) -> (B,T,S)
        s = norms[layer].summed  # (B,T,S)
        s = s * mask[:, None, :] / (s * mask[:, None, :]).sum(-1, keepdim=True).clamp_min(1e-30)
        for out, m in ((alpha, a), (normed, s)):
            share = torch.einsum("bts,bsc->btc", m, onehot)  # (B,T,4)
            out.append(((share * rows[..., None]).sum((0, 1)) / rows.sum()).numpy())
    token_share = (onehot.sum((0, 1)) / mask.sum()).numpy()
    return KobayashiShares(np.stack(alpha), np.stack(normed), token_share, len(batch), int(mask.sum()))

