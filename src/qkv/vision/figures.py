"""Figures of attention over a picture (matplotlib, no pyplot state: each function returns a ``Figure``).

Legend: L layers, H heads, U written words, K channels, R × W pixels, G grid cells (rows × columns).

A map over the patch grid is drawn over the picture at pixel resolution (:func:`pixel_map`): each
patch's weight covers the pixels of its patch (overlapping patches, stride < patch, are averaged
where they overlap), shown in a heat colour over the picture in grey. Layers and heads are numbered
from 0 (``L0H3``), as in the rest of qkv's analysis.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from qkv.config_image import ImageConfig

__all__ = ["pixel_map", "maps_over_picture", "distance_figure"]


def pixel_map(grid_weights: np.ndarray, image: ImageConfig) -> np.ndarray:
    """``(rows, cols)`` weights on the patches → ``(R, W)`` weights on the pixels (a pixel no patch
    covers is 0)."""
    ph, pw = image.patch
    sr, sc = image.strides
    out = np.zeros(image.size, dtype=np.float64)  # (R,W)
    cover = np.zeros(image.size, dtype=np.float64)
    for r in range(grid_weights.shape[0]):
        for c in range(grid_weights.shape[1]):
            out[r * sr:r * sr + ph, c * sc:c * sc + pw] += grid_weights[r, c]
            cover[r * sr:r * sr + ph, c * sc:c * sc + pw] += 1
    return out / np.maximum(cover, 1)


def _picture(ax, picture: np.ndarray) -> None:
    """``(K,R,W)`` uint8 drawn in grey (colour pictures too: the heat colours stay readable)."""
    grey = picture.mean(axis=0)  # (K,R,W) -> (R,W)
    ax.imshow(grey, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def maps_over_picture(picture: np.ndarray, maps: np.ndarray, image: ImageConfig, titles: Sequence[str], *,
                      title: str, query_cell: tuple[int, int] | None = None, columns: int = 6) -> Figure:
    """One panel per map: ``maps`` ``(M, rows, cols)`` over the ``(K,R,W)`` picture, each on its own
    colour scale (its largest weight brightest); ``query_cell`` outlines the querying patch."""
    n = len(maps)
    cols = min(columns, n)
    rows = -(-n // cols)
    fig = Figure(figsize=(1.9 * cols + 0.4, 2.0 * rows + 0.5), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for k, ax in enumerate(axes):
        if k >= n:
            ax.set_axis_off()
            continue
        _picture(ax, picture)
        heat = pixel_map(maps[k], image)  # (R,W)
        top = float(heat.max()) or 1.0
        ax.imshow(heat / top, cmap="inferno", alpha=0.6, vmin=0, vmax=1, interpolation="nearest")
        if query_cell is not None:
            r, c = query_cell
            ax.add_patch(Rectangle((c * image.strides[1] - 0.5, r * image.strides[0] - 0.5), image.patch[1],
                                   image.patch[0], fill=False, edgecolor="cyan", lw=1.5))
        ax.set_title(f"{titles[k]} (max {top:.2f})", fontsize=7)
        ax.set_gid(titles[k])
    fig.suptitle(title, fontsize=9)
    return fig


def distance_figure(distances: np.ndarray, uniform: float, *, title: str) -> Figure:
    """The ViT paper's Figure 7: ``(L,H)`` mean attention distance in pixels against the layer, one dot
    per head; a dashed line at ``uniform`` (the distance of attention spread evenly over the patches)."""
    n_l, n_h = distances.shape
    fig = Figure(figsize=(1.6 + 0.55 * n_l, 3.2), layout="constrained")
    ax = fig.subplots()
    for h in range(n_h):
        ax.scatter(np.arange(n_l), distances[:, h], s=18, label=f"H{h}")
    ax.axhline(uniform, color="grey", ls="--", lw=1, label="uniform attention")
    ax.set_xticks(range(n_l), [f"L{i}" for i in range(n_l)], fontsize=7)
    ax.set_xlabel("layer (from 0)", fontsize=8)
    ax.set_ylabel("mean attention distance (pixels)", fontsize=8)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=6, ncol=2, loc="lower right")
    ax.set_title(title, fontsize=9)
    return fig
