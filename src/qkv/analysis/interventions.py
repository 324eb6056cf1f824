"""Heads switched off, ranked, pruned and patched — through the ``heads`` hook point of each layer's attention.

Legend: L layers, H heads, B texts, T tokens, D head dim.

* **Ablation**: a head's output (weights · V, before the heads are merged) replaced by zeros or by its
  mean over real tokens of some texts (:func:`head_means`), in :func:`ablated`; :func:`ablation_effects`
  measures every head's ablation against the intact model.
* **Importance and pruning** (Michel et al. 2019): a gate ξ_h = 1 multiplies each head's output;
  ``I_h = E_x |∂L(x)/∂ξ_h|`` (per example, then averaged), normalised by layer (ℓ2) as in the paper;
  :func:`pruning_curve` switches heads off in order of increasing importance and evaluates.
* **Patching**: a corrupted input run with some heads' outputs taken from a clean run
  (:func:`patched`); :func:`patching_effects` scores each head by how much of the clean result its
  output alone restores. Patching every head restores every position whose own token the two inputs
  share (its residual stream sees the other tokens only through attention), e.g. ``[CLS]``.

Heads are ``(layer, head)`` pairs, both from 0 (``L{layer}H{head}``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.analysis.hooked import Batch, call, layer_paths, n_heads_of, run_with_cache
from qkv.analysis.naming import head_label
from qkv.nn.hooks import hooks

__all__ = ["Head", "head_means", "ablated", "ablation_effects", "AblationEffects", "head_importance",
           "pruning_curve", "PruningStep", "patched", "patching_effects", "classification_metrics"]

Head = tuple[int, int]
#: model → named numbers (e.g. ``{"loss": …, "accuracy": …}``); larger or smaller is better as the caller knows.
Evaluate = Callable[[nn.Module], dict[str, float]]


def _heads_point(model: nn.Module) -> list[str]:
    return [f"{p}.attention.heads" for p in layer_paths(model)]


def _check_heads(model: nn.Module, heads: Iterable[Head]) -> list[Head]:
    L, H = len(layer_paths(model)), n_heads_of(model)
    out = []
    for item in heads:
        layer, head = item
        if not (0 <= layer < L and 0 <= head < H):
            raise ValueError(f"head ({layer}, {head}) does not exist: the model has layers 0…{L - 1} and heads "
                             f"0…{H - 1}")
        out.append((int(layer), int(head)))
    return out


@torch.no_grad()
def head_means(model: nn.Module, batches: Iterable[Batch]) -> Tensor:
    """Each head's mean output over the real tokens of ``batches``: ``(L,H,D)`` (for mean-ablation)."""
    names = _heads_point(model)
    total, count = None, 0
    for batch in batches:
        _, kept = run_with_cache(model, batch, names)
        real = batch.attention_mask[:, None, :, None].to(torch.float32)  # (B,1,T,1)
        sums = torch.stack([(kept[n].float() * real).sum((0, 2)) for n in names])  # L × (H,D) -> (L,H,D)
        total = sums if total is None else total + sums
        count += int(batch.attention_mask.sum())
    if total is None or count == 0:
        raise ValueError("head_means needs at least one batch with a real token")
    return total / count


@contextmanager
def ablated(model: nn.Module, heads: Iterable[Head], *, means: Tensor | None = None) -> Iterator[None]:
    """Inside the block, ``heads`` output zeros (or their ``means`` ``(L,H,D)``, from :func:`head_means`)."""
    chosen = _check_heads(model, heads)
    names = _heads_point(model)
    by_layer: dict[int, list[int]] = {}
    for layer, head in chosen:
        by_layer.setdefault(layer, []).append(head)

    def replace(layer: int):
        idx = torch.tensor(by_layer[layer])

        def fn(t: Tensor, name: str) -> Tensor:
            t = t.clone()
            t[:, idx] = 0.0 if means is None else means[layer, idx][None, :, None, :].to(t.dtype)  # (1,h,1,D)
            return t
        return fn

    with hooks(model, {names[layer]: replace(layer) for layer in by_layer}):
        yield


@dataclass
class AblationEffects:
    """Every head ablated alone: ``base`` the intact model's numbers, ``effects[name]`` an ``(L,H)`` array of
    (ablated − intact) for each number the evaluation gives."""

    base: dict[str, float]
    effects: dict[str, np.ndarray]
    mode: str

    def ranked(self, metric: str, *, largest: bool = True) -> list[tuple[str, float]]:
        """``[("L{l}H{h}", change), …]`` sorted by the change (largest first, or smallest)."""
        v = self.effects[metric]
        order = np.argsort(-v if largest else v, axis=None)
        return [(head_label(*np.unravel_index(i, v.shape)), float(v.flat[i])) for i in order]


def ablation_effects(model: nn.Module, evaluate: Evaluate, *, means: Tensor | None = None) -> AblationEffects:
    """Run ``evaluate`` with each head ablated alone (zero, or mean with ``means``), against the intact model."""
    L, H = len(layer_paths(model)), n_heads_of(model)
    base = evaluate(model)
    effects = {k: np.zeros((L, H)) for k in base}
    for layer in range(L):
        for head in range(H):
            with ablated(model, [(layer, head)], means=means):
                got = evaluate(model)
            for k in base:
                effects[k][layer, head] = got[k] - base[k]
    return AblationEffects(base, effects, "zero" if means is None else "mean")


def head_importance(model: nn.Module, batches: Iterable[Batch], loss: Callable[[object, Batch], Tensor], *,
                    normalize: bool = True) -> np.ndarray:
    """Michel et al.'s head importance ``E_x |∂L(x)/∂ξ_h|``: ``(L,H)``.

    Args:
        loss: ``(output, batch) -> (B,)`` per-text losses (e.g. cross-entropy against the labels).
        normalize: divide each layer's scores by their ℓ2 norm (the paper's choice).
    """
    names = _heads_point(model)
    L, H = len(names), n_heads_of(model)
    total, count = np.zeros((L, H)), 0
    for batch in batches:
        gates = torch.ones(len(batch), L, H, requires_grad=True)  # one gate per text: per-example gradients

        def gate(layer: int):
            return lambda t, name: t * gates[:, layer, :, None, None].to(t.dtype)  # (B,H,T,D) * (B,H,1,1)

        with torch.enable_grad(), hooks(model, {n: gate(i) for i, n in enumerate(names)}):
            losses = loss(call(model, batch), batch)
            (grad,) = torch.autograd.grad(losses.sum(), gates)
        total += grad.abs().sum(0).double().numpy()
        count += len(batch)
    importance = total / max(count, 1)
    if normalize:
        importance = importance / np.clip(np.linalg.norm(importance, axis=1, keepdims=True), 1e-30, None)
    return importance


@dataclass
class PruningStep:
    """After switching off ``pruned`` (the least important heads first): the evaluation's numbers."""

    pruned: list[Head]
    metrics: dict[str, float]


def pruning_curve(model: nn.Module, importance: np.ndarray, evaluate: Evaluate, *,
                  fractions: Sequence[float] = tuple(i / 10 for i in range(10))) -> list[PruningStep]:
    """Prune heads in order of increasing ``importance`` ``(L,H)`` (zero-ablation) and evaluate at each of
    ``fractions`` of all heads (at least one head is always kept)."""
    L, H = importance.shape
    order = [tuple(int(x) for x in np.unravel_index(i, (L, H))) for i in np.argsort(importance, axis=None,
                                                                                      kind="stable")]
    steps = []
    for frac in fractions:
        n = min(int(round(frac * L * H)), L * H - 1)
        pruned = order[:n]
        with ablated(model, pruned):
            steps.append(PruningStep(list(pruned), evaluate(model)))
    return steps


@contextmanager
def patched(model: nn.Module, clean: Batch, heads: Iterable[Head] | None = None) -> Iterator[None]:
    """Inside the block, ``heads`` (default every head) output what they output on ``clean`` (a batch of the
    same shape as the inputs the model is then run on)."""
    names = _heads_point(model)
    chosen = _check_heads(model, heads if heads is not None else
                          [(layer, h) for layer in range(len(names)) for h in range(n_heads_of(model))])
    with torch.no_grad():
        _, cache = run_with_cache(model, clean, names)
    by_layer: dict[int, list[int]] = {}
    for layer, head in chosen:
        by_layer.setdefault(layer, []).append(head)

    def replace(layer: int):
        idx = torch.tensor(by_layer[layer])
        source = cache[names[layer]]

        def fn(t: Tensor, name: str) -> Tensor:
            if t.shape != source.shape:
                raise ValueError(f"{name}: the clean run has shape {tuple(source.shape)} but this input "
                                 f"{tuple(t.shape)}; patch inputs of the same length and batch size")
            t = t.clone()
            t[:, idx] = source[:, idx].to(t.dtype)
            return t
        return fn

    with hooks(model, {names[layer]: replace(layer) for layer in by_layer}):
        yield


@torch.no_grad()
def patching_effects(model: nn.Module, clean: Batch, corrupted: Batch, metric: Callable[[object], float]) -> np.ndarray:
    """For every head, the share of the clean-vs-corrupted difference in ``metric(output)`` that patching that
    head alone (from ``clean`` into ``corrupted``) restores: ``(L,H)``, 1 = all of it, 0 = none."""
    m_clean, m_corrupt = metric(call(model, clean)), metric(call(model, corrupted))
    gap = m_clean - m_corrupt
    if gap == 0:
        raise ValueError("the clean and corrupted inputs give the same metric: nothing to restore")
    L, H = len(layer_paths(model)), n_heads_of(model)
    out = np.zeros((L, H))
    for layer in range(L):
        for head in range(H):
            with patched(model, clean, [(layer, head)]):
                out[layer, head] = (metric(call(model, corrupted)) - m_corrupt) / gap
    return out


def classification_metrics(batches: Sequence[tuple[Batch, Tensor]]) -> Evaluate:
    """An :data:`Evaluate` of a sequence classifier: mean cross-entropy ``loss`` and ``accuracy`` over
    ``(batch, labels)`` pairs."""
    @torch.no_grad()
    def evaluate(model: nn.Module) -> dict[str, float]:
        loss, right, n = 0.0, 0, 0
        for batch, labels in batches:
            logits = call(model, batch).logits  # (B,K)
            loss += float(F.cross_entropy(logits, labels, reduction="sum"))
            right += int((logits.argmax(-1) == labels).sum())
            n += len(labels)
        return {"loss": loss / n, "accuracy": right / n}
    return evaluate
