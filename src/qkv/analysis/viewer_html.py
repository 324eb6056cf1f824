"""The single-file attention viewer: HTML + CSS + vanilla JavaScript + inline SVG, no network.

:func:`render_viewer` fills the template with the data (JSON inside a ``<script type=
"application/json">`` element; the weights as base64 uint16 per layer, decoded in the page).
DOM contract (the browser test relies on it):

* ``select#layer`` (values ``0…L-1``), ``select#head`` (values ``0…H-1`` and ``all``);
* ``svg#headview``: tokens as ``g.tok[data-side=left|right][data-i]`` (left = the attending query,
  right = the attended key); lines ``#lines line.attn[data-from][data-to][data-head][data-weight]``;
  while a token is hovered it has class ``active`` and the tokens on the other side that it attends
  to (or that attend to it) have class ``highlight`` and a ``data-weight``;
* ``#modelview canvas.thumb[data-layer][data-head]``: one heatmap per layer × head; click selects;
* ``window.qkvViewer = {state, render, data}``.
"""

from __future__ import annotations

import base64
import html
import json

import numpy as np

__all__ = ["render_viewer", "quantize_attention"]

_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;background:#fff}
#controls label{margin-right:1.2em}
#legend span{display:inline-block;margin-right:.6em;font-size:12px}
#legend i{display:inline-block;width:10px;height:10px;margin-right:3px;vertical-align:middle}
#wrap{display:flex;gap:2em;align-items:flex-start}
svg text{font-size:13px;font-family:ui-monospace,monospace;dominant-baseline:middle;cursor:default}
g.tok rect{fill:#f6ad55;fill-opacity:0}
g.tok.special text{fill:#777}
g.tok.active rect{fill:#3182ce;fill-opacity:.35}
g.tok.highlight rect{fill:#f6ad55}
line.attn{stroke-linecap:round;pointer-events:none}
#info{font-size:13px;min-width:16em;white-space:pre;font-family:ui-monospace,monospace}
#modelview{display:grid;gap:4px;margin-top:.5em}
#modelview canvas{width:64px;height:64px;image-rendering:pixelated;border:2px solid #ddd;cursor:pointer}
#modelview canvas.selected{border-color:#e53e3e}
.rowlabel{font-size:11px;align-self:center;color:#555}
</style></head><body>
<h1>Attention viewer</h1>
<p id="sub">__SUB__</p>
<div id="controls">
<label>Layer <select id="layer"></select></label>
<label>Head <select id="head"></select></label>
<label>Hide lines below <input id="minw" type="number" min="0" max="1" step="0.01" value="0.02"></label>
</div>
<div id="legend"></div>
<p style="font-size:13px;color:#555">Hover a token on the left to see where it attends; on the right to
see what attends to it. Line opacity = attention weight.</p>
<div id="wrap"><svg id="headview" xmlns="http://www.w3.org/2000/svg"></svg><div id="info"></div></div>
<h2>Model view</h2>
<p style="font-size:13px;color:#555">One heatmap per layer (rows) × head (columns); rows of a map attend
to its columns. Click one to show it above.</p>
<div id="modelview"></div>
<script type="application/json" id="qkv-data">__DATA__</script>
<script>
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("qkv-data").textContent);
  const L = D.attn.length, H = D.n_heads, T = D.tokens.length;
  // keys (right side): the queries themselves (self-attention), or other tokens (cross-attention)
  const KT = D.key_tokens || D.tokens, KSP = D.key_special || D.special, S = KT.length;
  // each layer: base64 of little-endian uint16 weights × 65535, laid out (H,T,S)
  const ATT = D.attn.map(function (b64) {
    const bin = atob(b64), u8 = new Uint8Array(bin.length);
    for (let k = 0; k < bin.length; k++) u8[k] = bin.charCodeAt(k);
    const u16 = new Uint16Array(u8.buffer), f = new Float64Array(u16.length);
    for (let k = 0; k < u16.length; k++) f[k] = u16[k] / 65535;
    return f;
  });
  function at(l, h, i, j) { return ATT[l][(h * T + i) * S + j]; }
  const NS = "http://www.w3.org/2000/svg";
  const ROW = 20, COLW = 150, GAP = 240, PAD = 8;
  const state = {layer: 0, head: 0, hover: null, minWeight: 0.02};
  const svg = document.getElementById("headview");
  const info = document.getElementById("info");
  const layerSel = document.getElementById("layer"), headSel = document.getElementById("head");
  const minw = document.getElementById("minw");

  function el(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function colour(h) { return "hsl(" + Math.round(360 * h / H) + ",70%,42%)"; }
  function y(i) { return PAD + i * ROW + ROW / 2; }

  for (let l = 0; l < L; l++) layerSel.add(new Option("layer " + (l + 1), String(l)));
  for (let h = 0; h < H; h++) headSel.add(new Option("head " + h, String(h)));
  headSel.add(new Option("all heads", "all"));

  svg.setAttribute("width", 2 * COLW + GAP);
  svg.setAttribute("height", Math.max(T, S) * ROW + 2 * PAD);
  const toks = {left: [], right: []};
  for (const side of ["left", "right"]) {
    const names = side === "left" ? D.tokens : KT, special = side === "left" ? D.special : KSP;
    for (let i = 0; i < names.length; i++) {
      const g = el("g", {"class": "tok", "data-side": side, "data-i": i}, svg);
      if (special[i]) g.classList.add("special");
      const x = side === "left" ? 0 : COLW + GAP;
      el("rect", {x: x, y: y(i) - ROW / 2 + 1, width: COLW, height: ROW - 2, rx: 3}, g);
      const t = el("text", {x: side === "left" ? COLW - 6 : x + 6, y: y(i),
                             "text-anchor": side === "left" ? "end" : "start"}, g);
      t.textContent = names[i];
      g.addEventListener("mouseenter", function () { state.hover = {side: side, i: i}; render(); });
      g.addEventListener("mouseleave", function () { state.hover = null; render(); });
      toks[side].push(g);
    }
  }
  const lines = el("g", {id: "lines"}, svg);

  function heads() { return state.head === "all" ? Array.from({length: H}, (_, h) => h) : [state.head]; }

  function render() {
    markThumbs();
    lines.replaceChildren();
    for (const side of ["left", "right"]) for (const g of toks[side]) {
      g.classList.remove("active", "highlight");
      g.removeAttribute("data-weight");
      g.querySelector("rect").style.fillOpacity = "";
    }
    const hs = heads(), hv = state.hover, l = state.layer;
    for (const h of hs) {
      const stroke = state.head === "all" ? colour(h) : "#2b6cb0";
      for (let i = 0; i < T; i++) {
        if (hv && hv.side === "left" && hv.i !== i) continue;
        for (let j = 0; j < S; j++) {
          if (hv && hv.side === "right" && hv.i !== j) continue;
          const w = at(l, h, i, j);
          if (w < state.minWeight) continue;
          el("line", {"class": "attn", x1: COLW, y1: y(i), x2: COLW + GAP, y2: y(j), stroke: stroke,
                      "stroke-width": 2, "stroke-opacity": Math.min(1, w * (hs.length > 1 ? 1.5 : 1)),
                      "data-from": i, "data-to": j, "data-head": h, "data-weight": w.toFixed(4)}, lines);
        }
      }
    }
    if (!hv) { info.textContent = "Hover a token."; return; }
    toks[hv.side][hv.i].classList.add("active");
    const other = hv.side === "left" ? "right" : "left";
    const mean = [], others = hv.side === "left" ? KT : D.tokens;
    for (let k = 0; k < others.length; k++) {
      let s = 0;
      for (const h of hs) s += hv.side === "left" ? at(l, h, hv.i, k) : at(l, h, k, hv.i);
      mean.push(s / hs.length);
    }
    mean.forEach(function (w, k) {
      if (w < state.minWeight) return;
      const g = toks[other][k];
      g.classList.add("highlight");
      g.setAttribute("data-weight", w.toFixed(4));
      g.querySelector("rect").style.fillOpacity = String(Math.min(1, 0.15 + w));
    });
    const order = mean.map((w, k) => [w, k]).sort((a, b) => b[0] - a[0]).slice(0, 8);
    info.textContent = (hv.side === "left" ? D.tokens[hv.i] + " attends to:\n" : "attending to " +
      KT[hv.i] + ":\n") + order.map(p => p[0].toFixed(3) + "  " + others[p[1]]).join("\n");
  }

  function legend() {
    const lg = document.getElementById("legend");
    lg.replaceChildren();
    if (state.head !== "all") return;
    for (let h = 0; h < H; h++) {
      const s = document.createElement("span");
      s.innerHTML = '<i style="background:' + colour(h) + '"></i>head ' + h;
      lg.appendChild(s);
    }
  }

  const mv = document.getElementById("modelview");
  mv.style.gridTemplateColumns = "4em repeat(" + H + ", 68px)";
  const thumbs = [];
  for (let l = 0; l < L; l++) {
    const lab = document.createElement("div");
    lab.className = "rowlabel"; lab.textContent = "layer " + (l + 1);
    mv.appendChild(lab);
    for (let h = 0; h < H; h++) {
      const c = document.createElement("canvas");
      c.className = "thumb"; c.width = S; c.height = T; c.title = "layer " + (l + 1) + ", head " + h;
      c.dataset.layer = l; c.dataset.head = h;
      const ctx = c.getContext("2d"), img = ctx.createImageData(S, T);
      for (let i = 0; i < T; i++) for (let j = 0; j < S; j++) {
        const v = Math.round(255 * (1 - Math.min(1, at(l, h, i, j)))), p = 4 * (i * S + j);
        img.data[p] = v; img.data[p + 1] = v; img.data[p + 2] = 255; img.data[p + 3] = 255;
      }
      ctx.putImageData(img, 0, 0);
      c.addEventListener("click", function () {
        state.layer = l; state.head = h; layerSel.value = String(l); headSel.value = String(h);
        legend(); render();
      });
      mv.appendChild(c); thumbs.push(c);
    }
  }
  function markThumbs() {
    for (const c of thumbs) {
      const on = +c.dataset.layer === state.layer && (state.head === "all" || +c.dataset.head === state.head);
      c.classList.toggle("selected", on);
    }
  }

  layerSel.addEventListener("change", function () { state.layer = +layerSel.value; render(); });
  headSel.addEventListener("change", function () {
    state.head = headSel.value === "all" ? "all" : +headSel.value; legend(); render();
  });
  minw.addEventListener("change", function () { state.minWeight = +minw.value || 0; render(); });
  window.qkvViewer = {state: state, render: render, data: D};
  legend(); render();
})();
</script>
</body></html>
"""


def quantize_attention(attn: np.ndarray) -> np.ndarray:
    """``(L,H,T,S)`` weights → little-endian uint16 ``round(w · 65535)`` (error ≤ 7.7e-6)."""
    return np.round(np.clip(np.asarray(attn, dtype=np.float64), 0, 1) * 65535).astype("<u2")


def render_viewer(tokens: list[str], special: list[bool], attn: np.ndarray, *, title: str, subtitle: str,
                  key_tokens: list[str] | None = None, key_special: list[bool] | None = None) -> str:
    """The viewer page for ``attn (L,H,T,S)``: weights travel as base64 uint16 per layer (about
    2.7 bytes per weight, a third of JSON text). Self-attention: S = T, the tokens on both sides;
    cross-attention: ``key_tokens`` (and ``key_special``) are the S attended tokens on the right."""
    q = quantize_attention(attn)
    S = len(tokens) if key_tokens is None else len(key_tokens)
    if q.ndim != 4 or q.shape[2:] != (len(tokens), S):
        raise ValueError(f"attention of shape {tuple(q.shape)} does not match {len(tokens)} query and {S} key tokens")
    layers = [base64.b64encode(q[i].tobytes()).decode("ascii") for i in range(len(q))]  # (H,T,S) each
    payload = {"tokens": tokens, "special": special, "n_heads": int(q.shape[1]), "attn": layers}
    if key_tokens is not None:
        payload.update(key_tokens=key_tokens, key_special=key_special or [False] * S)
    data = json.dumps(payload, separators=(",", ":"))
    data = data.replace("</", "<\\/")  # never close the <script> element early
    return (
        _TEMPLATE.replace("__TITLE__", html.escape(title))
        .replace("__SUB__", html.escape(subtitle))
        .replace("__DATA__", data)
    )
