/* tbmem offline snapshot viewer. No network access, no third-party code.
 * Every string from the snapshot reaches the page through textContent only. */
(function () {
  "use strict";
  var T = {start: performance.now()};
  // one colour per category name, the same in every snapshot
  var FIXED = {"python code": "#4e79a7", "backward": "#e15759", "optimizer": "#59a14f", "c++ only": "#9c755f",
    "no stack": "#bab0ac", "before trace": "#8cd17d", "activation": "#f28e2b", "no_grad": "#edc948",
    "parameter": "#b07aa1", "gradient": "#ff9da7", "optimizer_state": "#2f4b7c", "before_recording": "#a0cbe8",
    "unknown": "#999999"};
  var BASELINE = "#d4d4d4";
  var FLAG_FREE_SITE = 1, FLAG_PENDING = 2, MAX_FRAMES = 14;
  var D = JSON.parse(document.getElementById("tbmem-data").textContent);
  T.parsed = performance.now();
  var nC = D.categories.length, BASE = nC;  // band nC: memory alive before the first event
  var canvas = document.getElementById("timeline"), ctx = canvas.getContext("2d");
  var overlay = document.getElementById("overlay"), octx = overlay.getContext("2d");
  var tooltip = document.getElementById("tooltip"), details = document.getElementById("details");
  var PAD_L = 78, PAD_B = 34, PAD_T = 18, PAD_R = 12;
  var dev = null, M = null, catOn = new Uint8Array(nC + 1).fill(1), minSize = 0, showCpp = false;
  var useTime = true, state = {drawn: false};

  function colour(name) {
    if (FIXED[name]) return FIXED[name];
    var h = 0;
    for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return "hsl(" + (h % 360) + ",55%,55%)";
  }
  function bandColour(c) { return c === BASE ? BASELINE : colour(D.categories[c]); }
  function bandName(c) { return c === BASE ? "alive before the trace (baseline)" : D.categories[c]; }
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
  function fmtBytes(n) {
    var k = 0;
    while (Math.abs(n) >= 1024 && k < UNITS.length - 1) { n /= 1024; k++; }
    return (k === 0 ? n.toFixed(0) : n.toFixed(2)) + " " + UNITS[k];
  }
  function fmtTime(us) {
    var a = Math.abs(us);
    if (a < 1000) return us.toFixed(0) + " us";
    if (a < 1e6) return (us / 1e3).toFixed(3) + " ms";
    if (a < 6e7) return (us / 1e6).toFixed(3) + " s";
    return (us / 6e7).toFixed(2) + " min";
  }
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  // --- decoding: base64 -> zlib -> typed array (the browser's own base64 decoder and DecompressionStream) ---
  var ARR = {"<i1": Int8Array, "<i2": Int16Array, "<i4": Int32Array, "<f8": Float64Array};
  function b64bytes(s) {
    if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(s);
    var bin = atob(s), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function column(c) {
    var stream = new Blob([b64bytes(c.z)]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (buf) { return new ARR[c.dtype](buf); });
  }
  var cache = {};
  function loadDevice(i) {
    if (cache[i]) return Promise.resolve(cache[i]);
    var d = D.devices[i], names = ["start", "end", "size", "category", "stack", "flags"];
    return Promise.all([column(d.time_us)].concat(names.map(function (n) { return column(d.cols[n]); })))
      .then(function (arr) {
        T.inflated = performance.now();
        var nE = d.n_events, nA = d.n_allocs, k;
        // times arrive as differences; the axis uses their running maximum (clocks may step back)
        var dt = arr[0], time = new Float64Array(nE), tm = new Float64Array(nE), acc = 0, mx = -Infinity;
        for (k = 0; k < nE; k++) { acc += dt[k]; time[k] = acc; if (acc > mx) mx = acc; tm[k] = mx; }
        var ds = arr[1], start = new Int32Array(nA), sacc = 0;
        for (k = 0; k < nA; k++) { sacc += ds[k]; start[k] = sacc - 1; }
        var dl = arr[2], end = new Int32Array(nA);  // lifetimes: end - start, 0 = still alive
        for (k = 0; k < nA; k++) end[k] = dl[k] === 0 ? -1 : (start[k] < 0 ? -1 : start[k]) + dl[k];
        var out = {d: d, nE: nE, nA: nA, time: time, tmono: tm, start: start, end: end, size: arr[3],
                   cat: arr[4], stack: arr[5], flags: arr[6]};
        // per event: the allocation it starts or ends, the signed size, its band
        var evAlloc = new Int32Array(nE).fill(-1), evDelta = new Float64Array(nE), band = new Int16Array(nA);
        var evBand = new Int16Array(nE), size = out.size, cat = out.cat;
        for (k = 0; k < nA; k++) {
          var bnd = start[k] < 0 ? BASE : cat[k];
          band[k] = bnd;
          if (start[k] >= 0) { evAlloc[start[k]] = k; evDelta[start[k]] = size[k]; evBand[start[k]] = bnd; }
          if (end[k] >= 0) { evAlloc[end[k]] = k; evDelta[end[k]] = -size[k]; evBand[end[k]] = bnd; }
        }
        out.band = band; out.evAlloc = evAlloc; out.evDelta = evDelta; out.evBand = evBand;
        cache[i] = out;
        T.decoded = performance.now();
        return out;
      });
  }

  // which allocations are alive at an event: checkpoints every K events, then the events since
  var K = 8192;
  function buildAlive(dv) {
    var nA = dv.nA, pos = new Int32Array(nA).fill(-1), list = new Int32Array(nA), n = 0, cps = [];
    for (var a = 0; a < nA; a++) if (dv.start[a] < 0) { pos[a] = n; list[n++] = a; }
    for (var e = 0; e < dv.nE; e++) {
      if (e % K === 0) cps.push(list.slice(0, n).sort());
      var al = dv.evAlloc[e];
      if (al < 0) continue;
      if (dv.evDelta[e] > 0) { pos[al] = n; list[n++] = al; }
      else if (pos[al] >= 0) { var last = list[--n]; list[pos[al]] = last; pos[last] = pos[al]; pos[al] = -1; }
    }
    dv.checkpoints = cps;
  }
  function aliveAt(ev) {
    if (!dev.checkpoints) buildAlive(dev);
    var out = [], c = Math.max(0, Math.min(dev.checkpoints.length - 1, Math.floor(Math.max(ev, 0) / K)));
    var seen = new Set(), cp = dev.checkpoints[c];
    function consider(a) {
      if (seen.has(a)) return;
      seen.add(a);
      if (dev.start[a] <= ev && (dev.end[a] < 0 || dev.end[a] > ev) && included(a)) out.push(a);
    }
    for (var i = 0; i < cp.length; i++) consider(cp[i]);
    for (var e = c * K; e <= ev && e < dev.nE; e++) if (dev.evAlloc[e] >= 0 && dev.evDelta[e] > 0) consider(dev.evAlloc[e]);
    if (ev < 0) for (var a = 0; a < dev.nA && dev.start[a] < 0; a++) consider(a);
    return out.sort(function (x, y) { return x - y; });
  }

  // --- aggregation: one column per pixel, each showing the state at its highest total ---------------
  function included(a) { return catOn[dev.band[a]] === 1 && dev.size[a] >= minSize; }
  function timeAxis() { return useTime && dev.d.has_time && dev.nE > 1 && dev.tmono[dev.nE - 1] > dev.tmono[0]; }
  function colOf(e, cols) {
    if (timeAxis()) {
      var t0 = dev.tmono[0], span = dev.tmono[dev.nE - 1] - t0;
      return Math.min(cols - 1, Math.floor((dev.tmono[e] - t0) / span * cols));
    }
    return Math.min(cols - 1, Math.floor(e * cols / Math.max(dev.nE, 1)));
  }
  function aggregate(nb) {
    var nBands = nC + 1, cur = new Float64Array(nBands), total = 0, nE = dev.nE;
    for (var a = 0; a < dev.nA; a++) if (dev.start[a] < 0 && included(a)) { cur[dev.band[a]] += dev.size[a]; total += dev.size[a]; }
    var cols = Math.max(1, nb), colBand = new Float64Array(cols * nBands), colTotal = new Float64Array(cols);
    var colEvent = new Int32Array(cols).fill(-1), best = new Float64Array(cols).fill(-1), peak = total, peakEv = -1;
    if (nE === 0) { colBand.set(cur, 0); colTotal[0] = total; }
    var timed = timeAxis(), t0 = dev.tmono[0], span = timed ? dev.tmono[nE - 1] - t0 : 1;
    var evDelta = dev.evDelta, evBand = dev.evBand, tm = dev.tmono, ms = minSize;
    for (var e = 0; e < nE; e++) {
      var dd = evDelta[e];
      if (dd !== 0 && catOn[evBand[e]] === 1 && (dd >= ms || -dd >= ms)) { cur[evBand[e]] += dd; total += dd; }
      var k = timed ? Math.min(cols - 1, Math.floor((tm[e] - t0) / span * cols)) : Math.min(cols - 1, Math.floor(e * cols / nE));
      if (total > best[k]) {
        best[k] = total; colTotal[k] = total; colEvent[k] = e;
        for (var c = 0; c < nBands; c++) colBand[k * nBands + c] = cur[c];
      }
      if (total > peak || peakEv < 0) { peak = total; peakEv = e; }
    }
    // a column no event falls in (a time gap) shows the state carried from the left
    for (k = 1; k < cols; k++) if (colEvent[k] < 0 && colEvent[k - 1] >= 0) {
      colEvent[k] = colEvent[k - 1]; colTotal[k] = colTotal[k - 1];
      for (c = 0; c < nBands; c++) colBand[k * nBands + c] = colBand[(k - 1) * nBands + c];
    }
    var ymax = 0;
    for (k = 0; k < cols; k++) if (colTotal[k] > ymax) ymax = colTotal[k];
    return {cols: cols, nBands: nBands, colBand: colBand, colTotal: colTotal, colEvent: colEvent,
            ymax: ymax || 1, peak: peak, peakEvent: peakEv};
  }

  // ticks at 1, 2 or 5 x 10^k of a binary unit
  function byteTicks(ymax) {
    var k = 0, unit = 1;
    while (ymax / unit >= 1024 && k < UNITS.length - 1) { unit *= 1024; k++; }
    var span = ymax / unit, raw = span / 5, mag = Math.pow(10, Math.floor(Math.log10(raw))), step = mag;
    [1, 2, 5, 10].forEach(function (m) { if (raw > mag * m * 0.75) step = mag * m; });
    var out = [];
    for (var v = 0; v <= span * 1.0001; v += step) out.push({value: v * unit, text: (+v.toPrecision(6)) + " " + UNITS[k]});
    return out;
  }
  function niceStep(raw) {
    var mag = Math.pow(10, Math.floor(Math.log10(raw))), step = mag;
    [1, 2, 5, 10].forEach(function (m) { if (raw > mag * m * 0.75) step = mag * m; });
    return step;
  }

  function plotW() { return canvas.width - PAD_L - PAD_R; }
  function plotH() { return canvas.height - PAD_T - PAD_B; }
  function xOfEvent(e) { return PAD_L + (colOf(Math.max(e, 0), M.cols) + 0.5) * plotW() / M.cols; }

  function draw() {
    var rect = canvas.getBoundingClientRect(), dpr = window.devicePixelRatio || 1;
    canvas.width = overlay.width = Math.max(300, Math.round(rect.width * dpr));
    canvas.height = overlay.height = Math.max(200, Math.round(rect.height * dpr));
    var ta = performance.now();
    M = aggregate(Math.max(1, Math.round(plotW())));
    T.aggregate = performance.now() - ta;
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    var w = plotW() / M.cols, h = plotH(), sy = h / M.ymax;
    var order = [BASE]; for (var c = 0; c < nC; c++) order.push(c);  // baseline at the bottom
    for (var k = 0; k < M.cols; k++) {
      var y = PAD_T + h, x = PAD_L + k * w;
      for (var j = 0; j < order.length; j++) {
        var b = order[j], v = M.colBand[k * M.nBands + b] * sy;
        if (v <= 0) continue;
        ctx.fillStyle = bandColour(b);
        ctx.fillRect(x, y - v, Math.max(w, 1), v);
        y -= v;
      }
    }
    var dpr2 = dpr, font = (11 * dpr2) + "px sans-serif";
    ctx.strokeStyle = "#888"; ctx.lineWidth = 1; ctx.beginPath();
    ctx.moveTo(PAD_L, PAD_T); ctx.lineTo(PAD_L, PAD_T + h); ctx.lineTo(PAD_L + plotW(), PAD_T + h); ctx.stroke();
    ctx.fillStyle = "#333"; ctx.font = font; ctx.textAlign = "right";
    byteTicks(M.ymax).forEach(function (t) {
      var yy = PAD_T + h - t.value * sy;
      ctx.fillText(t.text, PAD_L - 5, yy + 4 * dpr2);
      ctx.strokeStyle = "#eee"; ctx.beginPath(); ctx.moveTo(PAD_L + 1, yy); ctx.lineTo(PAD_L + plotW(), yy); ctx.stroke();
    });
    drawXAxis(h, font, dpr2);
    drawMarkers(h, dpr2);
    T.drawn = performance.now();
    state.drawn = true;
    state.exact = true;
    // the peak table needs the alive-at index (a pass over every event): after the first paint
    setTimeout(function () { var tp = performance.now(); renderPeak(); T.peak = performance.now() - tp; }, 0);
  }

  // before the columns are inflated: the precomputed overview (2048 columns) of the default device
  function drawOverview(d) {
    var o = d.overview;
    if (!o) return false;
    var rect = canvas.getBoundingClientRect(), dpr = window.devicePixelRatio || 1;
    canvas.width = overlay.width = Math.max(300, Math.round(rect.width * dpr));
    canvas.height = overlay.height = Math.max(200, Math.round(rect.height * dpr));
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    var ymax = 1, k, b, n = o.columns.length;
    for (k = 0; k < n; k++) { var tot = 0; for (b = 0; b <= nC; b++) tot += o.bands[b][k]; if (tot > ymax) ymax = tot; }
    var w = plotW() / 2048, h = plotH(), sy = h / ymax;
    for (k = 0; k < n; k++) {
      var x0 = PAD_L + o.columns[k] * w, x1 = PAD_L + (k + 1 < n ? o.columns[k + 1] : 2048) * w, y = PAD_T + h;
      var order = [BASE]; for (b = 0; b < nC; b++) order.push(b);
      for (var j = 0; j < order.length; j++) {
        var v = o.bands[order[j]][k] * sy;
        if (v <= 0) continue;
        ctx.fillStyle = bandColour(order[j]); ctx.fillRect(x0, y - v, Math.max(x1 - x0, 1), v); y -= v;
      }
    }
    ctx.fillStyle = "#333"; ctx.font = (11 * dpr) + "px sans-serif"; ctx.textAlign = "right";
    byteTicks(ymax).forEach(function (t) { ctx.fillText(t.text, PAD_L - 5, PAD_T + h - t.value * sy + 4 * dpr); });
    document.getElementById("status").textContent = "overview; decoding the events...";
    T.overview = performance.now();
    state.drawn = true;
    return true;
  }

  function drawXAxis(h, font, dpr) {
    ctx.fillStyle = "#333"; ctx.font = font; ctx.textAlign = "center";
    var yb = PAD_T + h + 14 * dpr;
    if (timeAxis()) {
      var t0 = dev.tmono[0], span = dev.tmono[dev.nE - 1] - t0, step = niceStep(span / 8);
      for (var t = 0; t <= span; t += step) {
        var x = PAD_L + t / span * plotW();
        ctx.fillText(fmtTime(t), x, yb);
        ctx.fillRect(x, PAD_T + h, 1, 4 * dpr);
      }
      ctx.textAlign = "right"; ctx.fillText("time since the first event", PAD_L + plotW(), yb + 14 * dpr);
    } else {
      var n = Math.max(dev.nE - 1, 1), st = niceStep(n / 8);
      for (var e = 0; e <= n; e += st) {
        var xe = PAD_L + e / n * plotW();
        ctx.fillText(String(e), xe, yb);
        ctx.fillRect(xe, PAD_T + h, 1, 4 * dpr);
      }
      ctx.textAlign = "right";
      ctx.fillText(dev.d.has_time ? "event index" : "event index (the trace has no times)", PAD_L + plotW(), yb + 14 * dpr);
    }
  }

  function drawMarkers(h, dpr) {
    var lastX = -1e9;
    ctx.font = (10 * dpr) + "px sans-serif"; ctx.textAlign = "left";
    (dev.d.markers || []).forEach(function (m) {
      if (m.event < 0 || m.event >= dev.nE) return;
      var x = Math.round(xOfEvent(m.event)) + 0.5;
      ctx.strokeStyle = m.kind === "step" ? "rgba(0,0,0,0.55)" : "rgba(90,90,160,0.45)";
      ctx.setLineDash(m.kind === "step" ? [] : [3 * dpr, 3 * dpr]);
      ctx.beginPath(); ctx.moveTo(x, PAD_T); ctx.lineTo(x, PAD_T + h); ctx.stroke();
      ctx.setLineDash([]);
      if (x - lastX > 60 * dpr) { ctx.fillStyle = "#333"; ctx.fillText(m.label, x + 2, PAD_T - 5); lastX = x; }
    });
    (dev.d.ooms || []).forEach(function (o) {
      var x = Math.round(xOfEvent(o.event)) + 0.5;
      ctx.strokeStyle = "#d00"; ctx.lineWidth = 2 * dpr;
      ctx.beginPath(); ctx.moveTo(x, PAD_T); ctx.lineTo(x, PAD_T + h); ctx.stroke();
      ctx.lineWidth = 1; ctx.fillStyle = "#d00"; ctx.font = "bold " + (11 * dpr) + "px sans-serif";
      ctx.textAlign = "right"; ctx.fillText("OOM", x - 3, PAD_T + 12 * dpr); ctx.textAlign = "left";
    });
  }

  function frame(fid) {
    var f = D.frames[fid];
    return {file: D.strings[f[0]], line: f[1], name: D.strings[f[2]], kind: D.frame_kinds[fid]};
  }
  function frameText(f) { return f ? f.name + " (" + f.file + ":" + f.line + ")" : "(no user frame)"; }
  function userFrame(sid) { return sid < 0 || D.user_frame[sid] < 0 ? null : frame(D.user_frame[sid]); }
  function siteText(a) {
    var sid = dev.stack[a];
    if (sid < 0) return "(no stack recorded)";
    var text = frameText(userFrame(sid));
    return (dev.flags[a] & FLAG_FREE_SITE) ? "stack of its free: " + text : text;
  }
  function when(e) {
    if (e < 0) return "before the first event";
    return "event " + e + (dev.d.has_time ? " (+" + fmtTime(dev.time[e]) + ")" : "");
  }

  function showStack(a, into) {
    into.textContent = "";
    var free = (dev.flags[a] & FLAG_FREE_SITE) !== 0;
    into.appendChild(el("div", fmtBytes(dev.size[a]) + "  " + D.categories[dev.cat[a]], "head"));
    into.appendChild(el("div", (dev.start[a] < 0 ? "allocated before the trace" : "allocated at " + when(dev.start[a])) +
      (dev.end[a] >= 0 ? ", freed at " + when(dev.end[a]) :
       (dev.flags[a] & FLAG_PENDING) ? ", free requested, not completed" : ", still alive")));
    var sid = dev.stack[a];
    if (sid < 0) { into.appendChild(el("div", "(no stack recorded)")); return; }
    into.appendChild(el("div", free ? "stack recorded at its free (where it was allocated is not known):"
                                    : "stack at the allocation:", "note"));
    var fr = D.stacks[sid], uf = D.user_frame[sid], shown = 0, cpp = 0;
    for (var k = 0; k < fr.length; k++) {
      var g = frame(fr[k]);
      if (g.kind === 2 && !showCpp) { cpp++; continue; }
      if (shown >= MAX_FRAMES) continue;
      into.appendChild(el("div", frameText(g), fr[k] === uf ? "frame user" : (g.kind === 2 ? "frame cpp" : "frame")));
      shown++;
    }
    var more = [];
    if (fr.length - cpp > shown) more.push((fr.length - cpp - shown) + " more Python frames");
    if (cpp) more.push(cpp + " C++ frames hidden (show C++ frames to see them)");
    if (more.length) into.appendChild(el("div", "... " + more.join(", "), "note"));
  }

  function renderPeak() {
    var body = document.querySelector("#peak tbody");
    body.textContent = "";
    var alive = aliveAt(M.peakEvent);
    alive.sort(function (x, y) { return dev.size[y] - dev.size[x]; });
    document.getElementById("peaktitle").textContent = "Allocations alive at the peak of " + dev.d.device + " (" +
      fmtBytes(M.peak) + ", " + when(M.peakEvent) + ", " + alive.length + " allocations" +
      (alive.length > 200 ? ", largest 200" : "") + ")";
    alive.slice(0, 200).forEach(function (a) {
      var tr = document.createElement("tr");
      tr.appendChild(el("td", fmtBytes(dev.size[a])));
      tr.appendChild(el("td", D.categories[dev.cat[a]]));
      tr.appendChild(el("td", siteText(a)));
      tr.addEventListener("click", function () { showStack(a, details); });
      body.appendChild(tr);
    });
  }

  // the allocation under (px, py): bands are stacked baseline first, allocations within a band by age
  function hit(px, py) {
    if (!M || px < PAD_L || px > PAD_L + plotW()) return null;
    var k = Math.min(M.cols - 1, Math.max(0, Math.floor((px - PAD_L) / plotW() * M.cols)));
    var v = (PAD_T + plotH() - py) / plotH() * M.ymax, base = 0, band = -1;
    var order = [BASE]; for (var c = 0; c < nC; c++) order.push(c);
    for (var j = 0; j < order.length; j++) {
      var s = M.colBand[k * M.nBands + order[j]];
      if (s > 0 && v >= base && v < base + s) { band = order[j]; break; }
      base += s;
    }
    var res = {col: k, event: M.colEvent[k], total: M.colTotal[k], alloc: -1};
    if (band < 0 || res.event < 0) return res;
    var alive = aliveAt(res.event), acc = base;
    for (var i = 0; i < alive.length; i++) {
      var a = alive[i];
      if (dev.band[a] !== band) continue;
      if (v < acc + dev.size[a]) { res.alloc = a; break; }
      acc += dev.size[a];
    }
    return res;
  }

  function placeTooltip(cx, cy) {
    // inside the viewport, beside the event line (never over it)
    var r = canvas.getBoundingClientRect(), tw = tooltip.offsetWidth, th = tooltip.offsetHeight;
    var vw = document.documentElement.clientWidth, vh = document.documentElement.clientHeight;
    var left = cx + 16;
    if (r.left + left + tw > vw - 4) left = cx - 16 - tw;
    left = Math.max(-r.left + 4, left);
    var top = cy + 16;
    if (r.top + top + th > vh - 4) top = Math.max(-r.top + 4, vh - 4 - th - r.top);
    tooltip.style.left = left + "px"; tooltip.style.top = top + "px";
  }

  function hover(cx, cy) {
    var sx = canvas.width / canvas.clientWidth, sy = canvas.height / canvas.clientHeight;
    var h = hit(cx * sx, cy * sy);
    octx.clearRect(0, 0, overlay.width, overlay.height);
    if (!h || h.event < 0) { tooltip.hidden = true; return null; }
    var x = Math.round(cx * sx) + 0.5;
    octx.strokeStyle = "rgba(0,0,0,0.8)"; octx.lineWidth = 1;
    octx.beginPath(); octx.moveTo(x, PAD_T); octx.lineTo(x, PAD_T + plotH()); octx.stroke();
    tooltip.textContent = "";
    tooltip.appendChild(el("div", when(h.event) + ": " + fmtBytes(h.total) + " active", "head"));
    if (h.alloc >= 0) { showStack(h.alloc, details); appendAlloc(h.alloc); }
    tooltip.hidden = false;
    placeTooltip(cx, cy);
    return h;
  }
  function appendAlloc(a) {
    var box = el("div");
    showStack(a, box);
    tooltip.appendChild(box);
  }

  var pending = null;
  function onMove(ev) {
    var r = canvas.getBoundingClientRect();
    pending = {x: ev.clientX - r.left, y: ev.clientY - r.top};
    window.requestAnimationFrame(function () {
      if (!pending) return;
      var p = pending; pending = null;
      hover(p.x, p.y);
    });
  }

  function summary() {
    var d = dev.d, parts = [];
    document.getElementById("title").textContent = "tbmem memory snapshot: " + D.kind + ", step " + D.step + ", rank " + D.rank;
    parts.push(D.source + " on " + d.device + ": " + (d.reserved_bytes === null ? "no segments" : "reserved " + fmtBytes(d.reserved_bytes)) +
      ", allocated " + fmtBytes(d.final_bytes) + " at the end, peak " + fmtBytes(d.peak[1]) + " at " + when(d.peak[0]) +
      " | " + d.n_events + " events, " + d.n_allocs + " allocations, " + fmtBytes(d.baseline_bytes) + " alive before the first event" +
      (d.dropped ? " | " + d.dropped + " older events dropped" : ""));
    if (D.t0_unix !== null) parts.push("trace began " + new Date(D.t0_unix * 1000).toISOString());
    (d.ooms || []).forEach(function (o) {
      parts.push("OUT OF MEMORY at " + when(o.event) + ": requested " + fmtBytes(o.requested_bytes) +
        (o.free_bytes === null ? "" : ", " + fmtBytes(o.free_bytes) + " free on the device"));
    });
    if (D.meta && D.meta.exception) parts.push(D.meta.exception);
    document.getElementById("summary").textContent = parts.join("\n");
  }

  function buildLegend() {
    var box = document.getElementById("categories");
    box.textContent = "";
    var used = new Uint8Array(nC + 1);
    for (var a = 0; a < dev.nA; a++) used[dev.band[a]] = 1;
    for (var c = 0; c <= nC; c++) {
      if (!used[c]) continue;
      (function (c) {
        var lab = document.createElement("label"), b = document.createElement("input");
        b.type = "checkbox"; b.checked = catOn[c] === 1;
        b.addEventListener("change", function () { catOn[c] = b.checked ? 1 : 0; draw(); });
        var sw = el("span", undefined, "swatch"); sw.style.background = bandColour(c);
        lab.appendChild(b); lab.appendChild(sw); lab.appendChild(document.createTextNode(bandName(c)));
        box.appendChild(lab);
      })(c);
    }
  }

  function selectDevice(i) {
    document.getElementById("status").textContent = "decoding " + D.devices[i].device + "...";
    return loadDevice(i).then(function (d) {
      dev = d;
      document.getElementById("status").textContent = "";
      summary(); buildLegend(); draw();
    });
  }

  function buildControls() {
    var sel = document.getElementById("device");
    D.devices.forEach(function (d, i) {
      var o = el("option", d.device + " (peak " + fmtBytes(d.peak[1]) + (d.ooms.length ? ", OOM" : "") + ")");
      o.value = String(i);
      sel.appendChild(o);
    });
    sel.value = String(D.default_device);
    sel.addEventListener("change", function () { selectDevice(parseInt(sel.value, 10)); });
    var ms = document.getElementById("minsize");
    ms.addEventListener("change", function () { minSize = Math.max(0, parseFloat(ms.value) || 0) * 1024; draw(); });
    document.getElementById("reset").addEventListener("click", function () {
      catOn.fill(1); minSize = 0; ms.value = "0"; buildLegend(); draw();
    });
    var cpp = document.getElementById("cpp");
    cpp.addEventListener("change", function () { showCpp = cpp.checked; });
    var axis = document.getElementById("axis");
    axis.addEventListener("change", function () { useTime = axis.value === "time"; draw(); });
    canvas.addEventListener("mousemove", onMove);
    canvas.addEventListener("mouseleave", function () {
      tooltip.hidden = true; octx.clearRect(0, 0, overlay.width, overlay.height);
    });
    window.addEventListener("resize", function () { if (dev) draw(); });
  }

  buildControls();
  drawOverview(D.devices[D.default_device]);
  // hooks for tests and scripting (coordinates in CSS pixels of the canvas)
  window.tbmemViewer = {
    data: D, state: state, timing: T,
    get drawn() { return state.drawn; },
    get exact() { return state.exact === true; },
    ready: selectDevice(D.default_device),
    selectDevice: selectDevice,
    device: function () { return dev ? dev.d.device : null; },
    peakPoint: function () {
      var k = 0;
      for (var j = 0; j < M.cols; j++) if (M.colTotal[j] > M.colTotal[k]) k = j;
      var x = PAD_L + (k + 0.5) * plotW() / M.cols, y = PAD_T + plotH() - M.colTotal[k] / M.ymax * plotH() * 0.5;
      return {x: x * canvas.clientWidth / canvas.width, y: y * canvas.clientHeight / canvas.height};
    },
    timeHover: function (x, y) { var t = performance.now(); hover(x, y); return performance.now() - t; },
    stats: function () { return {peak: M.peak, peakEvent: M.peakEvent, cols: M.cols, ymax: M.ymax}; },
    ticks: function () { return byteTicks(M.ymax).map(function (t) { return t.text; }); },
    colour: colour
  };
})();
