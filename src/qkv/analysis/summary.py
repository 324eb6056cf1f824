"""The plain-language summary at the top of ``qkv analyze``'s report: a few sentences, each drawn from a
measurement of the report (nothing is said that a number below does not show).

Legend: L layers, H heads. Layers and heads from 0 (:mod:`qkv.analysis.naming`).
"""

from __future__ import annotations

import numpy as np

from qkv.analysis.naming import head_label, hidden_label, layer_label

__all__ = ["summarize", "FOCUS_SHARE"]

#: a head "attends mainly" to a target when more than this share of its attention goes there
FOCUS_SHARE = 0.5
_TARGETS = (("sep_share", "[SEP]"), ("cls_share", "[CLS]"), ("prev_share", "the previous token"),
            ("next_share", "the next token"), ("self_share", "itself"))


def _heads(mask: np.ndarray, values: np.ndarray, k: int = 3) -> str:
    idx = np.argwhere(mask)
    order = sorted(idx.tolist(), key=lambda lh: -values[lh[0], lh[1]])[:k]
    return ", ".join(f"{head_label(a, b)} {values[a, b]:.2f}" for a, b in order)


def _layers(mask: np.ndarray) -> str:
    counts = mask.sum(1)
    busy = [layer_label(i) for i in np.argsort(-counts, kind="stable") if counts[i] > 0][:3]
    return ", ".join(busy)


def _contextuality(ls) -> list[str]:
    out = []
    adj = np.asarray(ls.self_similarity_adjusted, dtype=float)
    if np.isfinite(adj).all() and len(adj) > 1:
        lo = int(np.argmin(adj[1:])) + 1
        out.append(f"Token vectors depend on their context most after {hidden_label(lo)}: a word's vectors in "
                   f"different contexts agree {adj[lo]:.2f} above the anisotropy baseline there, against "
                   f"{adj[0]:.2f} at the embeddings (self-similarity − anisotropy).")
    an = np.asarray(ls.anisotropy, dtype=float)
    if np.isfinite(an).all():
        hi = int(np.argmax(an))
        out.append(f"All token vectors share a common direction most at {hidden_label(hi)} (mean cosine of random "
                   f"pairs {an[hi]:.2f}; {an[0]:.2f} at the embeddings).")
    return out


def _probes(ls) -> list[str]:
    out = []
    for name, p in ls.probes.items():
        acc = np.asarray(p.accuracy, dtype=float)
        best = int(np.argmax(acc))
        what = {"token": "which token it is", "position": "where the token is",
                "label": "the document's label"}.get(name, name)
        out.append(f"A linear probe reads {what} best at {hidden_label(best)} ({acc[best]:.2f}; majority class "
                   f"{p.chance:.2f}; {acc[-1]:.2f} at the last layer).")
    return out


def _attention(hs) -> list[str]:
    out = []
    ent = hs.entropy.mean(1)
    out.append(f"Attention is broadest in {layer_label(int(np.argmax(ent)))} (mean entropy {ent.max():.2f} nats; "
               f"uniform attention would have {hs.uniform_entropy:.2f}) and most focused in "
               f"{layer_label(int(np.argmin(ent)))} ({ent.min():.2f}).")
    total = hs.n_layers * hs.n_heads
    parts = []
    for metric, target in _TARGETS:
        v = hs.metric(metric)
        mask = v > FOCUS_SHARE
        if mask.any():
            parts.append(f"{int(mask.sum())} on {target} ({_heads(mask, v)}; mostly in {_layers(mask)})")
    if parts:
        out.append(f"Of the {total} heads, these put more than half of their attention on one place: "
                   + "; ".join(parts) + ".")
    else:
        out.append(f"None of the {total} heads puts more than half of its attention on [CLS], [SEP], itself or a "
                   "neighbour.")
    sep = hs.metric("sep_share") > FOCUS_SHARE
    if sep.any():
        out.append("Heads parked on [SEP] often pass on little: compare their value-norm view in qkv inspect "
                   "(Kobayashi et al. 2020), and their ablation below.")
    return out


def _ablation(effects: np.ndarray | None, metric: str) -> list[str]:
    if effects is None:
        return []
    mag = np.abs(effects)
    top = np.unravel_index(int(np.argmax(mag)), mag.shape)
    small = float(np.quantile(mag, 0.5))
    return [f"Switching off {head_label(*top)} alone changes the output most ({effects[top]:+.3f}, {metric}); "
            f"half of the heads change it by less than {small:.3f} each."]


def summarize(result) -> list[str]:
    """A few sentences on what the layers and heads of the analysed model do, from ``result``'s numbers
    (an :class:`~qkv.analysis.analyze.AnalysisResult`)."""
    r = result
    out = [f"{r.model or 'The model'}: {r.n_layers} layers × {r.n_heads} heads, width {r.d_model}, measured on "
           f"{r.n_contexts} windows ({r.n_tokens} tokens) of {r.corpus}."]
    out += _contextuality(r.layers) + _probes(r.layers) + _attention(r.heads)
    out += _ablation(r.ablation, r.ablation_metric)
    if r.parity is not None:
        out.append(f"qkv's numbers match the original model ({r.parity['reference']}) to "
                   f"{r.parity['output_diff']:.1e} (largest difference of the {r.parity['output']}), so the maps "
                   "are the original's.")
    return out
