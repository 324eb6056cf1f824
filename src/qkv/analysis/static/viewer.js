// qkv's offline attention viewer: everything it shows is in the page (no network).
// DOM contract (the browser test relies on it):
//   select#method (raw, value_norm, rollout, flow — or a translation's cross, decoder, encoder: those the page
//   holds), select#layer (0…L-1),
//   select#head (0…H-1 and "all"; disabled for rollout and flow, which combine the heads);
//   svg#headview: tokens g.tok[data-side=left|right][data-i] (left: the method's queries, right: its keys — a
//   translation's cross-attention: target tokens over source tokens); lines #lines line.attn[data-from][data-to]
//   [data-head][data-weight]; a hovered (or clicked: pinned) token has class "active" and the tokens on the
//   other side it attends to (or that attend to it) class "highlight" and a data-weight; above 64 tokens lines
//   are drawn only for the hovered or pinned token;
//   canvas#matrix (queries × keys cells, rows = queries) with #info naming the cell under the pointer;
//   #modelview canvas.thumb[data-layer][data-head] (data-head "all" for rollout/flow), click selects;
//   #legend span (one per head while all heads are drawn); #ablation div.abl[data-layer][data-head][data-value];
//   #notes li; span.exports button.export[data-view][data-format];
//   table#importance (a classifier's token importance): one tr[data-i] per token, td[data-method][data-value];
//   window.qkvViewer = {state, render, data, weight(l, h, i, j), exportSVG(view), exportPNG(view) -> Promise};
//   document.body.dataset.ready = "1" once the first view is drawn.
// Layers and heads are numbered from 0: L0, L0H3.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("qkv-data").textContent);
  const L = D.n_layers, H = D.n_heads, T = D.tokens.length, GAP = 240, PAD = 8;
  const $ = function (id) { return document.getElementById(id); };
  const NS = "http://www.w3.org/2000/svg";
  // a method's queries (rows) and keys (columns): its own tokens where it has them, else the page's
  function side(m, which) { return D.methods[m][which] || {tokens: D.tokens, special: D.special}; }
  let Q, K, TQ, TK, LONG, ROW, COLW, CELL;  // the shown method's (shape())
  const state = {method: D.order[0], layer: 0, head: 0, hover: null, pinned: null, minWeight: 0.02, scale: "map"};
  const maps = {};  // method → per layer Uint16Array, laid out (H,T,T) or (T,T)

  async function inflate(b64) {  // base64 of zlib-deflated little-endian uint16
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let k = 0; k < bin.length; k++) bytes[k] = bin.charCodeAt(k);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint16Array(await new Response(stream).arrayBuffer());
  }
  async function load(method) {
    if (!maps[method]) maps[method] = await Promise.all(D.methods[method].layers.map(inflate));
    return maps[method];
  }
  function perHead(method) { return D.methods[method].per_head; }
  // the weight of query i on key j in layer l, head h (rollout and flow: the layer's one map)
  function weight(l, h, i, j, method) {
    const m = method || state.method, a = maps[m][l], tq = side(m, "queries").tokens.length;
    const tk = side(m, "keys").tokens.length;
    return (perHead(m) ? a[(h * tq + i) * tk + j] : a[i * tk + j]) / 65535;
  }
  function heads() {
    if (!perHead(state.method)) return [0];
    return state.head === "all" ? Array.from({length: H}, (_, h) => h) : [state.head];
  }
  // white → blue, the explorer's ramp
  function rgb(v) { v = Math.max(0, Math.min(1, v)); return [255 - v * 206, 255 - v * 125, 255 - v * 49].map(Math.round); }
  function hue(h) { return "hsl(" + Math.round(360 * h / H) + ",70%,42%)"; }
  function el(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function option(select, value, label) { select.add(new Option(label, String(value))); }
  function label() {
    return perHead(state.method) ? (state.head === "all" ? "L" + state.layer + " all heads" : "L" + state.layer + "H" + state.head)
      : "L0…L" + state.layer + " combined";
  }

  // ---------------------------------------------------------------- controls
  for (const m of D.order) option($("method"), m, D.titles[m]);
  for (let l = 0; l < L; l++) option($("layer"), l, "L" + l);
  for (let h = 0; h < H; h++) option($("head"), h, "H" + h);
  option($("head"), "all", "all heads");
  for (const n of D.notes) { const li = document.createElement("li"); li.textContent = n; $("notes").appendChild(li); }
  if (D.parity) $("parity").textContent = D.parity;

  // ---------------------------------------------------------------- head view
  const svg = $("headview"), matrix = $("matrix");
  function y(i) { return PAD + i * ROW + ROW / 2; }
  let toks = {left: [], right: []}, lines = null;
  function shape() {  // the head view's tokens and the matrix's size for the shown method
    Q = side(state.method, "queries"); K = side(state.method, "keys"); TQ = Q.tokens.length; TK = K.tokens.length;
    LONG = Math.max(TQ, TK) > 64; ROW = LONG ? 14 : 20; COLW = LONG ? 120 : 150;
    CELL = Math.max(1, Math.min(16, Math.floor(640 / Math.max(TQ, TK))));
    matrix.width = TK; matrix.height = TQ;
    matrix.style.width = (TK * CELL) + "px"; matrix.style.height = (TQ * CELL) + "px";
    svg.replaceChildren(); svg.classList.toggle("long", LONG); toks = {left: [], right: []};
    svg.setAttribute("width", 2 * COLW + GAP);
    svg.setAttribute("height", Math.max(TQ, TK) * ROW + 2 * PAD);
    for (const side of ["left", "right"]) tokenColumn(side, side === "left" ? Q : K);
    lines = el("g", {id: "lines"}, svg);
  }
  function tokenColumn(side, S) {
    for (let i = 0; i < S.tokens.length; i++) {
      const g = el("g", {"class": "tok", "data-side": side, "data-i": i}, svg);
      if (S.special[i]) g.classList.add("special");
      const x = side === "left" ? 0 : COLW + GAP;
      el("rect", {x: x, y: y(i) - ROW / 2 + 1, width: COLW, height: ROW - 2, rx: 3}, g);
      const t = el("text", {x: side === "left" ? COLW - 6 : x + 6, y: y(i), "text-anchor": side === "left" ? "end" : "start"}, g);
      t.textContent = S.tokens[i];
      g.addEventListener("mouseenter", function () { state.hover = {side: side, i: i}; render(); });
      g.addEventListener("mouseleave", function () { state.hover = null; render(); });
      g.addEventListener("click", function () {
        const same = state.pinned && state.pinned.side === side && state.pinned.i === i;
        state.pinned = same ? null : {side: side, i: i}; render();
      });
      toks[side].push(g);
    }
  }

  function renderHead() {
    lines.replaceChildren();
    for (const side of ["left", "right"]) for (const g of toks[side]) {
      g.classList.remove("active", "highlight", "pinned");
      g.removeAttribute("data-weight");
      g.querySelector("rect").style.fillOpacity = "";
    }
    if (state.pinned) toks[state.pinned.side][state.pinned.i].classList.add("pinned");
    const hs = heads(), hv = state.hover || state.pinned, l = state.layer, many = hs.length > 1;
    if (hv || !LONG) {
      for (const h of hs) {
        const stroke = many ? hue(h) : "#2b6cb0";
        for (let i = 0; i < TQ; i++) {
          if (hv && hv.side === "left" && hv.i !== i) continue;
          for (let j = 0; j < TK; j++) {
            if (hv && hv.side === "right" && hv.i !== j) continue;
            const w = weight(l, h, i, j);
            if (w < state.minWeight) continue;
            el("line", {"class": "attn", x1: COLW, y1: y(i), x2: COLW + GAP, y2: y(j), stroke: stroke, "stroke-width": 2,
                        "stroke-opacity": Math.min(1, w * (many ? 1.5 : 1)), "data-from": i, "data-to": j,
                        "data-head": perHead(state.method) ? h : "all", "data-weight": w.toFixed(4)}, lines);
          }
        }
      }
    }
    if (!hv) return LONG ? Math.max(TQ, TK) + " tokens: hover (or click to pin) a token to draw its lines." : "Hover a token.";
    toks[hv.side][hv.i].classList.add("active");
    const other = hv.side === "left" ? "right" : "left", mean = [];
    for (let k = 0; k < (hv.side === "left" ? TK : TQ); k++) {
      let s = 0;
      for (const h of hs) s += hv.side === "left" ? weight(l, h, hv.i, k) : weight(l, h, k, hv.i);
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
    return (hv.side === "left" ? Q.tokens[hv.i] + " attends to:\n" : "attending to " + K.tokens[hv.i] + ":\n") +
      order.map(p => p[0].toFixed(3) + "  " + (hv.side === "left" ? K : Q).tokens[p[1]]).join("\n");
  }

  // ---------------------------------------------------------------- matrix view and colour scale
  function cellValue(l, i, j) {
    const hs = heads();
    let s = 0;
    for (const h of hs) s += weight(l, h, i, j);
    return s / hs.length;
  }
  function paint(canvas, l, h, method) {  // one map into a TQ×TK canvas under the current colour scale
    const m = method || state.method, one = h === undefined ? null : h, vals = new Float32Array(TQ * TK);
    let top = 0;
    for (let i = 0; i < TQ; i++) for (let j = 0; j < TK; j++) {
      const v = one === null ? cellValue(l, i, j) : weight(l, one, i, j, m);
      vals[i * TK + j] = v; if (v > top) top = v;
    }
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(TK, TQ);
    for (let i = 0; i < TQ; i++) {
      let rowTop = 0;
      if (state.scale === "row") for (let j = 0; j < TK; j++) rowTop = Math.max(rowTop, vals[i * TK + j]);
      const hi = state.scale === "fixed" ? 1 : state.scale === "row" ? rowTop : top;
      for (let j = 0; j < TK; j++) {
        const c = rgb(hi > 0 ? vals[i * TK + j] / hi : 0), p = 4 * (i * TK + j);
        img.data[p] = c[0]; img.data[p + 1] = c[1]; img.data[p + 2] = c[2]; img.data[p + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    return top;
  }
  function renderScale(top) {
    const c = $("scale-canvas"), ctx = c.getContext("2d");
    for (let x = 0; x < c.width; x++) { const v = rgb(x / (c.width - 1)); ctx.fillStyle = "rgb(" + v + ")"; ctx.fillRect(x, 0, 1, c.height); }
    $("scale-lo").textContent = "0";
    $("scale-hi").textContent = state.scale === "fixed" ? "1" : state.scale === "row" ? "each row's largest" : top.toFixed(4);
    return state.scale === "fixed" ? 1 : top;
  }
  let matrixTop = 1;
  matrix.addEventListener("mousemove", function (e) {
    const r = matrix.getBoundingClientRect();
    const j = Math.floor((e.clientX - r.left) / r.width * TK), i = Math.floor((e.clientY - r.top) / r.height * TQ);
    if (i < 0 || j < 0 || i >= TQ || j >= TK) return;
    $("info").textContent = label() + "\nquery " + i + " " + Q.tokens[i] + " → key " + j + " " + K.tokens[j] + ": " +
      cellValue(state.layer, i, j).toFixed(4);
  });

  // ---------------------------------------------------------------- model view
  const mv = $("modelview");
  let thumbs = [];
  function buildThumbs() {
    mv.replaceChildren(); thumbs = [];
    const cols = perHead(state.method) ? H : 1;
    mv.style.gridTemplateColumns = "3em repeat(" + cols + ", 68px)";
    for (let l = 0; l < L; l++) {
      const lab = document.createElement("div");
      lab.className = "rowlabel"; lab.textContent = "L" + l; mv.appendChild(lab);
      for (let h = 0; h < cols; h++) {
        const c = document.createElement("canvas"), all = !perHead(state.method);
        c.className = "thumb"; c.width = TK; c.height = TQ;
        c.title = all ? "L0…L" + l + " combined" : "L" + l + "H" + h;
        c.dataset.layer = l; c.dataset.head = all ? "all" : h;
        paint(c, l, all ? 0 : h);
        c.addEventListener("click", function () {
          state.layer = l; $("layer").value = String(l);
          if (!all) { state.head = h; $("head").value = String(h); }
          render();
        });
        mv.appendChild(c); thumbs.push(c);
      }
    }
  }
  function markThumbs() {
    for (const c of thumbs) {
      const on = +c.dataset.layer === state.layer &&
        (c.dataset.head === "all" || state.head === "all" || +c.dataset.head === state.head);
      c.classList.toggle("selected", on);
    }
  }

  // ---------------------------------------------------------------- ablation
  function buildAblation() {
    if (!D.ablation) { $("ablation-section").hidden = true; return; }
    const A = D.ablation.values, box = $("ablation");
    let big = 0;
    for (const row of A) for (const v of row) big = Math.max(big, Math.abs(v));
    $("ablation-help").textContent = "Each head switched off alone (its output set to zero): " + D.ablation.metric +
      ". Blue: the value rises; red: it falls. Click a head to show its map.";
    box.style.gridTemplateColumns = "3em repeat(" + H + ", minmax(4em, 1fr))";
    box.appendChild(document.createElement("div"));
    for (let h = 0; h < H; h++) { const d = document.createElement("div"); d.textContent = "H" + h; box.appendChild(d); }
    for (let l = 0; l < L; l++) {
      const lab = document.createElement("div"); lab.textContent = "L" + l; box.appendChild(lab);
      for (let h = 0; h < H; h++) {
        const v = A[l][h], d = document.createElement("div"), s = big > 0 ? Math.abs(v) / big : 0;
        d.className = "abl"; d.dataset.layer = l; d.dataset.head = h; d.dataset.value = v;
        d.textContent = v.toFixed(3); d.title = "L" + l + "H" + h + " ablated: " + v.toPrecision(3);
        d.style.background = v >= 0 ? "rgba(49,130,206," + s + ")" : "rgba(229,62,62," + s + ")";
        d.addEventListener("click", function () {
          state.layer = l; state.head = h; $("layer").value = String(l); $("head").value = String(h);
          if (!perHead(state.method)) { state.method = "raw"; $("method").value = "raw"; shape(); buildThumbs(); }
          render();
        });
        box.appendChild(d);
      }
    }
  }
  function markAblation() {
    for (const d of document.querySelectorAll("#ablation div.abl")) {
      d.classList.toggle("selected", +d.dataset.layer === state.layer && +d.dataset.head === state.head);
    }
  }

  // ---------------------------------------------------------------- token importance
  function buildImportance() {
    if (!D.importance) { $("importance-section").hidden = true; return; }
    const M = D.importance.methods, names = Object.keys(M), table = $("importance");
    $("importance-help").textContent = "Each token's importance to " + D.importance.target + ", by method; each " +
      "column coloured by its largest magnitude (blue: raises it, red: lowers it). Click a token to pin it above.";
    const head = document.createElement("tr");
    for (const n of ["token"].concat(names)) { const th = document.createElement("th"); th.textContent = n; head.appendChild(th); }
    table.appendChild(head);
    const big = {};
    for (const n of names) big[n] = Math.max.apply(null, M[n].map(Math.abs)) || 1;
    for (let i = 0; i < T; i++) {
      const tr = document.createElement("tr"), tok = document.createElement("td");
      tr.dataset.i = i; tok.textContent = D.tokens[i]; tok.style.textAlign = "left"; tr.appendChild(tok);
      for (const n of names) {
        const v = M[n][i], td = document.createElement("td"), a = Math.abs(v) / big[n];
        td.dataset.method = n; td.dataset.value = v; td.textContent = v.toPrecision(3);
        td.style.background = v >= 0 ? "rgba(49,130,206," + a + ")" : "rgba(229,62,62," + a + ")";
        tr.appendChild(td);
      }
      tr.addEventListener("click", function () { state.pinned = {side: "left", i: i}; render(); });
      table.appendChild(tr);
    }
  }

  function legend() {  // one colour per head while all heads are drawn
    const lg = $("legend");
    lg.replaceChildren();
    if (state.head !== "all" || !perHead(state.method)) return;
    for (let h = 0; h < H; h++) {
      const s = document.createElement("span"), i = document.createElement("i");
      i.style.background = hue(h); s.appendChild(i); s.appendChild(document.createTextNode("H" + h)); lg.appendChild(s);
    }
  }

  // ---------------------------------------------------------------- render
  function render() {
    legend();
    $("head").disabled = !perHead(state.method);
    $("method-help").textContent = D.help[state.method];
    const text = renderHead();
    matrixTop = renderScale(paint(matrix, state.layer));
    markThumbs(); markAblation();
    $("info").textContent = text;
    document.dispatchEvent(new CustomEvent("qkv-render"));  // viewer_image.js redraws the picture
  }

  // ---------------------------------------------------------------- export (SVG, PNG)
  function esc(s) { return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;"); }
  function scaleSVG(x, y0) {  // the colour scale as 20 steps, its ends labelled
    let s = "";
    for (let k = 0; k < 20; k++) s += '<rect x="' + (x + 10 * k) + '" y="' + y0 + '" width="10" height="12" fill="rgb(' + rgb(k / 19) + ')"/>';
    return s + '<rect x="' + x + '" y="' + y0 + '" width="200" height="12" fill="none" stroke="#999"/><text x="' + x + '" y="' +
      (y0 + 26) + '" font-size="11">0</text><text x="' + (x + 200) + '" y="' + (y0 + 26) + '" font-size="11" text-anchor="end">' +
      esc(state.scale === "row" ? "row max" : matrixTop.toFixed(4)) + "</text>";
  }
  function wrapSVG(w, h, body) {
    return '<svg xmlns="http://www.w3.org/2000/svg" width="' + w + '" height="' + h + '" font-family="sans-serif">' +
      '<rect width="100%" height="100%" fill="#fff"/>' + body + "</svg>";
  }
  function exportSVG(view) {
    const title = '<text x="8" y="18" font-size="14">' + esc(D.titles[state.method] + " · " + label()) + "</text>";
    if (view === "head") {
      const clone = svg.cloneNode(true), style = document.createElementNS(NS, "style");
      style.textContent = "text{font:" + (LONG ? 10 : 13) + "px monospace;dominant-baseline:middle}g.tok rect{fill-opacity:0}" +
        "g.tok.highlight rect{fill:#f6ad55}g.tok.active rect{fill:#3182ce;fill-opacity:.35}g.tok.special text{fill:#777}";
      clone.insertBefore(style, clone.firstChild);
      clone.setAttribute("xmlns", NS);
      return new XMLSerializer().serializeToString(clone);
    }
    if (view === "matrix") {
      const w = TK * CELL, size = TQ * CELL, left = TQ <= 64 ? 90 : 10, top = 30;
      let body = title + '<image x="' + left + '" y="' + top + '" width="' + w + '" height="' + size +
        '" preserveAspectRatio="none" style="image-rendering:pixelated" href="' + matrix.toDataURL() + '"/>';
      if (TQ <= 64) for (let i = 0; i < TQ; i++) {
        body += '<text x="' + (left - 4) + '" y="' + (top + (i + 0.7) * CELL) + '" font-size="' + Math.min(11, CELL) +
          '" text-anchor="end">' + esc(Q.tokens[i]) + "</text>";
      }
      return wrapSVG(left + Math.max(w, 200) + 20, top + size + 50, body + scaleSVG(left, top + size + 8));
    }
    if (view === "model") {
      const cols = perHead(state.method) ? H : 1;
      let body = title;
      thumbs.forEach(function (c, k) {
        const l = Math.floor(k / cols), h = k % cols, x = 40 + h * 70, y0 = 30 + l * 70;
        body += '<image x="' + x + '" y="' + y0 + '" width="64" height="64" preserveAspectRatio="none" ' +
          'style="image-rendering:pixelated" href="' + c.toDataURL() + '"><title>' + esc(c.title) + "</title></image>";
        if (h === 0) body += '<text x="4" y="' + (y0 + 36) + '" font-size="11">L' + l + "</text>";
        if (l === 0 && cols > 1) body += '<text x="' + (x + 26) + '" y="27" font-size="11">H' + h + "</text>";
      });
      return wrapSVG(50 + cols * 70, 40 + L * 70 + 40, body + scaleSVG(40, 30 + L * 70));
    }
    if (view === "ablation" && D.ablation) {
      let body = '<text x="8" y="18" font-size="13">' + esc("head ablation: " + D.ablation.metric) + "</text>";
      for (const d of document.querySelectorAll("#ablation div.abl")) {
        const l = +d.dataset.layer, h = +d.dataset.head, x = 40 + h * 64, y0 = 40 + l * 24;
        body += '<rect x="' + x + '" y="' + y0 + '" width="62" height="22" fill="' + d.style.background + '" stroke="#ccc"/>' +
          '<text x="' + (x + 58) + '" y="' + (y0 + 15) + '" font-size="11" text-anchor="end">' + esc(d.textContent) + "</text>";
        if (h === 0) body += '<text x="4" y="' + (y0 + 15) + '" font-size="11">L' + l + "</text>";
        if (l === 0) body += '<text x="' + (x + 22) + '" y="36" font-size="11">H' + h + "</text>";
      }
      return wrapSVG(50 + H * 64, 50 + L * 24, body);
    }
    throw new Error("no view " + view);
  }
  function exportPNG(view) {
    const text = exportSVG(view), img = new Image();
    return new Promise(function (resolve, reject) {
      img.onload = function () {
        const c = document.createElement("canvas");
        c.width = img.width; c.height = img.height;
        c.getContext("2d").drawImage(img, 0, 0);
        resolve(c.toDataURL("image/png"));
      };
      img.onerror = function () { reject(new Error("the " + view + " view could not be drawn as PNG")); };
      img.src = "data:image/svg+xml;base64," + btoa(unescape(encodeURIComponent(text)));
    });
  }
  function download(name, href) { const a = document.createElement("a"); a.href = href; a.download = name; a.click(); }
  for (const span of document.querySelectorAll("span.exports")) {
    for (const fmt of ["svg", "png"]) {
      const b = document.createElement("button"), view = span.dataset.view;
      b.className = "export"; b.dataset.view = view; b.dataset.format = fmt; b.textContent = fmt.toUpperCase();
      b.addEventListener("click", async function () {
        const name = "qkv-" + view + "-" + state.method + "-" + label().replace(/[^A-Za-z0-9]+/g, "_") + "." + fmt;
        if (fmt === "svg") download(name, URL.createObjectURL(new Blob([exportSVG(view)], {type: "image/svg+xml"})));
        else download(name, await exportPNG(view));
      });
      span.appendChild(b);
    }
  }

  // ---------------------------------------------------------------- wiring
  async function setMethod(m) {
    await load(m);
    state.method = m; state.hover = state.pinned = null; shape(); buildThumbs(); render();
  }
  $("method").addEventListener("change", function () { setMethod($("method").value); });
  $("layer").addEventListener("change", function () { state.layer = +$("layer").value; render(); });
  $("head").addEventListener("change", function () {
    state.head = $("head").value === "all" ? "all" : +$("head").value; render();
  });
  $("scale").addEventListener("change", function () { state.scale = $("scale").value; buildThumbs(); render(); });
  $("minw").addEventListener("change", function () { state.minWeight = +$("minw").value || 0; render(); });
  window.qkvViewer = {state: state, render: render, data: D, weight: weight, exportSVG: exportSVG, exportPNG: exportPNG,
                      setMethod: setMethod};
  Promise.all(D.order.map(load)).then(function () {
    shape(); buildThumbs(); buildAblation(); buildImportance(); render();
    document.body.dataset.ready = "1";
  });
})();
