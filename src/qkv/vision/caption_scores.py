"""Scores of a captioner on held-out canvases: exact match and BLEU of its greedy captions against
two baselines computed on the same canvases, and how often a written item name's cross-attention
lands in that item's cell.

Legend: B canvases, L decoder layers, H heads, n written tokens, T image tokens.

* **Exact match**: the caption equals the reference word for word. **BLEU**: corpus BLEU
  (sacrebleu's defaults, :mod:`qkv.translation.metrics`) against the one reference.
* **Baselines**: the most frequent training caption written for every canvas; and the reference's
  item names without relations (``a sneaker a bag a dress``: every item named right, no relation
  said) — what BLEU gives for the names alone.
* **Attention in cell**: when the decoder writes the m-th item name of its caption, the m-th item
  of the canvas in reading order is the one it names (names past the canvas's item count are not
  counted). For that written token, the argmax of its cross-attention over the image tokens — per
  layer and head, per layer over the heads' mean, and over all layers' and heads' mean — is a hit
  when it is a patch whose centre lies inside the item's cell (the [CLS] vector is never inside).
  ``chance`` is the rate an argmax drawn uniformly over the image tokens would reach. Rates are
  given over every counted name and over the correctly named ones.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from qkv.config_image import ImageConfig
from qkv.data.canvases import CaptionSet
from qkv.data.caption_grammar import names_of_caption
from qkv.translation.metrics import bleu
from qkv.vision.caption import Captions

__all__ = ["exact_match", "text_scores", "cell_masks", "named_attention", "cell_rates", "attention_in_cell",
           "baselines", "report_markdown", "report_json"]


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Share of hypotheses equal to their reference (whitespace-normalised)."""
    if len(hypotheses) != len(references) or not references:
        raise ValueError(f"{len(hypotheses)} captions for {len(references)} references; give one per reference")
    return float(np.mean([" ".join(h.split()) == " ".join(r.split()) for h, r in zip(hypotheses, references)]))


def text_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """``{"exact_match", "bleu"}`` of ``hypotheses`` against ``references``."""
    return {"exact_match": exact_match(hypotheses, references), "bleu": bleu(list(hypotheses), list(references))}


def baselines(train: CaptionSet, test: CaptionSet) -> dict:
    """The two baselines' scores on ``test`` (see the module docstring)."""
    frequent, count = Counter(train.captions).most_common(1)[0]
    refs = list(test.captions)
    return {"most_frequent_caption": {"caption": frequent, "train_count": count,
                                      **text_scores([frequent] * len(refs), refs)},
            "names_without_relations": text_scores([names_of_caption(r, test.names) for r in refs], refs)}


def cell_masks(image: ImageConfig, cell: int) -> np.ndarray:
    """``(rows, cols, T)`` bool: which image tokens are patches whose centre lies in each cell of
    ``cell`` pixels (the [CLS] token is in none)."""
    gr, gc = image.grid
    stride = image.stride or image.patch
    cy = np.arange(gr) * stride[0] + image.patch[0] / 2  # (gr,) patch centres, pixels
    cx = np.arange(gc) * stride[1] + image.patch[1] / 2  # (gc,)
    rows, cols = image.size[0] // cell, image.size[1] // cell
    out = np.zeros((rows, cols, image.n_tokens), dtype=bool)
    for r in range(rows):
        for c in range(cols):
            inside = ((cy >= r * cell) & (cy < (r + 1) * cell))[:, None] & ((cx >= c * cell) & (cx < (c + 1) * cell))
            out[r, c, image.prefix:] = inside.reshape(-1)  # (gr,gc) -> (gr·gc,)
    return out


def named_attention(written: Captions, items: np.ndarray, names: Sequence[str],
                    masks: np.ndarray) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """The counted item names of ``written`` (see the module docstring): ``(weights (P,L,H,T) of the
    queries that wrote them, inside (P,T) bool: the named item's cell, correct (P,) bool)``.

    Args:
        written: captions with ``cross_attentions``. items: ``(B,k,3)`` the canvases' items.
        names: one word per class. masks: :func:`cell_masks`.
    """
    if written.cross_attentions is None:
        raise ValueError("attention-in-cell needs the cross-attention weights: caption with attention=True")
    ids = {n: i for i, n in enumerate(names)}
    picks, inside, correct = [], [], []
    for b, words in enumerate(written.words):
        real = items[b][items[b][:, 0] >= 0]  # (k,3) reading order
        m = 0
        for j, w in enumerate(words):
            if w not in ids:
                continue
            if m < len(real):
                picks.append((b, j))
                inside.append(masks[real[m, 1], real[m, 2]])
                correct.append(ids[w] == real[m, 0])
            m += 1
    att = written.cross_attentions  # (B,L,H,n,T)
    if not picks:
        return att.new_zeros((0, *att.shape[1:3], att.shape[-1])), np.zeros((0, att.shape[-1]), bool), np.zeros(0, bool)
    b_idx, j_idx = (torch.tensor(x) for x in zip(*picks))
    return att[b_idx, :, :, j_idx], np.stack(inside), np.array(correct)  # (P,L,H,T), (P,T), (P,)


def cell_rates(weights: torch.Tensor, inside: np.ndarray, correct: np.ndarray) -> dict:
    """The attention-in-cell rates of :func:`named_attention`'s result (see the module docstring)."""
    if len(weights) == 0:
        return {"names_counted": 0, "note": "the captions name no item: nothing to count"}
    cell = torch.from_numpy(inside)  # (P,T)

    def hit(w: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # (P',…,T) -> (P',…): argmax inside the cell
        arg = w.argmax(-1)
        where = rows.view(rows.shape[0], *([1] * (arg.dim() - 1)), -1).expand(*arg.shape, -1)  # (P',…,T)
        return torch.gather(where, -1, arg[..., None])[..., 0]

    def rates(sel: torch.Tensor) -> dict:
        if not bool(sel.any()):
            return {"names": 0}
        w, rows = weights[sel], cell[sel]  # (P',L,H,T), (P',T)
        heads = hit(w, rows).float().mean(0)  # (L,H)
        layers = hit(w.mean(2), rows).float().mean(0)  # (L,)
        overall = hit(w.mean((1, 2)), rows).float().mean()
        return {"names": int(sel.sum()), "all_layers_heads_mean": round(float(overall), 4),
                "per_layer_heads_mean": [round(float(x), 4) for x in layers],
                "per_layer_head": [[round(float(x), 4) for x in row] for row in heads], "best": _best(heads)}

    return {"names_counted": len(weights), "chance": round(float(cell.float().mean()), 4),
            "layers": weights.shape[1], "heads": weights.shape[2],
            "all_names": rates(torch.ones(len(weights), dtype=torch.bool)),
            "correct_names": rates(torch.from_numpy(correct))}


def attention_in_cell(written: Captions, data: CaptionSet, image: ImageConfig) -> dict:
    """The attention-in-cell rates of ``written`` (with ``cross_attentions``) on ``data`` (same order)."""
    return cell_rates(*named_attention(written, data.items, data.names, cell_masks(image, data.cell)))


def _best(per_head: torch.Tensor) -> dict:
    """The layer and head (1-based) with the highest rate."""
    flat = int(per_head.argmax())
    H = per_head.shape[1]
    return {"layer": flat // H + 1, "head": flat % H + 1, "rate": round(float(per_head.view(-1)[flat]), 4)}


def report_markdown(report: dict) -> str:
    """The report as a Markdown page (``report.md`` of a run folder)."""
    m, base, cell = report["model"], report["baselines"], report.get("attention_in_cell", {})
    lines = [f"# Captioning report — {report['held_out']}", "",
             f"{report['eval_canvases']} held-out canvases, each holding at least one (item, relation, item) "
             f"link no training caption has; greedy captions; trained {report['train_minutes']} min "
             f"({report['steps']} steps, {report['precision']}).", "",
             "| system | exact match | BLEU |", "|---|---:|---:|",
             f"| the model (greedy) | {m['exact_match']:.4f} | {m['bleu']:.2f} |",
             f"| most frequent training caption | {base['most_frequent_caption']['exact_match']:.4f} | "
             f"{base['most_frequent_caption']['bleu']:.2f} |",
             f"| items' names without relations | {base['names_without_relations']['exact_match']:.4f} | "
             f"{base['names_without_relations']['bleu']:.2f} |", ""]
    if cell.get("names_counted"):
        a = cell["all_names"]
        lines += ["## Attention in the named item's cell", "",
                  f"{cell['names_counted']} written item names; an argmax drawn at random lands in the cell "
                  f"{cell['chance']:.4f} of the time.", "",
                  f"Over all layers' and heads' mean: **{a['all_layers_heads_mean']:.4f}** (correctly named items "
                  f"only: {cell['correct_names'].get('all_layers_heads_mean', float('nan')):.4f}). Best head: layer "
                  f"{a['best']['layer']}, head {a['best']['head']} ({a['best']['rate']:.4f}).", "",
                  "| layer | heads' mean | " + " | ".join(f"head {h + 1}" for h in range(cell["heads"])) + " |",
                  "|---|---:|" + "---:|" * cell["heads"]]
        for i, (mean, row) in enumerate(zip(a["per_layer_heads_mean"], a["per_layer_head"])):
            lines.append(f"| {i + 1} | {mean:.4f} | " + " | ".join(f"{x:.4f}" for x in row) + " |")
        lines.append("")
    lines += ["## Examples", ""] + [f"- `{e['caption']}` — reference `{e['reference']}`" for e in report["examples"]]
    return "\n".join(lines) + "\n"


def report_json(report: dict) -> str:
    """The report as JSON text."""
    return json.dumps(report, indent=2)
