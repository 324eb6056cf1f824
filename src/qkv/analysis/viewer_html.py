"""The single-file attention viewer: HTML + CSS + vanilla JavaScript + inline SVG and canvas, no network.

:func:`render_viewer` fills the page template (``static/viewer.html``, ``viewer.css``, ``viewer.js``,
files of the package) with the data: JSON inside a ``<script type="application/json">`` element; each
method's maps per layer as base64 of zlib-deflated little-endian uint16 ``round(w · 65535)`` (error
≤ 7.7e-6), inflated in the page by the browser's own ``DecompressionStream``. The page's DOM contract
is written at the top of ``viewer.js`` (the browser test relies on it).

Methods: ``raw`` and ``value_norm`` hold ``(L,H,T,T)`` maps, ``rollout`` and ``flow`` ``(L,T,T)``
(see :mod:`qkv.analysis.inspect_methods`). A translation (``qkv inspect`` of an encoder–decoder) has
the views ``cross`` ``(L,H,T,S)`` — each target token over the source tokens —, ``decoder``
``(L,H,T,T)`` and ``encoder`` ``(L,H,S,S)``: a method whose queries or keys are not the page's
tokens names its own (``queries`` / ``keys``: ``(tokens, special)``).

With a ``picture`` (``qkv inspect`` of an image model) the tokens are the [CLS] token and the
patches, and the page also shows the picture with the selected token's attention over its patches
(``static/viewer_image.js``, which redraws on the viewer's ``qkv-render`` event).
"""

from __future__ import annotations

import base64
import html
import json
import re
import zlib
from importlib.resources import files

import numpy as np

__all__ = ["render_viewer", "quantize_attention", "encode_maps", "METHOD_HELP"]

_STATIC = files("qkv.analysis") / "static"
_ORDER = ("raw", "value_norm", "rollout", "flow", "cross", "decoder", "encoder")
_TITLES = {"raw": "raw attention", "value_norm": "value-norm weighted", "rollout": "attention rollout",
           "flow": "attention flow", "cross": "cross-attention (target × source)",
           "decoder": "decoder self-attention", "encoder": "encoder self-attention"}
#: What each method shows, in one sentence (the viewer prints it under the controls).
METHOD_HELP = {
    "raw": "Raw attention: each head's softmax weights α (rows sum to 1).",
    "value_norm": "Value-norm weighted (Kobayashi et al. 2020): ‖α·f(x)‖, the weight times the norm of what the "
                  "key token actually sends through the head; each row shown as shares of its sum.",
    "rollout": "Attention rollout (Abnar & Zuidema 2020): the heads averaged, the residual added (0.5·A + 0.5·I) and "
               "layers 0…ℓ multiplied — how much each output position draws from each input token.",
    "flow": "Attention flow (Abnar & Zuidema 2020): the maximum flow from each position after layer ℓ to each input "
            "token through the layers' graph (capacities 0.5·A + 0.5·I), rows normalised.",
    "cross": "Cross-attention: each decoder position (row: its input → the token it predicts) over the source "
             "tokens (columns); rows sum to 1.",
    "decoder": "Decoder self-attention (causal): each decoder position over the target tokens before it and itself.",
    "encoder": "Encoder self-attention: each source token over the source tokens.",
}


_PICTURE_SECTION = ('<section id="picture-section"><h2>Attention over the picture</h2>'
                    '<p class="help" id="picture-help"></p><canvas id="picture"></canvas></section>')


def quantize_attention(attn: np.ndarray) -> np.ndarray:
    """Weights in [0, 1] → little-endian uint16 ``round(w · 65535)`` (error ≤ 7.7e-6), same shape."""
    return np.round(np.clip(np.asarray(attn, dtype=np.float64), 0, 1) * 65535).astype("<u2")


def encode_maps(maps: np.ndarray) -> list[str]:
    """``(L, …)`` maps → per layer base64 of the zlib-deflated uint16 quantisation."""
    q = quantize_attention(maps)
    return [base64.b64encode(zlib.compress(q[i].tobytes(), 6)).decode("ascii") for i in range(len(q))]


def render_viewer(tokens: list[str], special: list[bool], attn: np.ndarray | None, *, title: str, subtitle: str,
                  maps: dict[str, np.ndarray] | None = None, notes: list[str] | tuple[str, ...] = (),
                  ablation: tuple[np.ndarray, str] | None = None, parity: str | None = None,
                  importance: tuple[dict[str, np.ndarray], str] | None = None, picture: dict | None = None,
                  axes: dict[str, dict[str, tuple[list[str], list[bool]]]] | None = None) -> str:
    """The viewer page for ``attn (L,H,T,T)`` and the other methods' ``maps``.

    Args:
        tokens, special: the T tokens and which are special (drawn grey).
        attn: ``(L,H,T,T)`` raw attention weights (``None``: a translation's page, ``maps`` only).
        maps: more methods: ``value_norm`` ``(L,H,T,T)`` (rows summing to 1), ``rollout`` / ``flow`` ``(L,T,T)``;
            a translation's ``cross`` ``(L,H,T,S)``, ``decoder`` ``(L,H,T,T)``, ``encoder`` ``(L,H,S,S)``.
        axes: per method, its ``queries`` and/or ``keys`` as ``(tokens, special)`` where they are not
            ``tokens`` (e.g. ``{"cross": {"keys": (source, special)}}``).
        notes: lines shown above the views (e.g. why a method is missing).
        ablation: ``((L,H) changes, what they measure)`` of switching each head off, or ``None``.
        importance: ``({method: (T,) scores}, what they are the importance to)`` of each token, or ``None``.
        parity: one line on how far the numbers are from the original model's, or ``None``.
        picture: for an image model, ``{"png": base64 PNG, "size": [R, W], "grid": [rows, cols], "patch",
            "stride", "prefix": tokens before the patches, "query": the token shown by default}``.
    """
    every = {**({} if attn is None else {"raw": np.asarray(attn)}), **(maps or {})}
    order = [m for m in _ORDER if m in every]
    if not order:
        raise ValueError("render_viewer needs attention maps: give attn or maps")
    L, H = every[order[0]].shape[:2]
    methods = {m: {"per_head": every[m].ndim == 4, "layers": encode_maps(every[m])} for m in order}
    for m, sides in (axes or {}).items():
        for which, (toks, spec) in sides.items():
            if which not in ("queries", "keys"):
                raise ValueError(f"axes[{m!r}] names {which!r}; allowed: queries, keys")
            methods[m][which] = {"tokens": list(toks), "special": [bool(x) for x in spec]}
    data = {
        "tokens": list(tokens), "special": [bool(s) for s in special], "n_layers": int(L), "n_heads": int(H),
        "order": order, "titles": {m: _TITLES[m] for m in order}, "help": {m: METHOD_HELP[m] for m in order},
        "methods": methods,
        "encoding": "deflate-uint16-base64", "notes": list(notes), "parity": parity,
        "ablation": None if ablation is None else {"values": np.asarray(ablation[0]).round(6).tolist(),
                                                   "metric": ablation[1]},
        "importance": None if not importance or not importance[0] else {
            "methods": {m: np.asarray(v, dtype=np.float64).round(8).tolist() for m, v in importance[0].items()},
            "target": importance[1]},
        "picture": picture,
    }
    text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")  # never close the <script> early
    page = (_STATIC / "viewer.html").read_text(encoding="utf-8")
    parts = {"__TITLE__": html.escape(title), "__SUB__": html.escape(subtitle),
             "__CSS__": (_STATIC / "viewer.css").read_text(encoding="utf-8"),
             "__JS__": (_STATIC / "viewer.js").read_text(encoding="utf-8"), "__DATA__": text,
             "__PICTURE__": _PICTURE_SECTION if picture else "",
             "__PICTUREJS__": (_STATIC / "viewer_image.js").read_text(encoding="utf-8") if picture else ""}
    return re.sub("__(TITLE|SUB|CSS|JS|DATA|PICTURE|PICTUREJS)__", lambda m: parts[m.group(0)], page)  # one pass: the template only
