"""Figures of a lab grid: every seed's score per variant (``accuracy.png``) and the attention of two
variants on one held-out row, side by side (``attention.png``: one row of panels per variant and
layer, one panel per head; token names on the axes when the row is short).

Legend: L layers, H heads, T sequence length.
"""

from __future__ import annotations

import json
from pathlib import Path

from qkv._fs import atomic_file
from qkv.lab.grid import LabGrid, parse_metric
from qkv.lab.encoder_config import EncoderTaskConfig
from qkv.models.builders import build_masked_lm
from qkv.analysis.capture import forward
from qkv.lab.encoder_config import EVAL_SEED
import torch

__all__ = ["plot_scores", "plot_attention_maps", "load_run_model"]

_MAX_LABELLED = 40  # tokens per axis that still get their names


def _pyplot():
    import matplotlib  # lazy: matplotlib takes 0.4–0.6 s to import (python -X importtime); only plotting needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def plot_scores(grid: LabGrid, rows: list[dict], values: dict, chosen: dict, path: Path) -> Path | None:
    """Each variant's score in every seed (dots), its mean (bar) and the chance level (dashed)."""
    if not values:
        return None
    plt = _pyplot()
    names = list(values)
    fig, ax = plt.subplots(figsize=(max(4.5, 0.9 * len(names) + 2), 4), dpi=110)
    for i, name in enumerate(names):
        seeds = sorted(values[name])
        ys = [values[name][s] for s in seeds]
        ax.bar(i, sum(ys) / len(ys), color="#c6dbef", edgecolor="#4a6f8a", width=0.6)
        diverged = {r["seed"] for r in rows if r["cell"] == chosen[name] and r["diverged"]}
        for j, (s, y) in enumerate(zip(seeds, ys)):
            x = i + (j - (len(ys) - 1) / 2) * 0.12
            ax.plot(x, y, "x" if s in diverged else "o", color="#08306b", ms=5)
    chance = rows[0]["chance"]
    ax.axhline(chance, color="#b22222", ls="--", lw=1, label=f"chance {chance:.3f}")
    ax.set_xticks(range(len(names)), names, rotation=30 if len(names) > 4 else 0, ha="right" if len(names) > 4 else "center")
    kind, length = parse_metric(grid.metric)
    ax.set_ylabel(("token" if kind == "accuracy" else "sequence") + " exact match"
                  + (f" at length {length}" if length else ""))
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{grid.name}: every seed (o; x = diverged), bar = mean", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def load_run_model(out: Path, cell: str):
    """``(model, EncoderTaskConfig)`` of seed 0 of ``cell`` in the lab folder ``out``, or ``None`` when its
    weights are not there."""
    run = out / "runs" / cell / "seed0.json"
    state = run.with_suffix(".pt")
    if not (run.exists() and state.exists()):
        return None
    config = EncoderTaskConfig.from_dict(json.loads(run.read_text(encoding="utf-8"))["config"])
    model = build_masked_lm(config.model_config())
    model.load_state_dict(torch.load(state, map_location="cpu", weights_only=True))
    return model.eval(), config


def plot_attention_maps(grid: LabGrid, out: Path, cells: list[str], labels: list[str], path: Path) -> Path | None:
    """The attention of seed 0 of each cell on the same held-out row (the metric's length)."""
    loaded = [load_run_model(Path(out), c) for c in cells]
    if any(x is None for x in loaded):
        return None
    _, length = parse_metric(grid.metric)
    task = loaded[0][1].build_task()
    batch = task.batch(0, 1, EVAL_SEED) if length is None else task.batch(0, 1, EVAL_SEED, length=length)
    n = int(batch.attention_mask[0].sum())
    ids = batch.input_ids[0, :n].tolist()
    names = [task.vocab[i] for i in ids]
    maps = []
    for model, _ in loaded:
        _, attn = forward(model, batch.input_ids, batch.attention_mask)  # (L,B,H,T,T)
        maps.append(attn[:, 0, :, :n, :n].float().numpy())  # (L,H,n,n)
    rows = sum(m.shape[0] for m in maps)
    cols = max(m.shape[1] for m in maps)
    plt = _pyplot()
    size = 2.6 if n <= _MAX_LABELLED else 2.2
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols + 0.8, size * rows + 0.6), dpi=110, squeeze=False)
    r = 0
    for label, m in zip(labels, maps):
        for layer in range(m.shape[0]):
            for h in range(cols):
                ax = axes[r][h]
                if h >= m.shape[1]:
                    ax.axis("off")
                    continue
                im = ax.imshow(m[layer, h], vmin=0, vmax=1, cmap="viridis")
                ax.set_title(f"{label} · L{layer}H{h}", fontsize=7)  # layers and heads from 0, as everywhere
                if n <= _MAX_LABELLED:
                    ax.set_xticks(range(n), names, rotation=90, fontsize=5)
                    ax.set_yticks(range(n), names, fontsize=5)
                else:
                    ax.set_xticks([])
                    ax.set_yticks([])
            r += 1
    fig.suptitle(f"{grid.name}: attention on one held-out row (rows: queries, columns: keys)", fontsize=9)
    fig.tight_layout()
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="attention weight")  # after the layout: beside it
    _save(fig, path)
    plt.close(fig)
    return path
