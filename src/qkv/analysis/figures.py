"""Figures of the interpretability methods (matplotlib, no pyplot state: each function returns a ``Figure``).

Legend: L layers, H heads, T tokens. Numbering from 0 (:mod:`qkv.analysis.naming`); every heatmap has a
colour scale, and the axes of each map carry its name as SVG id.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from qkv.analysis.inspect_methods import METHOD_TITLES
from qkv.analysis.naming import head_label, layer_label

__all__ = ["importance_figure", "method_figure", "ablation_figure", "similarity_figure", "head_grid_figure", "abnar_figure", "michel_figure",
           "kobayashi_figure"]


def _token_ticks(ax, rows: Sequence[str] | None, cols: Sequence[str] | None, limit: int = 40) -> None:
    """Token names on an axis (``None``: none there; none either beyond ``limit`` tokens)."""
    ax.set_xticks([])
    ax.set_yticks([])
    if cols is not None and len(cols) <= limit:
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=5)
    if rows is not None and len(rows) <= limit:
        ax.set_yticks(range(len(rows)), rows, fontsize=5)


def method_figure(tokens: Sequence[str], maps: dict[str, np.ndarray], layers: Sequence[int] | None = None) -> Figure:
    """One row per method (raw attention averaged over heads, value norms likewise, rollout, flow), one
    column per layer: ``maps[m]`` is ``(L,H,T,T)`` or ``(L,T,T)``."""
    methods = [m for m in METHOD_TITLES if m in maps]
    n_l = next(iter(maps.values())).shape[0]
    layers = list(range(n_l)) if layers is None else list(layers)
    t = len(tokens)
    side = 1.4 + 0.05 * min(t, 48)  # bounded: a 512-token text stays a figure of a few inches per map
    fig = Figure(figsize=(len(layers) * side + 1.2, len(methods) * side + 0.6), layout="constrained")
    axes = np.array(fig.subplots(len(methods), len(layers), squeeze=False))
    im = None
    for r, m in enumerate(methods):
        for c, layer in enumerate(layers):
            a = maps[m][layer]
            a = a.mean(0) if a.ndim == 3 else a  # (H,T,T) -> (T,T)
            ax = axes[r, c]
            im = ax.imshow(a, cmap="Blues", vmin=0, vmax=1)
            ax.set_gid(f"{m}-{layer_label(layer)}")
            _token_ticks(ax, tokens if c == 0 else None, tokens if r == len(methods) - 1 else None, limit=24)
            if r == 0:
                ax.set_title(layer_label(layer), fontsize=8)
            if c == 0:
                ax.set_ylabel(METHOD_TITLES[m].split(" (")[0], fontsize=7)
    fig.colorbar(im, ax=list(axes.ravel()), shrink=0.6, label="share (rows sum to 1)")
    fig.suptitle("one text, four views (rows attend to columns; heads averaged)", fontsize=9)
    return fig


def ablation_figure(effects: np.ndarray, metric: str) -> Figure:
    """``(L,H)`` changes of switching each head off, a diverging colour scale centred on 0."""
    n_l, n_h = effects.shape
    big = float(np.abs(effects).max()) or 1.0
    fig = Figure(figsize=(1.5 + 0.55 * n_h, 1.2 + 0.45 * n_l), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(effects, cmap="RdBu", vmin=-big, vmax=big, aspect="auto")
    ax.set_xticks(range(n_h), [f"H{h}" for h in range(n_h)], fontsize=7)
    ax.set_yticks(range(n_l), [layer_label(i) for i in range(n_l)], fontsize=7)
    if n_l * n_h <= 200:
        for i in range(n_l):
            for h in range(n_h):
                ax.text(h, i, f"{effects[i, h]:.2g}", ha="center", va="center", fontsize=5, gid=head_label(i, h))
    fig.colorbar(im, ax=ax, shrink=0.85, label="change when switched off")
    ax.set_title(f"head ablation: {metric}", fontsize=8, wrap=True)
    return fig


def similarity_figure(tokens_a: Sequence[str], tokens_b: Sequence[str], contributions: np.ndarray,
                      cosine: float) -> Figure:
    """The token-pair contributions to an embedding cosine (they sum to it)."""
    big = float(np.abs(contributions).max()) or 1.0
    fig = Figure(figsize=(max(4.8, 1.6 + 0.16 * len(tokens_b)), max(3.0, 1.4 + 0.16 * len(tokens_a))),
                 layout="constrained")  # wide enough for the title
    ax = fig.subplots()
    im = ax.imshow(contributions, cmap="RdBu", vmin=-big, vmax=big, aspect="auto")
    _token_ticks(ax, tokens_a, tokens_b, limit=80)
    ax.set_xlabel("text b")
    ax.set_ylabel("text a")
    fig.colorbar(im, ax=ax, shrink=0.85, label="contribution to the cosine")
    ax.set_title(f"cosine {cosine:.4f} = the sum of these contributions", fontsize=9)
    return fig


def head_grid_figure(values: np.ndarray, title: str, label: str, *, cmap: str = "magma",
                     marks: Sequence[tuple[int, int]] = ()) -> Figure:
    """Any ``(L,H)`` per-head number as a heatmap (``marks``: heads outlined, e.g. the pruned ones)."""
    n_l, n_h = values.shape
    fig = Figure(figsize=(1.5 + 0.5 * n_h, 1.2 + 0.42 * n_l), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(values, cmap=cmap, aspect="auto")
    ax.set_xticks(range(n_h), [f"H{h}" for h in range(n_h)], fontsize=7)
    ax.set_yticks(range(n_l), [layer_label(i) for i in range(n_l)], fontsize=7)
    for layer, head in marks:
        ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="cyan", lw=1.5))
    fig.colorbar(im, ax=ax, shrink=0.85, label=label)
    ax.set_title(title, fontsize=9)
    return fig


def abnar_figure(result) -> Figure:
    """Per layer, the rank correlation of raw attention, rollout and flow with blank-out importance
    (an :class:`~qkv.analysis.findings.AbnarZuidema`), ± one standard deviation over texts."""
    fig = Figure(figsize=(5.2, 3.4), layout="constrained")
    ax = fig.subplots()
    n = len(next(iter(result.mean.values())))
    x = np.arange(n)
    for view, mean in result.mean.items():
        ax.errorbar(x, mean, yerr=result.std[view], marker="o", capsize=3, label=view)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(x, [layer_label(i) for i in range(n)])
    ax.set_xlabel("layer (rollout and flow: through layers 0…ℓ)")
    ax.set_ylabel("Spearman ρ with blank-out importance")
    ax.set_ylim(-1, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{result.n_texts} texts, rows read: {result.queries}", fontsize=9)
    return fig


def michel_figure(result) -> Figure:
    """Accuracy against the number of heads pruned, least important first (a
    :class:`~qkv.analysis.findings.MichelPruning`); the band is the 1-point tolerance."""
    fig = Figure(figsize=(5.2, 3.4), layout="constrained")
    ax = fig.subplots()
    total = result.importance.size
    ax.plot(result.counts, result.accuracy, marker="o", ms=3)
    base = result.accuracy[0]
    ax.axhspan(base - result.tolerance, base, color="tab:green", alpha=0.15, label=f"within {result.tolerance:.0%}")
    ax.axvline(result.prunable, color="tab:green", ls="--", lw=1, label=f"{result.prunable} of {total} heads")
    ax.set_xlabel(f"heads pruned (of {total}), least important first")
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def kobayashi_figure(result) -> Figure:
    """Per layer, the share of attention on [CLS], [SEP] and punctuation by weight α (solid) and by norm
    ‖αf(x)‖ (dashed) (a :class:`~qkv.analysis.findings.KobayashiShares`)."""
    fig = Figure(figsize=(5.6, 3.4), layout="constrained")
    ax = fig.subplots()
    n = len(result.alpha)
    x = np.arange(n)
    for c, (name, colour) in enumerate(zip(("[CLS]", "[SEP]", "punctuation"), ("tab:blue", "tab:red", "tab:green"))):
        ax.plot(x, result.alpha[:, c], color=colour, marker="o", ms=3, label=f"{name} α")
        ax.plot(x, result.norm[:, c], color=colour, marker="s", ms=3, ls="--", label=f"{name} ‖αf‖")
    ax.set_xticks(x, [layer_label(i) for i in range(n)])
    ax.set_xlabel("layer")
    ax.set_ylabel("share of a query's attention")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=3)
    return fig


def importance_figure(tokens: Sequence[str], importance: dict[str, np.ndarray], what: str) -> Figure:
    """One row of bars per method: each token's importance ``(T,)``, scaled by the method's largest
    magnitude (blue: raises ``what``, red: lowers it)."""
    n = len(importance)
    t = len(tokens)
    fig = Figure(figsize=(max(7.0, 1.5 + 0.22 * min(t, 120)), 0.6 + 1.25 * n), layout="constrained")
    axes = np.atleast_1d(fig.subplots(n, 1, sharex=True))
    x = np.arange(t)
    for ax, (name, v) in zip(axes, importance.items()):
        v = np.asarray(v, dtype=np.float64)
        big = float(np.abs(v).max()) or 1.0
        ax.bar(x, v / big, color=np.where(v >= 0, "tab:blue", "tab:red"), width=0.8)
        ax.set_gid(name)
        ax.axhline(0, color="grey", lw=0.6)
        ax.set_ylim(-1.05, 1.05)
        ax.set_ylabel(name, fontsize=7, rotation=0, ha="right", va="center")
        ax.set_yticks([-1, 0, 1], ["−max", "0", f"{big:.2g}"], fontsize=6)
    axes[-1].set_xticks(x, list(tokens) if t <= 120 else [""] * t, rotation=90, fontsize=6)
    fig.suptitle(f"token importance to {what}\n(each row scaled by its largest magnitude)", fontsize=8)
    return fig
