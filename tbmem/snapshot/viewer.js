/* tbmem offline snapshot viewer. No network access, no third-party code.
 * Every string from the snapshot reaches the page through textContent only. */
(function () {
  "use strict";
  var PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
                 "#ff9da7", "#9c755f", "#bab0ac", "#2f4b7c", "#a05195"];
  var INTERNAL = ["/torch/", "\\torch\\", "/tbmem/", "\\tbmem\\", "<frozen", "/phiml/", "/phi/"];
  var D = JSON.parse(document.getElementById("tbmem-data").textContent);
  var A = D.allocs, nA = A.size.length, nE = D.n_events, nC = D.categories.length;
  var start = Int32Array.from(A.start), end = Int32Array.from(A.end), size = Float64Array.from(A.size);
  var cat = Int32Array.from(A.category), stack = Int32Array.from(A.stack);
  var timeUs = Float64Array.from(D.time_us);
  // event -> allocation, sign: one pass, so the timeline is a prefix sum over events
  var evAlloc = new Int32Array(nE), evSign = new Int8Array(nE);
  for (var i = 0; i < nA; i++) {
    if (start[i] >= 0) { evAlloc[start[i]] = i; evSign[start[i]] = 1; }
    if (end[i] >= 0) { evAlloc[end[i]] = i; evSign[end[i]] = -1; }
  }
  var catOn = new Uint8Array(nC).fill(1), minSize = 0;
  var canvas = document.getElementById("timeline"), ctx = canvas.getContext("2d");
  var tooltip = document.getElementById("tooltip"), details = document.getElementById("details");
  var M = null; // the current aggregation
  var PAD_L = 70, PAD_B = 22, PAD_T = 8, PAD_R = 8;

  function fmtBytes(n) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], k = 0;
    while (Math.abs(n) >= 1024 && k < u.length - 1) { n /= 1024; k++; }
    return (k === 0 ? n.toFixed(0) : n.toFixed(2)) + " " + u[k];
  }
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function frame(fid) {
    var f = D.frames[fid];
    return {file: D.strings[f[0]], line: f[1], name: D.strings[f[2]]};
  }
  function isInternal(file) {
    for (var k = 0; k < INTERNAL.length; k++) if (file.indexOf(INTERNAL[k]) >= 0) return true;
    return false;
  }
  function userFrame(sid) {
    if (sid < 0) return null;
    var fr = D.stacks[sid];
    for (var k = 0; k < fr.length; k++) { var f = frame(fr[k]); if (!isInternal(f.file)) return f; }
    return fr.length ? frame(fr[0]) : null;
  }
  function frameText(f) { return f ? f.name + " (" + f.file + ":" + f.line + ")" : "(no stack)"; }
  function included(a) { return catOn[cat[a]] === 1 && size[a] >= minSize; }

  // Aggregate events into one column per pixel: each column keeps the state at its highest total,
  // so the drawn peak is exact whatever the number of events.
  function aggregate(nb) {
    var cur = new Float64Array(nC), total = 0;
    for (var a = 0; a < nA; a++) if (start[a] < 0 && included(a)) { cur[cat[a]] += size[a]; total += size[a]; }
    var cols = Math.max(1, Math.min(nb, nE)), colCat = new Float64Array(cols * nC);
    var colTotal = new Float64Array(cols), colEvent = new Int32Array(cols), best = -1, peakEv = -1, peak = total;
    if (nE === 0) { colCat.set(cur, 0); colTotal[0] = total; colEvent[0] = -1; }
    var col = 0, colEnd = Math.ceil(nE / cols), colStart = 0;
    for (var e = 0; e < nE; e++) {
      while (e >= colEnd) { col++; colStart = colEnd; colEnd = Math.ceil((col + 1) * nE / cols); best = -1; }
      var al = evAlloc[e];
      if (included(al)) { var d = evSign[e] * size[al]; cur[cat[al]] += d; total += d; }
      if (total > best || e === colStart) {
        best = total; colTotal[col] = total; colEvent[col] = e;
        for (var c = 0; c < nC; c++) colCat[col * nC + c] = cur[c];
      }
      if (total > peak || peakEv < 0) { peak = total; peakEv = e; }
    }
    var ymax = 0;
    for (var k = 0; k < cols; k++) if (colTotal[k] > ymax) ymax = colTotal[k];
    return {cols: cols, colCat: colCat, colTotal: colTotal, colEvent: colEvent, ymax: ymax || 1,
            peak: peak, peakEvent: peakEv};
  }

  function plotW() { return canvas.width - PAD_L - PAD_R; }
  function plotH() { return canvas.height - PAD_T - PAD_B; }

  function draw() {
    var rect = canvas.getBoundingClientRect(), dpr = window.devicePixelRatio || 1;
    canvas.width = Math.max(300, Math.round(rect.width * dpr));
    canvas.height = Math.max(200, Math.round(rect.height * dpr));
    M = aggregate(plotW());
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    var w = plotW() / M.cols, h = plotH(), sy = h / M.ymax;
    for (var k = 0; k < M.cols; k++) {
      var y = PAD_T + h, x = PAD_L + k * w;
      for (var c = 0; c < nC; c++) {
        var v = M.colCat[k * nC + c] * sy;
        if (v <= 0) continue;
        ctx.fillStyle = PALETTE[c % PALETTE.length];
        ctx.fillRect(x, y - v, Math.max(w, 1), v);
        y -= v;
      }
    }
    ctx.strokeStyle = "#999"; ctx.beginPath();
    ctx.moveTo(PAD_L, PAD_T); ctx.lineTo(PAD_L, PAD_T + h); ctx.lineTo(PAD_L + plotW(), PAD_T + h); ctx.stroke();
    ctx.fillStyle = "#333"; ctx.font = (11 * dpr) + "px sans-serif"; ctx.textAlign = "right";
    for (var t = 0; t <= 4; t++) {
      var val = M.ymax * t / 4;
      ctx.fillText(fmtBytes(val), PAD_L - 4, PAD_T + h - val * sy + 4);
    }
    ctx.textAlign = "left"; ctx.fillText("event 0", PAD_L, canvas.height - 6);
    ctx.textAlign = "right"; ctx.fillText("event " + Math.max(nE - 1, 0), PAD_L + plotW(), canvas.height - 6);
    renderPeak();
  }

  function aliveAt(ev) {
    var out = [];
    for (var a = 0; a < nA; a++)
      if (start[a] <= ev && (end[a] < 0 || end[a] > ev) && included(a)) out.push(a);
    return out;
  }

  function showStack(a, into) {
    into.textContent = "";
    var f = userFrame(stack[a]);
    into.appendChild(el("div", fmtBytes(size[a]) + "  " + D.categories[cat[a]] +
      (start[a] < 0 ? "  (allocated before recording)" : "  allocated at event " + start[a]) +
      (end[a] < 0 ? ", still alive" : ", freed at event " + end[a])));
    if (stack[a] < 0) { into.appendChild(el("div", "(no stack recorded)")); return; }
    var fr = D.stacks[stack[a]];
    for (var k = 0; k < fr.length; k++) {
      var g = frame(fr[k]);
      into.appendChild(el("div", frameText(g), f && g.file === f.file && g.line === f.line && g.name === f.name
        ? "frame user" : "frame"));
    }
  }

  function renderPeak() {
    var body = document.querySelector("#peak tbody");
    body.textContent = "";
    var alive = aliveAt(M.peakEvent);
    alive.sort(function (x, y) { return size[y] - size[x]; });
    document.getElementById("peaktitle").textContent = "Allocations alive at the peak (" + fmtBytes(M.peak) +
      ", event " + M.peakEvent + ", " + alive.length + " allocations" + (alive.length > 200 ? ", largest 200" : "") + ")";
    alive.slice(0, 200).forEach(function (a) {
      var tr = document.createElement("tr");
      tr.appendChild(el("td", fmtBytes(size[a])));
      tr.appendChild(el("td", D.categories[cat[a]]));
      tr.appendChild(el("td", frameText(userFrame(stack[a]))));
      tr.addEventListener("click", function () { showStack(a, details); });
      body.appendChild(tr);
    });
  }

  // The allocation under (px, py): bands are stacked by category, allocations within a band by age.
  function hit(px, py) {
    if (!M || px < PAD_L || px > PAD_L + plotW()) return null;
    var k = Math.min(M.cols - 1, Math.floor((px - PAD_L) / plotW() * M.cols));
    var v = (PAD_T + plotH() - py) / plotH() * M.ymax, base = 0, c = -1;
    for (var cc = 0; cc < nC; cc++) {
      var s = M.colCat[k * nC + cc];
      if (s > 0 && v >= base && v < base + s) { c = cc; break; }
      base += s;
    }
    var res = {col: k, event: M.colEvent[k], total: M.colTotal[k], value: v, alloc: -1};
    if (c < 0) return res;
    var alive = aliveAt(res.event), acc = base;
    for (var j = 0; j < alive.length; j++) {
      var a = alive[j];
      if (cat[a] !== c) continue;
      if (v < acc + size[a]) { res.alloc = a; break; }
      acc += size[a];
    }
    return res;
  }

  var pending = null;
  function onMove(ev) {
    var r = canvas.getBoundingClientRect(), sx = canvas.width / r.width, sy = canvas.height / r.height;
    pending = {x: (ev.clientX - r.left) * sx, y: (ev.clientY - r.top) * sy, cx: ev.clientX - r.left, cy: ev.clientY - r.top};
    window.requestAnimationFrame(function () {
      if (!pending) return;
      var p = pending; pending = null;
      var h = hit(p.x, p.y);
      if (!h) { tooltip.hidden = true; return; }
      tooltip.textContent = "";
      var t = h.event >= 0 && h.event < nE ? " at " + (timeUs[h.event] / 1000).toFixed(3) + " ms" : "";
      tooltip.appendChild(el("div", "event " + h.event + t + ": " + fmtBytes(h.total) + " active"));
      if (h.alloc >= 0) showStack(h.alloc, tooltip);
      if (h.alloc >= 0) showStack(h.alloc, details);
      tooltip.hidden = false;
      tooltip.style.left = Math.min(p.cx + 14, canvas.clientWidth - 300) + "px";
      tooltip.style.top = (p.cy + 14) + "px";
    });
  }

  function buildControls() {
    var box = document.getElementById("categories");
    D.categories.forEach(function (name, c) {
      var lab = document.createElement("label"), box2 = document.createElement("input");
      box2.type = "checkbox"; box2.checked = true;
      box2.addEventListener("change", function () { catOn[c] = box2.checked ? 1 : 0; draw(); });
      var sw = el("span", undefined, "swatch"); sw.style.background = PALETTE[c % PALETTE.length];
      lab.appendChild(box2); lab.appendChild(sw); lab.appendChild(document.createTextNode(name));
      box.appendChild(lab);
    });
    var ms = document.getElementById("minsize");
    ms.addEventListener("change", function () { minSize = Math.max(0, parseFloat(ms.value) || 0) * 1024; draw(); });
    document.getElementById("reset").addEventListener("click", function () {
      catOn.fill(1); minSize = 0; ms.value = "0";
      box.querySelectorAll("input").forEach(function (b) { b.checked = true; });
      draw();
    });
    canvas.addEventListener("mousemove", onMove);
    canvas.addEventListener("mouseleave", function () { tooltip.hidden = true; });
    window.addEventListener("resize", draw);
  }

  function summary() {
    document.getElementById("title").textContent = "tbmem memory snapshot: " + D.kind + ", step " + D.step +
      ", rank " + D.rank;
    var s = D.source + " on " + D.device + " | " + nE + " events, " + nA + " allocations" +
      (D.dropped ? " | " + D.dropped + " older events dropped" : "");
    if (D.meta && D.meta.exception) s += "\n" + D.meta.exception;
    document.getElementById("summary").textContent = s;
  }

  summary();
  buildControls();
  draw();
  // hooks for tests and scripting: where the peak column is drawn, in CSS pixels of the canvas
  window.tbmemViewer = {
    data: D,
    peakPoint: function () {
      var k = 0;
      for (var j = 0; j < M.cols; j++) if (M.colTotal[j] > M.colTotal[k]) k = j;
      var r = canvas.getBoundingClientRect(), w = plotW() / M.cols;
      var x = PAD_L + (k + 0.5) * w, y = PAD_T + plotH() - M.colTotal[k] / M.ymax * plotH() * 0.5;
      return {x: x * r.width / canvas.width, y: y * r.height / canvas.height};
    },
    stats: function () { return {peak: M.peak, peakEvent: M.peakEvent, cols: M.cols}; }
  };
})();
