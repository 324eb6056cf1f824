"""Figures of the analysis (matplotlib, no pyplot state: each function returns a ``Figure``).

Legend: L layers, H heads, T tokens.

Layers and heads are numbered from 0 (``L0``, ``L0H3``), as the model's module paths are; hidden
state ``emb`` is the embedding output, ``L{i}`` the output of layer i. Every heatmap has a colour
scale; each head's axes carry its label as SVG id (``gid``), so an SVG export names every head.
:func:`save` writes PNG or SVG (text kept as text) by the file's suffix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from qkv._fs import atomic_file
from qkv.analysis.heads import HEAD_METRICS, HeadStats
from qkv.analysis.naming import head_label, hidden_label, layer_label
from qkv.analysis.layers import LayerStats

__all__ = [
    "layer_curves",
    "probe_curves",
    "cka_heatmap",
    "head_heatmaps",
    "head_layer_curves",
    "attention_grid",
    "attention_overview",
    "save",
    "save_formats",
    "FORMATS",
]

#: The image formats every figure can be written in.
FORMATS = ("png", "svg")

HEAD_TITLES = {
    "entropy": "attention entropy (nats)",
    "distance": "attended distance (tokens)",
    "cls_share": "share on [CLS]",
    "sep_share": "share on [SEP]",
    "self_share": "share on itself",
    "prev_share": "share on previous token",
    "next_share": "share on next token",
}


def _layer_axis(ax, n: int) -> None:
    ax.set_xticks(range(n))
    ax.set_xticklabels([hidden_label(i) for i in range(n)])
    ax.set_xlabel("after layer (emb = embedding output)")
    ax.grid(alpha=0.3)


def layer_curves(stats: LayerStats) -> Figure:
    """Ethayarajh-style curves: raw similarities with the anisotropy baseline, adjusted ones, norms."""
    n = len(stats.anisotropy)
    x = np.arange(n)
    fig = Figure(figsize=(13, 3.8), layout="constrained")
    a, b, c = fig.subplots(1, 3)
    a.plot(x, stats.anisotropy, "k--o", label="anisotropy (random pairs)")
    a.plot(x, stats.self_similarity, "-o", label="self-similarity")
    a.plot(x, stats.intra_similarity, "-s", label="intra-context similarity")
    a.set_title("raw mean cosine")
    b.plot(x, stats.self_similarity_adjusted, "-o", label="self-similarity − anisotropy")
    b.plot(x, stats.intra_similarity_adjusted, "-s", label="intra-context − anisotropy")
    b.axhline(0, color="grey", lw=0.8)
    b.set_title("anisotropy-adjusted")
    c.plot(x, stats.mean_norm, "-o", color="tab:purple")
    c.set_title("mean token-vector norm")
    for ax in (a, b, c):
        _layer_axis(ax, n)
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    return fig


def probe_curves(stats: LayerStats) -> Figure:
    """Held-out probe accuracy per layer, with each probe's majority-class baseline dashed."""
    n = len(stats.anisotropy)
    fig = Figure(figsize=(6.5, 3.8), layout="constrained")
    ax = fig.subplots()
    for i, (name, p) in enumerate(stats.probes.items()):
        colour = f"C{i}"
        ax.plot(np.arange(n), p.accuracy, "-o", color=colour, label=f"{name}: {p.target}")
        ax.axhline(p.chance, color=colour, ls="--", lw=0.9)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("held-out accuracy (dashed: majority class)")
    ax.set_title("linear probes")
    _layer_axis(ax, n)
    if stats.probes:
        ax.legend(fontsize=7, loc="lower left")
    return fig


def cka_heatmap(cka: np.ndarray) -> Figure:
    """Linear CKA between every pair of layers ``(L+1,L+1)``, annotated."""
    n = len(cka)
    fig = Figure(figsize=(1.0 + 0.6 * n, 0.6 + 0.6 * n), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(cka, vmin=0, vmax=1, cmap="viridis")
    labels = [hidden_label(i) for i in range(n)]
    ax.set_xticks(range(n), labels)
    ax.set_yticks(range(n), labels)
    if n <= 16:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{cka[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if cka[i, j] < 0.6 else "black")
    ax.set_title("linear CKA between layers")
    fig.colorbar(im, ax=ax, shrink=0.8)
    return fig


def head_heatmaps(heads: HeadStats, metrics: Sequence[str] = HEAD_METRICS) -> Figure:
    """One layer × head heatmap per metric (rows: layers L0…, columns: heads H0…)."""
    n_l, n_h = heads.n_layers, heads.n_heads
    cols = 4
    rows = -(-len(metrics) // cols)
    fig = Figure(figsize=(cols * (1.2 + 0.28 * n_h), rows * (1.0 + 0.32 * n_l)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    for ax, name in zip(axes, metrics):
        values = heads.metric(name)  # (L,H)
        share = name.endswith("_share")
        im = ax.imshow(values, cmap="magma", aspect="auto", vmin=0, vmax=1 if share else None)
        ax.set_title(HEAD_TITLES[name], fontsize=9)
        ax.set_xticks(range(n_h), [f"H{h}" for h in range(n_h)], fontsize=6)
        ax.set_yticks(range(n_l), [layer_label(i) for i in range(n_l)], fontsize=7)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        fig.colorbar(im, ax=ax, shrink=0.85)
    for ax in axes[len(metrics):]:
        ax.set_axis_off()
    return fig


def head_layer_curves(heads: HeadStats) -> Figure:
    """Per-layer means over heads: entropy and distance against the uniform-attention baselines,
    and the special-token and neighbour shares."""
    n = heads.n_layers
    x = np.arange(n)
    fig = Figure(figsize=(13, 3.6), layout="constrained")
    a, b, c = fig.subplots(1, 3)
    for ax, name, base in ((a, "entropy", heads.uniform_entropy), (b, "distance", heads.uniform_distance)):
        v = heads.metric(name)
        ax.plot(x, v.mean(1), "-o", label="mean over heads")
        ax.fill_between(x, v.min(1), v.max(1), alpha=0.2, label="min–max over heads")
        ax.axhline(base, color="k", ls="--", lw=0.9, label="uniform attention")
        ax.set_title(HEAD_TITLES[name])
        ax.legend(fontsize=7)
    for name in HEAD_METRICS[2:]:
        c.plot(x, heads.metric(name).mean(1), "-o", label=HEAD_TITLES[name])
    c.set_title("mean share over heads")
    c.set_ylim(0, 1)
    c.legend(fontsize=7)
    for ax in (a, b, c):
        ax.set_xticks(x, [layer_label(i) for i in range(n)])
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    return fig


def attention_grid(attn: np.ndarray, tokens: Sequence[str], layer: int, *, key_tokens: Sequence[str] | None = None,
                   kind: str = "attention") -> Figure:
    """All heads of one layer as heatmaps: ``attn (H,T,S)``, rows = queries (``tokens``), columns =
    keys (``key_tokens``, default ``tokens``: self-attention); ``kind`` names the map in the title
    (e.g. ``"cross-attention"``: decoder rows over source columns)."""
    n_h, t, s = attn.shape
    keys = tokens if key_tokens is None else key_tokens
    cols = min(n_h, 4)
    rows = -(-n_h // cols)
    side = 1.6 + 0.11 * min(max(t, s), 48)  # labels stop at 40 tokens; beyond, about a pixel per token
    fig = Figure(figsize=(cols * side, rows * side + 0.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    show_labels = max(t, s) <= 40
    im = None
    for h, ax in enumerate(axes):
        if h >= n_h:
            ax.set_axis_off()
            continue
        im = ax.imshow(attn[h], cmap="Blues", vmin=0, vmax=1)
        ax.set_title(head_label(layer, h), fontsize=8)
        ax.set_gid(head_label(layer, h))
        if show_labels:  # token names on the outer axes only (each text costs its layout)
            last_row = h + cols >= n_h
            ax.set_xticks(range(s), keys if last_row else [], rotation=90, fontsize=5)
            ax.set_yticks(range(t), tokens if h % cols == 0 else [], fontsize=5)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    if im is not None:
        fig.colorbar(im, ax=list(axes), shrink=0.6, label="weight")
    fig.suptitle(f"{layer_label(layer)}: {kind} (rows attend to columns)")
    return fig


def attention_overview(attn: np.ndarray) -> Figure:
    """Every layer × head attention map as a small heatmap: ``attn (L,H,T,T)``."""
    n_l, n_h = attn.shape[:2]
    fig = Figure(figsize=(0.9 * n_h + 0.6, 0.9 * n_l + 0.5), layout="constrained")
    axes = np.array(fig.subplots(n_l, n_h, squeeze=False))
    im = None
    for layer in range(n_l):
        for h in range(n_h):
            ax = axes[layer, h]
            im = ax.imshow(attn[layer, h], cmap="Blues", vmin=0, vmax=1)
            ax.set_gid(head_label(layer, h))
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"H{h}", fontsize=7)
            if h == 0:
                ax.set_ylabel(layer_label(layer), fontsize=7)
    if im is not None:
        fig.colorbar(im, ax=list(axes.ravel()), shrink=0.6, label="weight")
    fig.suptitle("attention maps: layers (rows) × heads (columns)", fontsize=9)
    return fig


def save(fig: Figure, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` as PNG or SVG (by ``path``'s suffix; SVG keeps text as text)."""
    path = Path(path)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "qkv"}), atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".").lower() or "png")
    return path


def save_formats(fig: Figure, stem: str | Path, formats=("png",), dpi: int = 110) -> dict[str, Path]:
    """Write ``fig`` as ``stem.png`` / ``stem.svg`` for each of ``formats``: ``{format: path}``."""
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ValueError(f"image formats must be among {', '.join(FORMATS)}, got {list(formats)}")
    out = {}
    for f in formats:
        out[f] = save(fig, Path(f"{stem}.{f}"), dpi)
        fig.set_layout_engine("none")  # laid out once: the next format reuses the positions
    return out
