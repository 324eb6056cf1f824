"""Write an :class:`~qkv.analysis.analyze.AnalysisResult` as a report folder.

``DIR/analysis.json`` (every number), ``DIR/report.md``, ``DIR/report.html`` (self-contained: the
figures are embedded as base64 PNG, no external resource) and the figures as PNG and SVG files.
The Markdown and HTML are rendered from one list of blocks, so they always say the same thing; the
report opens with a plain-language summary drawn from the measurements (:mod:`qkv.analysis.summary`).
Layers and heads are numbered from 0 (``L0H3``); hidden state ``emb`` is the embedding output.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import numpy as np

from qkv._fs import atomic_write_text
from qkv.analysis import plots
from qkv.analysis.figures import ablation_figure
from qkv.analysis.heads import HEAD_METRICS
from qkv.analysis.naming import head_label, hidden_label, layer_label
from qkv.analysis.summary import summarize

__all__ = ["write_report", "report_blocks", "to_json"]

SHARE_THRESHOLD = 0.5  # Clark et al. single out heads that put more than half their attention somewhere


def _clean(x):
    """JSON-safe: NaN/inf → None, NumPy → Python."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def to_json(result) -> str:
    return json.dumps(_clean(result.to_dict()), indent=1)


def _f(x: float, digits: int = 3) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def _notable_heads(heads) -> list[list[str]]:
    rows = []
    for name in HEAD_METRICS[2:]:
        v = heads.metric(name)
        flat = np.argsort(-v, axis=None)[:3]
        top = ", ".join(f"{head_label(i // v.shape[1], i % v.shape[1])} ({v.flat[i]:.2f})" for i in flat)
        rows.append([plots.HEAD_TITLES[name], str(int((v > SHARE_THRESHOLD).sum())), top])
    ent = heads.entropy
    low = np.argsort(ent, axis=None)[:3]
    high = np.argsort(-ent, axis=None)[:3]
    fmt = lambda idx: ", ".join(f"{head_label(i // ent.shape[1], i % ent.shape[1])} ({ent.flat[i]:.2f})" for i in idx)
    rows.append(["lowest entropy (most focused)", "–", fmt(low)])
    rows.append(["highest entropy (broadest)", "–", fmt(high)])
    return rows


def _para(*parts: str) -> tuple[str, str]:
    return ("p", "".join(parts))


def report_blocks(result, figures: dict[str, str]) -> list[tuple]:
    """The report as blocks: ``("h1"|"h2"|"p", text)``, ``("ul", items)``, ``("table", header, rows)``,
    ``("img", file, alt)``."""
    r, ls, hs = result, result.layers, result.heads
    n = r.n_layers + 1
    names = [hidden_label(i) for i in range(n)]
    b: list[tuple] = [("h1", f"qkv analysis — {r.model or 'model'}")]
    b.append(("h2", "In short"))
    b.append(("ul", summarize(r)))
    for note in r.notes:
        b.append(_para(f"Note: {note}."))
    b.append(_para(f"Corpus {r.corpus}: {r.n_docs} documents → {r.n_contexts} contexts of at most {r.max_len} "
              f"tokens ({r.n_tokens} tokens, long texts: {r.options.long_text}). Model: {r.n_layers} layers, "
              f"{r.n_heads} heads, width {r.d_model}. Time: {r.seconds['total']:.1f} s."))
    b.append(("h2", "Layers: contextuality (Ethayarajh, 2019)"))
    b.append(_para(f"Anisotropy: mean cosine of {ls.n_tokens} sampled content tokens from different contexts. "
              f"Self-similarity: {ls.n_word_types} word types with {ls.n_occurrences} occurrences, each from a "
              f"different context. Intra-context similarity: over {ls.n_contexts} contexts. Adjusted = minus "
              "the layer's anisotropy. Row 'emb' is the embedding output, row 'L{i}' the output of layer i (layers "
              "and heads are numbered from 0)."))
    b.append(("img", figures["layers"], "similarity curves over layers"))
    b.append(("table", ["layer", "anisotropy", "self-sim", "self-sim adj.", "intra-sim", "intra-sim adj.", "norm"],
              [[names[i], _f(ls.anisotropy[i]), _f(ls.self_similarity[i]), _f(ls.self_similarity_adjusted[i]),
                _f(ls.intra_similarity[i]), _f(ls.intra_similarity_adjusted[i]), _f(ls.mean_norm[i], 2)]
               for i in range(n)]))
    b.append(("h2", "Layers: linear probes"))
    if ls.probes:
        b.append(_para("Held-out accuracy of a logistic regression per layer; splits by document, so no "
                  "context is in both training and test. " + " ".join(
                      f"{p.name}: {p.target}, {p.n_classes} classes, {p.n_test} held-out examples, "
                      f"majority-class baseline {p.chance:.3f}." for p in ls.probes.values())))
        b.append(("img", figures["probes"], "probe accuracy over layers"))
        b.append(("table", ["layer", *ls.probes],
                  [[names[i], *(_f(p.accuracy[i]) for p in ls.probes.values())] for i in range(n)]))
    else:
        b.append(_para("No probe could be fitted (too few tokens or documents)."))
    b.append(("h2", "Layers: linear CKA"))
    b.append(_para("Similarity of the representations of the same sampled tokens in two layers (1 = same up to "
              "rotation and scale)."))
    b.append(("img", figures["cka"], "CKA matrix"))
    b.append(("h2", "Heads (Clark et al., 2019)"))
    b.append(_para(f"Averages over {hs.n_queries} real query tokens (padding excluded). Uniform attention "
              f"would have entropy {hs.uniform_entropy:.2f} nats and distance {hs.uniform_distance:.1f} tokens."))
    b.append(("img", figures["heads_by_layer"], "head statistics averaged per layer"))
    b.append(("table", ["layer", *(plots.HEAD_TITLES[m] for m in HEAD_METRICS)],
              [[layer_label(i), *(_f(hs.metric(m)[i].mean(), 2 if m in ("entropy", "distance") else 3)
                              for m in HEAD_METRICS)] for i in range(r.n_layers)]))
    b.append(("img", figures["heads"], "layer × head heatmaps"))
    b.append(_para(f"Notable heads (L<layer>H<head>, value): how many heads put more than {SHARE_THRESHOLD:.0%} of "
              "their attention on a target, and the top three."))
    b.append(("table", ["statistic", f"heads > {SHARE_THRESHOLD}", "top heads"], _notable_heads(hs)))
    if r.ablation is not None:
        b.append(("h2", "Heads switched off one at a time"))
        b.append(_para(f"Each head's output set to zero alone; the {r.ablation_metric}. The heads whose attention "
                       "looks busiest are not always the ones the output needs."))
        b.append(("img", figures["ablation"], "head ablation heatmap"))
        order = np.argsort(-np.abs(r.ablation), axis=None)
        rows = [[head_label(*np.unravel_index(i, r.ablation.shape)), f"{r.ablation.flat[i]:+.4f}"] for i in order[:8]]
        b.append(("table", ["head", "change"], rows))
    if r.parity is not None:
        b.append(("h2", "Parity with the original model"))
        p = r.parity
        b.append(_para(f"Against {p['reference']} on {p['n_tokens']} tokens of the first windows: largest absolute "
                       f"difference of the {p['output']} {p['output_diff']:.1e}, of the hidden states before it "
                       f"{p['hidden_diff']:.1e}, of the attention weights {p['attention_diff']:.1e}."))
    b.append(_para("Definitions and how to read this: docs/analysis.md in the qkv repository."))
    return b


def _md(blocks) -> str:
    out = []
    for blk in blocks:
        kind = blk[0]
        if kind == "h1":
            out.append(f"# {blk[1]}\n")
        elif kind == "h2":
            out.append(f"## {blk[1]}\n")
        elif kind == "p":
            out.append(blk[1] + "\n")
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in blk[1]) + "\n")
        elif kind == "img":
            out.append(f"![{blk[2]}]({blk[1]})\n")
        elif kind == "table":
            header, rows = blk[1], blk[2]
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(row) + " |" for row in rows]
            out.append("\n".join(lines) + "\n")
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}img{max-width:100%;display:block;
margin:1em 0}h2{border-bottom:1px solid #ddd;padding-bottom:.2em}"""


def _html(blocks, folder: Path) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{e(blocks[0][1])}</title><style>{_CSS}</style></head><body>"]
    for blk in blocks:
        kind = blk[0]
        if kind in ("h1", "h2", "p"):
            out.append(f"<{kind}>{e(blk[1])}</{kind}>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{e(item)}</li>" for item in blk[1]) + "</ul>")
        elif kind == "img":
            data = base64.b64encode((folder / blk[1]).read_bytes()).decode("ascii")
            out.append(f'<img alt="{e(blk[2])}" src="data:image/png;base64,{data}">')
        elif kind == "table":
            head = "".join(f"<th>{e(h)}</th>" for h in blk[1])
            rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in blk[2])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(result, out_dir: str | Path) -> dict[str, Path]:
    """Write figures, ``analysis.json``, ``report.md`` and ``report.html`` into ``out_dir``.

    Returns the written paths by name.

    Raises:
        OSError: the folder cannot be created or written (message names it).
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"cannot create the report folder {str(out)!r}: {exc}") from exc
    figs = {
        "layers": plots.layer_curves(result.layers),
        "probes": plots.probe_curves(result.layers),
        "cka": plots.cka_heatmap(result.layers.cka),
        "heads": plots.head_heatmaps(result.heads),
        "heads_by_layer": plots.head_layer_curves(result.heads),
    }
    if result.ablation is not None:
        figs["ablation"] = ablation_figure(result.ablation, result.ablation_metric)
    paths: dict[str, Path] = {}
    for name, fig in figs.items():
        saved = plots.save_formats(fig, out / name, ("png", "svg"))
        paths[name], paths[f"{name}_svg"] = saved["png"], saved["svg"]
    blocks = report_blocks(result, {k: p.name for k, p in paths.items()})
    paths["json"] = out / "analysis.json"
    atomic_write_text(paths["json"], to_json(result))
    paths["md"] = out / "report.md"
    atomic_write_text(paths["md"], _md(blocks))
    paths["html"] = out / "report.html"
    atomic_write_text(paths["html"], _html(blocks, out))
    return paths
