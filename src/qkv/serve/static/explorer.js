// qkv attention explorer: talks to the server that served this page, nothing else.
// DOM contract (the browser test relies on it):
//   select#model, textarea#text, button#run; #tokens span.tok[data-i] (class "active" while hovered);
//   select#method, select#layer, select#head; canvas#heatmap[data-layer][data-head] (cell (i, j) of
//   size data-cell px at (data-left + j·cell, data-top + i·cell) painted rgb(255 − w·206, 255 − w·125, 255 − w·49));
//   #thumbs canvas.thumb[data-layer][data-head]; #predictions li[data-token][data-probability];
//   #hits li[data-rank]; #generation; #error; document.body.dataset.runs counts finished runs;
//   window.qkvExplorer = {state, weight(l, h, i, j), run, generate}.
// Text from the server is put into the page with textContent only, never as HTML.
(function () {
  "use strict";
  const $ = function (id) { return document.getElementById(id); };
  const state = {models: {}, model: null, tokens: [], special: [], weights: null, nLayers: 0, nHeads: 0,
                 layer: 0, head: 0, hover: null, index: null, runs: 0};

  async function api(path, body) {
    const options = body === undefined ? {} :
      {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
    const response = await fetch(path, options);
    const data = await response.json().catch(function () { return {}; });
    if (!response.ok) {
      throw new Error((data.error && data.error.message) || (response.status + " " + response.statusText));
    }
    return data;
  }

  function setStatus(text) { $("status").textContent = text; }
  function showError(message) {
    const box = $("error");
    box.textContent = box.hidden ? message : box.textContent + "\n" + message;
    box.hidden = false;
  }
  function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); }
  function option(select, value, label) {
    const o = document.createElement("option");
    o.value = String(value);
    o.textContent = label;
    select.appendChild(o);
  }

  // little-endian uint16 × 65535 per layer, laid out (H, T, T)
  function decodeLayer(b64) {
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let k = 0; k < bin.length; k++) bytes[k] = bin.charCodeAt(k);
    const view = new DataView(bytes.buffer), out = new Float64Array(bytes.length / 2);
    for (let k = 0; k < out.length; k++) out[k] = view.getUint16(2 * k, true) / 65535;
    return out;
  }
  function weight(l, h, i, j) {
    const T = state.tokens.length;
    return state.weights[l][(h * T + i) * T + j];
  }
  function color(w) {
    return "rgb(" + Math.round(255 - w * 206) + "," + Math.round(255 - w * 125) + "," + Math.round(255 - w * 49) + ")";
  }

  function paint(canvas, l, h, cell, left, top) {
    const T = state.tokens.length, ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    for (let i = 0; i < T; i++) {
      for (let j = 0; j < T; j++) {
        ctx.fillStyle = color(weight(l, h, i, j));
        ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
      }
    }
  }

  function renderHeatmap() {
    const canvas = $("heatmap"), T = state.tokens.length;
    const cell = Math.max(8, Math.min(28, Math.floor(560 / Math.max(T, 1))));
    const ctx = canvas.getContext("2d");
    ctx.font = "12px monospace";
    let label = 0;
    for (const t of state.tokens) label = Math.max(label, ctx.measureText(t).width);
    const margin = Math.min(140, Math.ceil(label) + 8);
    canvas.width = margin + T * cell + 2;
    canvas.height = margin + T * cell + 2;
    Object.assign(canvas.dataset, {layer: state.layer, head: state.head, cell: cell, left: margin, top: margin});
    paint(canvas, state.layer, state.head, cell, margin, margin);
    ctx.fillStyle = "#222";
    ctx.font = "12px monospace";
    ctx.textBaseline = "middle";
    for (let i = 0; i < T; i++) {
      ctx.textAlign = "right";
      ctx.fillText(state.tokens[i], margin - 4, margin + i * cell + cell / 2, margin - 6);
      ctx.save();
      ctx.translate(margin + i * cell + cell / 2, margin - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(state.tokens[i], 0, 0, margin - 6);
      ctx.restore();
    }
    if (state.hover !== null) {
      ctx.strokeStyle = "#e53e3e";
      ctx.strokeRect(margin, margin + state.hover * cell, T * cell, cell);
    }
  }

  function renderTokens() {
    const box = $("tokens");
    clear(box);
    state.tokens.forEach(function (tok, i) {
      const span = document.createElement("span");
      span.className = "tok" + (state.special[i] ? " special" : "");
      span.dataset.i = String(i);
      span.textContent = tok;
      span.addEventListener("mouseenter", function () { state.hover = i; highlight(); renderHeatmap(); });
      span.addEventListener("mouseleave", function () { state.hover = null; highlight(); renderHeatmap(); });
      box.appendChild(span);
    });
  }

  function highlight() {
    const spans = $("tokens").querySelectorAll("span.tok"), info = $("info");
    spans.forEach(function (span, j) {
      span.classList.toggle("active", j === state.hover);
      span.style.backgroundColor = state.hover === null ? "" : color(weight(state.layer, state.head, state.hover, j));
    });
    if (state.hover === null) { info.textContent = ""; return; }
    const row = state.tokens.map(function (t, j) { return [weight(state.layer, state.head, state.hover, j), t]; });
    row.sort(function (a, b) { return b[0] - a[0]; });
    info.textContent = "layer " + state.layer + ", head " + state.head + ": " + state.tokens[state.hover] +
      " attends to\n" + row.slice(0, 8).map(function (r) { return r[0].toFixed(3) + "  " + r[1]; }).join("\n");
  }

  function renderThumbs() {
    const box = $("thumbs");
    clear(box);
    box.style.gridTemplateColumns = "3em repeat(" + state.nHeads + ", 68px)";
    for (let l = 0; l < state.nLayers; l++) {
      const lab = document.createElement("span");
      lab.className = "rowlabel";
      lab.textContent = "L" + l;
      box.appendChild(lab);
      for (let h = 0; h < state.nHeads; h++) {
        const c = document.createElement("canvas");
        c.className = "thumb";
        c.width = c.height = state.tokens.length;
        c.dataset.layer = String(l);
        c.dataset.head = String(h);
        c.title = "layer " + l + ", head " + h;
        paint(c, l, h, 1, 0, 0);
        c.addEventListener("click", function () { select(l, h); });
        box.appendChild(c);
      }
    }
    markThumbs();
  }
  function markThumbs() {
    $("thumbs").querySelectorAll("canvas.thumb").forEach(function (c) {
      c.classList.toggle("selected", +c.dataset.layer === state.layer && +c.dataset.head === state.head);
    });
  }
  function select(l, h) {
    state.layer = l;
    state.head = h;
    $("layer").value = String(l);
    $("head").value = String(h);
    markThumbs();
    highlight();
    renderHeatmap();
  }

  function showAttention(data) {
    state.tokens = data.tokens;
    state.special = data.special;
    state.nLayers = data.n_layers;
    state.nHeads = data.n_heads;
    state.weights = data.attention.map(decodeLayer);
    state.hover = null;
    state.layer = Math.min(state.layer, state.nLayers - 1);
    state.head = Math.min(state.head, state.nHeads - 1);
    clear($("method"));
    data.methods.forEach(function (m) { option($("method"), m, m === "attention" ? "attention weights" : m); });
    clear($("layer"));
    for (let l = 0; l < state.nLayers; l++) option($("layer"), l, String(l));
    clear($("head"));
    for (let h = 0; h < state.nHeads; h++) option($("head"), h, String(h));
    $("attention-panel").hidden = false;
    renderTokens();
    renderThumbs();
    select(state.layer, state.head);
  }

  function showPredictions(data) {
    const list = $("predictions");
    clear(list);
    data.data[0].predictions.forEach(function (p) {
      const li = document.createElement("li");
      li.dataset.token = p.token;
      li.dataset.probability = String(p.probability);
      li.textContent = p.token;
      const prob = document.createElement("span");
      prob.className = "prob";
      prob.textContent = p.probability.toFixed(4);
      li.appendChild(prob);
      list.appendChild(li);
    });
    $("fill-panel").hidden = false;
  }

  function showHits(data) {
    const list = $("hits");
    clear(list);
    data.data[0].hits.forEach(function (h) {
      const li = document.createElement("li");
      li.dataset.rank = String(h.rank);
      const score = document.createElement("span");
      score.className = "score";
      score.textContent = h.score.toFixed(4) + "  " + String(h.id);
      const doc = document.createElement("span");
      doc.className = "doc";
      doc.textContent = h.text.length > 400 ? h.text.slice(0, 400) + "…" : h.text;
      li.appendChild(doc);
      li.appendChild(score);
      list.appendChild(li);
    });
  }

  function endpoints() { return (state.models[state.model] || {}).endpoints || []; }

  async function run() {
    const text = $("text").value;
    $("error").hidden = true;
    $("error").textContent = "";
    setStatus("running…");
    const has = endpoints();
    $("fill-panel").hidden = true;
    $("generate-panel").hidden = !has.includes("/v1/completions");
    const jobs = [];
    if (has.includes("/v1/attention")) {
      jobs.push(api("/v1/attention", {model: state.model, input: text, truncate: true}).then(showAttention));
    }
    if (has.includes("/v1/fill-mask") && text.split("[MASK]").length === 2) {
      jobs.push(api("/v1/fill-mask", {model: state.model, input: text, top_k: 10}).then(showPredictions));
    }
    const query = text.replace("[MASK]", " ").trim();
    if (state.index && query) {
      jobs.push(api("/v1/search", {query: query, k: 5}).then(showHits));
    }
    const results = await Promise.allSettled(jobs);
    results.forEach(function (r) { if (r.status === "rejected") showError(r.reason.message); });
    state.runs += 1;
    document.body.dataset.runs = String(state.runs);
    setStatus("");
  }

  async function generate() {
    const out = $("generation");
    clear(out);
    const prompt = document.createElement("span");
    prompt.className = "prompt";
    prompt.textContent = $("text").value;
    out.appendChild(prompt);
    const body = {model: state.model, prompt: $("text").value, max_tokens: +$("max-tokens").value || 30,
                  temperature: +$("temperature").value || 0, stream: true};
    try {
      const response = await fetch("/v1/completions", {method: "POST", headers: {"Content-Type": "application/json"},
                                                       body: JSON.stringify(body)});
      if (!response.ok) {
        const data = await response.json().catch(function () { return {}; });
        throw new Error((data.error && data.error.message) || String(response.status));
      }
      const reader = response.body.getReader(), decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const part = await reader.read();
        if (part.done) break;
        buffer += decoder.decode(part.value, {stream: true});
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const event = buffer.slice(0, cut).replace(/^data: /, "");
          buffer = buffer.slice(cut + 2);
          if (event === "[DONE]") continue;
          const data = JSON.parse(event);
          if (data.error) throw new Error(data.error.message);
          if (data.choices && data.choices.length) out.appendChild(document.createTextNode(data.choices[0].text));
        }
      }
    } catch (e) {
      showError(e.message);
    }
    out.dataset.done = "1";
  }

  async function init() {
    try {
      const models = (await api("/v1/models")).data;
      models.forEach(function (m) { state.models[m.id] = m; option($("model"), m.id, m.id); });
      state.model = models.length ? models[0].id : null;
      $("kind").textContent = state.model ? state.models[state.model].kind : "no model";
    } catch (e) {
      showError(e.message);
      return;
    }
    try {
      state.index = await api("/v1/index");
      $("index-info").textContent = state.index.documents + " documents";
      $("search-panel").hidden = false;
    } catch (e) {
      state.index = null;  // no index given at start
    }
    $("generate-panel").hidden = !endpoints().includes("/v1/completions");
    document.body.dataset.ready = "1";
  }

  $("model").addEventListener("change", function () {
    state.model = $("model").value;
    $("kind").textContent = state.models[state.model].kind;
    $("generate-panel").hidden = !endpoints().includes("/v1/completions");
  });
  $("run").addEventListener("click", run);
  $("generate").addEventListener("click", generate);
  $("layer").addEventListener("change", function () { select(+$("layer").value, state.head); });
  $("head").addEventListener("change", function () { select(state.layer, +$("head").value); });
  window.qkvExplorer = {state: state, weight: weight, run: run, generate: generate};
  init();
})();
