"""The report pages' JavaScript, as string constants (no package data files to ship).

- `PLOT_JS`: draws every figure listed in the `hs-figures` JSON block; sets
  `window.headscopePlotted` (a promise) and `<html data-headscope="plotted">`.
- `EXPLORER_JS`: the head explorer. Reads the `hs-explorer-data` JSON block, decodes the
  selected example's uint8 patterns (base64, zlib via `DecompressionStream` when so encoded),
  and redraws the explorer on `plotly_click` in any listed figure, on the head buttons of the
  tables, and on a change of the example `<select>`. Sets `<html data-headscope="ready">`
  once the first head is drawn. Text is set with `textContent`; tokens arrive pre-escaped for
  plotly's pseudo-HTML. An example with `m`, `keyTokens` and `keyTicks` (cross-attention) is
  drawn `n` queries by `m` keys, each axis labelled with its own tokens.
"""

__all__ = ["PLOT_JS", "EXPLORER_JS"]

PLOT_JS = r"""
(function () {
  "use strict";
  var figures = JSON.parse(document.getElementById("hs-figures").textContent);
  if (typeof Plotly === "undefined") {
    document.getElementById("hs-error").textContent =
      "plotly.js did not load (a report written with plotlyjs='cdn' needs the internet).";
    window.headscopePlotted = Promise.reject(new Error("no plotly.js"));
    return;
  }
  var config = {displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
  window.headscopePlotted = Promise.all(figures.map(function (f) {
    return Plotly.newPlot(f[0], f[1].data, f[1].layout, config);
  })).then(function () { document.documentElement.dataset.headscope = "plotted"; });
})();
"""

EXPLORER_JS = r"""
(function () {
  "use strict";
  var payload = JSON.parse(document.getElementById("hs-explorer-data").textContent);
  var frame = JSON.parse(document.getElementById("hs-figures").textContent)
    .filter(function (f) { return f[0] === payload.explorer; })[0][1];
  var select = document.getElementById("hs-example");
  var title = document.getElementById("hs-explorer-title");
  var note = document.getElementById("hs-explorer-note");
  var cache = {};
  var current = payload.initial.slice();
  var drawing = 0;

  function bytesOf(b64) {
    var s = atob(b64), out = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }

  function patterns(i) {  // uint8 [layer, head, query, key] of example i
    if (!cache[i]) {
      var ex = payload.examples[i], raw = bytesOf(ex.data);
      if (ex.encoding === "zlib+base64") {
        var stream = new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate"));
        cache[i] = new Response(stream).arrayBuffer().then(function (b) { return new Uint8Array(b); });
      } else {
        cache[i] = Promise.resolve(raw);
      }
    }
    return cache[i];
  }

  function hoverText(ex) {
    if (!ex.hover) {
      var keys = ex.keyTokens || ex.tokens;  // cross-attention: the encoder's tokens
      ex.hover = ex.tokens.map(function (q, i) {
        return keys.map(function (k, j) { return "query " + i + ": " + q + "<br>key " + j + ": " + k; });
      });
    }
    return ex.hover;
  }

  function labelled(count, ticks) {  // at most ~32 labelled ticks per axis (the hover names every token)
    var step = Math.ceil(count / 32), vals = [];
    for (var t = 0; t < count; t += step) vals.push(t);
    return {tickvals: vals, ticktext: vals.map(function (t) { return ticks[t]; })};
  }

  function positions(count) {
    var out = new Array(count);
    for (var t = 0; t < count; t++) out[t] = t;
    return out;
  }

  function headTitle(layer, head) {
    var label = payload.labels[layer][head] || "no label", passing = payload.passing[layer][head];
    return "layer " + layer + " head " + head + " \u2014 " + label +
      (passing && passing !== label ? " (" + passing + ")" : "");
  }

  function highlight(layer, head) {
    Plotly.relayout(payload.labelMap, {shapes: [{type: "rect", xref: "x", yref: "y",
      x0: head - 0.5, x1: head + 0.5, y0: layer - 0.5, y1: layer + 0.5,
      line: {color: "#000", width: 2.5}}]});
  }

  function show(layer, head) {
    if (!(layer >= 0 && layer < payload.n_layers && head >= 0 && head < payload.n_heads)) return Promise.resolve();
    current = [layer, head];
    var mine = ++drawing;
    title.textContent = headTitle(layer, head);
    highlight(layer, head);
    if (!payload.examples.length) return Promise.resolve();
    // n query rows of m keys each; m is n unless the keys are other tokens (cross-attention).
    var i = Number(select.value), ex = payload.examples[i], n = ex.n, m = ex.m || ex.n;
    return patterns(i).then(function (data) {
      if (mine !== drawing) return;
      var start = (layer * payload.n_heads + head) * n * m, z = [];
      for (var q = 0; q < n; q++) {
        var row = new Array(m);
        for (var k = 0; k < m; k++) row[k] = data[start + q * m + k] / 255;
        z.push(row);
      }
      var layout = JSON.parse(JSON.stringify(frame.layout));
      Object.assign(layout.xaxis, labelled(m, ex.keyTicks || ex.ticks));
      Object.assign(layout.yaxis, labelled(n, ex.ticks));
      var trace = Object.assign({}, frame.data[0], {z: z, x: positions(m), y: positions(n), text: hoverText(ex)});
      return Plotly.react(payload.explorer, [trace], layout).then(function (gd) {
        gd.dataset.head = layer + "," + head;
        gd.dataset.example = String(i);
      });
    }).catch(function (err) {
      note.textContent = "Could not show this pattern: " + err + " (decoding needs a browser with DecompressionStream).";
    });
  }

  window.headscopePlotted.then(function () {
    payload.clickable.forEach(function (id) {
      document.getElementById(id).on("plotly_click", function (ev) {
        var p = ev.points[0];
        if (p.data.type === "heatmap") show(Number(p.y), Number(p.x));
        else if (Array.isArray(p.customdata)) show(Number(p.customdata[0]), Number(p.customdata[1]));
      });
    });
    document.querySelectorAll("button[data-layer]").forEach(function (b) {
      b.addEventListener("click", function () { show(Number(b.dataset.layer), Number(b.dataset.head)); });
    });
    select.addEventListener("change", function () { show(current[0], current[1]); });
    return show(current[0], current[1]);
  }).then(function () { document.documentElement.dataset.headscope = "ready"; });
})();
"""
