// qkv's attention viewer, picture mode (an image model): the picture with one token's attention over its
// patches, for the layer, head (or all heads: their mean) and method chosen above. The token is the one
// hovered or pinned on the left of the head view, else the page's default (the [CLS] token or --patch);
// a click on the picture pins the patch under the pointer. Redrawn on the viewer's "qkv-render" event.
// DOM contract: canvas#picture[data-query] (the token drawn), #picture-help (what it shows).
(function () {
  "use strict";
  const V = window.qkvViewer, D = V.data, P = D.picture;
  if (!P) return;
  const canvas = document.getElementById("picture"), help = document.getElementById("picture-help");
  const R = P.size[0], W = P.size[1], rows = P.grid[0], cols = P.grid[1];
  const scale = Math.max(1, Math.floor(320 / Math.max(R, W)));
  canvas.width = W * scale; canvas.height = R * scale;
  const img = new Image();
  img.src = "data:image/png;base64," + P.png;
  function query() {
    const hv = V.state.hover || V.state.pinned;
    return hv && hv.side === "left" ? hv.i : P.query;
  }
  function weights(q) {  // per patch: the query's weight on it (all heads: their mean)
    const st = V.state, perHead = D.methods[st.method].per_head;
    const hs = !perHead ? [0] : st.head === "all" ? Array.from({length: D.n_heads}, (_, h) => h) : [st.head];
    const out = new Float64Array(rows * cols);
    for (let k = 0; k < rows * cols; k++) {
      let s = 0;
      for (const h of hs) s += V.weight(st.layer, h, q, P.prefix + k);
      out[k] = s / hs.length;
    }
    return out;
  }
  function draw() {
    const ctx = canvas.getContext("2d"), q = query(), w = weights(q);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(img, 0, 0, canvas.width, canvas.height);
    let top = 0;
    for (const v of w) top = Math.max(top, v);
    for (let k = 0; k < w.length; k++) {
      const r = Math.floor(k / cols), c = k % cols;
      ctx.fillStyle = "rgba(255,120,0," + (0.75 * w[k] / (top || 1)).toFixed(3) + ")";
      ctx.fillRect(c * P.stride[1] * scale, r * P.stride[0] * scale, P.patch[1] * scale, P.patch[0] * scale);
    }
    if (q >= P.prefix) {
      const k = q - P.prefix, r = Math.floor(k / cols), c = k % cols;
      ctx.strokeStyle = "cyan"; ctx.lineWidth = 2;
      ctx.strokeRect(c * P.stride[1] * scale, r * P.stride[0] * scale, P.patch[1] * scale, P.patch[0] * scale);
    }
    canvas.dataset.query = String(q);
    help.textContent = "The attention of " + D.tokens[q] + " over the patches (orange: weight, the largest " +
      top.toFixed(3) + " brightest). Hover or pin a token in the head view, or click a patch, to choose another.";
  }
  canvas.addEventListener("click", function (e) {
    const box = canvas.getBoundingClientRect();
    const r = Math.min(rows - 1, Math.floor((e.clientY - box.top) / scale / P.stride[0]));
    const c = Math.min(cols - 1, Math.floor((e.clientX - box.left) / scale / P.stride[1]));
    V.state.pinned = {side: "left", i: P.prefix + r * cols + c};
    V.render();
  });
  img.onload = draw;
  document.addEventListener("qkv-render", function () { if (img.complete) draw(); });
})();
