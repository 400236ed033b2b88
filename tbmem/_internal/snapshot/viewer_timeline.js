// --- the timelines: bytes alive (by band) and reserved, one column per pixel, exact at every zoom ---
var canvas = $("timeline"), ctx = canvas.getContext("2d"), overlay = $("overlay"), octx = overlay.getContext("2d");
var rcanvas = $("reserved"), rctx = rcanvas.getContext("2d"), overlay2 = $("overlay2"), o2ctx = overlay2.getContext("2d");
var tooltip = $("tooltip"), details = $("details");
var PAD_L = 78, PAD_B = 34, PAD_T = 18, PAD_R = 12;
var M = null, V = null, sel = null;  // the aggregation drawn, the x range shown, the selected event

function timeAxis() { return useTime && dev.d.has_time && dev.nE > 1 && dev.tmono[dev.nE - 1] > dev.tmono[0]; }
function fullView() {
  if (timeAxis()) {
    var t0 = dev.tmono[0], t1 = dev.tmono[dev.nE - 1];
    return {x0: t0, x1: t1 + Math.max(t1 - t0, 1) * 1e-6};
  }
  return {x0: -0.5, x1: Math.max(dev.nE, 1) - 0.5};  // event e sits at x = e; left of 0: before it
}
function xOf(e) { return timeAxis() ? dev.tmono[e] : e; }
function firstAtOrAfter(x) {  // the first event at x or later
  if (!timeAxis()) return Math.max(0, Math.ceil(x));
  var lo = 0, hi = dev.nE;
  while (lo < hi) { var mid = (lo + hi) >> 1; if (dev.tmono[mid] < x) lo = mid + 1; else hi = mid; }
  return lo;
}
function plotW(c) { return (c || canvas).width - PAD_L - PAD_R; }
function plotH(c) { return (c || canvas).height - PAD_T - PAD_B; }

// the filtered band state before every K-th event (and the reserved and unfiltered allocated bytes),
// and the peak over the whole trace: one pass, redone when a filter changes
function prepare(dv) {
  var key = Array.prototype.join.call(catOn, "") + "/" + minSize;
  if (dv.prepared === key) return;
  var nB = nC, cur = new Float64Array(nB), total = 0, all = dv.d.baseline_bytes, res = dv.d.baseline_reserved || 0;
  for (var a = 0; a < dv.nA; a++) if (dv.start[a] < 0 && included(dv, a)) { cur[dv.band[a]] += dv.size[a]; total += dv.size[a]; }
  var ncp = Math.floor(dv.nE / K) + 1, cps = new Float64Array(ncp * (nB + 2)), r = 0, nR = dv.resEv ? dv.resEv.length : 0;
  var peak = total, peakEv = -1, ms = minSize, evDelta = dv.evDelta, evBand = dv.evBand;
  cps.set(cur, 0); cps[nB] = all; cps[nB + 1] = res;
  for (var e = 0; e < dv.nE; e++) {
    if (e % K === 0 && e) {
      var o = (e / K) * (nB + 2);
      cps.set(cur, o); cps[o + nB] = all; cps[o + nB + 1] = res;
    }
    var dd = evDelta[e];
    all += dd;
    if (dd !== 0 && catOn[evBand[e]] === 1 && (dd >= ms || -dd >= ms)) { cur[evBand[e]] += dd; total += dd; }
    while (r < nR && dv.resEv[r] === e) res += dv.resDelta[r++];
    if (total > peak) { peak = total; peakEv = e; }
  }
  dv.cps = cps; dv.peak = peak; dv.peakEv = peakEv; dv.prepared = key;
}
// the state (bands, allocated, reserved, reserved cursor) right before event e0
function stateBefore(dv, e0) {
  var nB = nC, c = Math.floor(Math.min(e0, dv.nE) / K), o = c * (nB + 2), cur = dv.cps.slice(o, o + nB);
  var all = dv.cps[o + nB], res = dv.cps[o + nB + 1], ms = minSize;
  for (var e = c * K; e < e0; e++) {
    var dd = dv.evDelta[e];
    all += dd;
    if (dd !== 0 && catOn[dv.evBand[e]] === 1 && (dd >= ms || -dd >= ms)) cur[dv.evBand[e]] += dd;
  }
  var lo = 0, hi = dv.resEv ? dv.resEv.length : 0;  // reserved events before e0
  while (lo < hi) { var mid = (lo + hi) >> 1; if (dv.resEv[mid] < e0) lo = mid + 1; else hi = mid; }
  if (dv.resEv) for (var r = lowerBound(dv.resEv, c * K); r < lo; r++) res += dv.resDelta[r];
  return {cur: cur, all: all, res: res, r: lo};
}
function lowerBound(arr, v) {
  var lo = 0, hi = arr.length;
  while (lo < hi) { var mid = (lo + hi) >> 1; if (arr[mid] < v) lo = mid + 1; else hi = mid; }
  return lo;
}

// per column: the most bytes alive across it (its events and the state carried in) with the bands
// at that point, and the least; the same for the reserved and the unfiltered allocated bytes
function aggregate(cols) {
  prepare(dev);
  var nB = nC, x0 = V.x0, span = V.x1 - V.x0, e0 = firstAtOrAfter(V.x0), s = stateBefore(dev, e0);
  var cur = s.cur, total = 0, all = s.all, res = s.res, r = s.r, b, k;
  for (b = 0; b < nB; b++) total += cur[b];
  var m = {cols: cols, nBands: nB, band: new Float64Array(cols * nB), top: new Float64Array(cols),
           bot: new Float64Array(cols), ev: new Int32Array(cols), resTop: new Float64Array(cols),
           resBot: new Float64Array(cols), allTop: new Float64Array(cols), resEv: new Int32Array(cols)};
  var col = -1, colStart = e0, startState = cur.slice(), timed = timeAxis(), nR = dev.resEv ? dev.resEv.length : 0;
  var ms = minSize, evDelta = dev.evDelta, evBand = dev.evBand, tm = dev.tmono, last = e0 - 1;
  function carry(from, to) {  // columns with no event of their own: the state carried in
    for (var q = from; q < to; q++) {
      m.top[q] = m.bot[q] = total; m.ev[q] = last; m.band.set(cur, q * nB);
      m.resTop[q] = m.resBot[q] = res; m.allTop[q] = all; m.resEv[q] = last;
    }
  }
  function close() {  // the bands at the column's highest point: replay from its start
    if (col < 0) return;
    var st = startState.slice(), stop = m.ev[col];
    for (var q = colStart; q <= stop; q++) {
      var d = evDelta[q];
      if (d !== 0 && catOn[evBand[q]] === 1 && (d >= ms || -d >= ms)) st[evBand[q]] += d;
    }
    m.band.set(st, col * nB);
  }
  for (var e = e0; e < dev.nE; e++) {
    var x = timed ? tm[e] : e;
    if (x >= V.x1) break;
    k = Math.min(cols - 1, Math.floor((x - x0) / span * cols));
    if (k !== col) {
      close();
      carry(col + 1, k);
      col = k; colStart = e; startState = cur.slice();
      m.top[k] = m.bot[k] = total; m.ev[k] = e - 1; m.resTop[k] = m.resBot[k] = res; m.allTop[k] = all; m.resEv[k] = e - 1;
    }
    var dd = evDelta[e];
    all += dd;
    if (dd !== 0 && catOn[evBand[e]] === 1 && (dd >= ms || -dd >= ms)) { cur[evBand[e]] += dd; total += dd; }
    while (r < nR && dev.resEv[r] === e) res += dev.resDelta[r++];
    if (total > m.top[k]) { m.top[k] = total; m.ev[k] = e; }
    if (total < m.bot[k]) m.bot[k] = total;
    if (res > m.resTop[k]) { m.resTop[k] = res; m.resEv[k] = e; }
    if (res < m.resBot[k]) m.resBot[k] = res;
    if (all > m.allTop[k]) m.allTop[k] = all;
    last = e;
  }
  close();
  carry(col + 1, cols);
  var ymax = 0, rmax = 0;
  for (k = 0; k < cols; k++) { if (m.top[k] > ymax) ymax = m.top[k]; if (m.resTop[k] > rmax) rmax = m.resTop[k]; if (m.allTop[k] > rmax) rmax = m.allTop[k]; }
  m.ymax = ymax || 1; m.rmax = rmax || 1;
  return m;
}

// ticks at 1, 2 or 5 x 10^k of one binary unit; integer arithmetic so no 0.30000000000000004
function niceStep(raw) {
  var mag = Math.pow(10, Math.floor(Math.log10(raw))), step = mag;
  [1, 2, 5, 10].forEach(function (f) { if (raw > mag * f * 0.75) step = mag * f; });
  return step;
}
function byteTicks(ymax) {
  var k = 0, unit = 1;
  while (ymax / unit >= 1024 && k < UNITS.length - 1) { unit *= 1024; k++; }
  var span = ymax / unit, step = niceStep(span / 5), digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9)), out = [];
  for (var i = 0; i * step <= span * 1.0001; i++) out.push({value: i * step * unit, text: (i * step).toFixed(digits) + " " + UNITS[k]});
  return out;
}
function xTicks(w) {
  var span = V.x1 - V.x0, out = [], i, first;
  if (timeAxis()) {
    // one unit for every label: the one the step and the largest label read best in (35.80 s, not 35800 ms)
    var step = niceStep(span / Math.max(2, w / 110)), top = Math.max(Math.abs(V.x0), Math.abs(V.x1)), u = TIME_UNITS[0];
    for (var q = 0; q < TIME_UNITS.length && top / u.us >= 1000; q++) u = TIME_UNITS[q];
    u = {name: u.name, us: u.us, digits: Math.max(0, Math.min(6, Math.ceil(-Math.log10(step / u.us) - 1e-9)))};
    for (i = Math.ceil(V.x0 / step); i * step <= V.x1; i++) out.push({x: i * step, text: (i * step / u.us).toFixed(u.digits) + " " + u.name});
    return out;
  }
  var st = Math.max(1, niceStep(span / Math.max(2, w / 80)));
  for (first = Math.ceil(V.x0 / st), i = first; i * st <= V.x1; i++) if (i * st >= 0 && i * st < Math.max(dev.nE, 1)) out.push({x: i * st, text: String(i * st)});
  return out;
}
function pxOfX(x, c) { return PAD_L + (x - V.x0) / (V.x1 - V.x0) * plotW(c); }
function xOfPx(px, c) { return V.x0 + (px - PAD_L) / plotW(c) * (V.x1 - V.x0); }
function pxOfEvent(e, c) { return e < 0 ? PAD_L : pxOfX(xOf(e), c); }

function sizeCanvas(c, o) {
  var rect = c.getBoundingClientRect(), dpr = window.devicePixelRatio || 1;
  c.width = o.width = Math.max(300, Math.round(rect.width * dpr));
  c.height = o.height = Math.max(80, Math.round(rect.height * dpr));
  o.style.top = c.offsetTop + "px"; o.style.height = rect.height + "px";
}
function draw() {
  // no reserved line to draw: the summary says why (the style's display would override ``hidden``); set
  // before sizing, so a device with segments after one without gets its chart's size
  rcanvas.style.display = overlay2.style.display = dev.seg ? "" : "none";
  sizeCanvas(canvas, overlay); sizeCanvas(rcanvas, overlay2);
  if (!V) V = fullView();
  var ta = performance.now();
  M = aggregate(Math.max(1, Math.round(plotW())));
  T.aggregate = performance.now() - ta;
  drawBands(); drawReserved(); drawPoolLanes();
  T.drawn = performance.now(); T.redraw = T.drawn - ta;
  state.drawn = true; state.exact = true;
  drawOverlays();
}
function drawBands() {
  var dpr = window.devicePixelRatio || 1, w = plotW() / M.cols, h = plotH(), sy = h / M.ymax, order = bandOrder(), k, j;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (j = 0; j < order.length; j++) {  // solid up to the column's lowest point, paler above: alive only part of it
    var b = order[j];
    ctx.fillStyle = bandColour(b);
    for (k = 0; k < M.cols; k++) {
      var below = 0, v = M.band[k * M.nBands + b];
      if (v <= 0) continue;
      for (var i = 0; i < j; i++) below += M.band[k * M.nBands + order[i]];
      var lo = below, hi = below + v, x = PAD_L + k * w, solid = Math.min(hi, M.bot[k]);
      if (solid > lo) { ctx.globalAlpha = 1; ctx.fillRect(x, PAD_T + h - solid * sy, Math.max(w, 1), (solid - lo) * sy); }
      if (hi > Math.max(lo, M.bot[k])) {
        var from = Math.max(lo, M.bot[k]);
        ctx.globalAlpha = 0.5; ctx.fillRect(x, PAD_T + h - hi * sy, Math.max(w, 1), (hi - from) * sy);
      }
    }
  }
  ctx.globalAlpha = 1;
  axes(ctx, canvas, M.ymax, dpr, dev.nE ? "" : "no trace events: what was alive when the snapshot was taken");
  drawMarkers(h, dpr);
}
function drawReserved() {
  var dpr = window.devicePixelRatio || 1, w = plotW(rcanvas) / M.cols, h = plotH(rcanvas), sy = h / M.rmax, k;
  rctx.fillStyle = "#fff"; rctx.fillRect(0, 0, rcanvas.width, rcanvas.height);
  rctx.font = (11 * dpr) + "px sans-serif"; rctx.textAlign = "left";
  if (!dev.seg) return;
  for (k = 0; k < M.cols; k++) {
    var x = PAD_L + k * w;
    rctx.fillStyle = "#f4a261"; rctx.fillRect(x, PAD_T + h - M.resTop[k] * sy, Math.max(w, 1), M.resTop[k] * sy);
    rctx.fillStyle = "#7d8a99"; rctx.fillRect(x, PAD_T + h - Math.min(M.allTop[k], M.resTop[k]) * sy, Math.max(w, 1),
      Math.min(M.allTop[k], M.resTop[k]) * sy);
  }
  axes(rctx, rcanvas, M.rmax, dpr, "", true);
  rctx.textAlign = "left"; rctx.font = (11 * dpr) + "px sans-serif";
  [["#7d8a99", "allocated"], ["#f4a261", "reserved - allocated (fragmentation)"]].forEach(function (p, i) {
    var x = PAD_L + 8 * dpr + i * 110 * dpr;
    rctx.fillStyle = p[0]; rctx.fillRect(x, 4 * dpr, 10 * dpr, 10 * dpr);
    rctx.fillStyle = "#333"; rctx.fillText(p[1], x + 14 * dpr, 13 * dpr);
  });
}
function axes(c2, cv, ymax, dpr, note, small) {
  var h = plotH(cv), sy = h / ymax, font = (11 * dpr) + "px sans-serif", ticks = byteTicks(ymax);
  if (small && ticks.length > 3) ticks = ticks.filter(function (_t, i) { return i % 2 === 0; });
  c2.strokeStyle = "#888"; c2.lineWidth = 1; c2.beginPath();
  c2.moveTo(PAD_L, PAD_T); c2.lineTo(PAD_L, PAD_T + h); c2.lineTo(PAD_L + plotW(cv), PAD_T + h); c2.stroke();
  c2.fillStyle = "#333"; c2.font = font; c2.textAlign = "right";
  ticks.forEach(function (t) {
    var yy = PAD_T + h - t.value * sy;
    c2.fillText(t.text, PAD_L - 5, yy + 4 * dpr);
    c2.strokeStyle = "rgba(0,0,0,0.07)"; c2.beginPath(); c2.moveTo(PAD_L + 1, yy); c2.lineTo(PAD_L + plotW(cv), yy); c2.stroke();
  });
  var yb = PAD_T + h + 14 * dpr;
  c2.textAlign = "center";
  if (!dev.nE) {
    c2.textAlign = "left"; c2.fillText(note, PAD_L + 4, yb);
    return;
  }
  xTicks(plotW(cv) / dpr).forEach(function (t) {
    var x = pxOfX(t.x, cv);
    c2.fillText(t.text, x, yb); c2.fillRect(x, PAD_T + h, 1, 4 * dpr);
  });
  if (small) return;
  c2.textAlign = "right";
  var whole = V.x0 <= fullView().x0 && V.x1 >= fullView().x1;
  c2.fillText((timeAxis() ? "time since the first event" : dev.d.has_time ? "event index" : "event index (the trace has no times)") +
    (whole ? "" : " (zoomed: double-click for all)"), PAD_L + plotW(cv), yb + 14 * dpr);
}
function drawMarkers(h, dpr) {
  var lastX = -1e9;
  ctx.font = (10 * dpr) + "px sans-serif"; ctx.textAlign = "left";
  (dev.d.markers || []).forEach(function (mk) {
    if (mk.event < 0 || mk.event >= dev.nE) return;
    var x = Math.round(pxOfEvent(mk.event)) + 0.5;
    if (x < PAD_L - 1 || x > PAD_L + plotW() + 1) return;
    ctx.strokeStyle = mk.kind === "step" ? "rgba(0,0,0,0.55)" : "rgba(90,90,160,0.45)";
    ctx.setLineDash(mk.kind === "step" ? [] : [3 * dpr, 3 * dpr]);
    ctx.beginPath(); ctx.moveTo(x, PAD_T); ctx.lineTo(x, PAD_T + h); ctx.stroke();
    ctx.setLineDash([]);
    if (x - lastX > 60 * dpr) { ctx.fillStyle = "#333"; ctx.fillText(mk.label, x + 2, PAD_T - 5); lastX = x; }
  });
  (dev.d.ooms || []).forEach(function (o) {
    var x = Math.round(pxOfEvent(o.event)) + 0.5;
    if (x < PAD_L - 1 || x > PAD_L + plotW() + 1) return;
    ctx.strokeStyle = "#d00"; ctx.lineWidth = 2 * dpr;
    ctx.beginPath(); ctx.moveTo(x, PAD_T); ctx.lineTo(x, PAD_T + h); ctx.stroke();
    ctx.lineWidth = 1; ctx.fillStyle = "#d00"; ctx.font = "bold " + (11 * dpr) + "px sans-serif";
    ctx.textAlign = "right"; ctx.fillText("OOM", x - 3, PAD_T + 12 * dpr); ctx.textAlign = "left";
  });
}
// the selected event's line, the hover line and the brush on both charts
var hoverPx = null, brush = null;
function drawOverlays() {
  [[octx, overlay, canvas], [o2ctx, overlay2, rcanvas]].forEach(function (p) {
    var c2 = p[0], cv = p[2];
    c2.clearRect(0, 0, p[1].width, p[1].height);
    if (brush) { c2.fillStyle = "rgba(60,110,200,0.18)"; c2.fillRect(Math.min(brush.a, brush.b), PAD_T, Math.abs(brush.b - brush.a), plotH(cv)); }
    if (sel !== null && dev.nE) {
      var x = Math.round(pxOfEvent(sel, cv)) + 0.5;
      if (x >= PAD_L && x <= PAD_L + plotW(cv)) {
        c2.strokeStyle = "rgba(200,0,120,0.9)"; c2.lineWidth = 2;
        c2.beginPath(); c2.moveTo(x, PAD_T); c2.lineTo(x, PAD_T + plotH(cv)); c2.stroke();
      }
    }
    if (hoverPx !== null) {
      c2.strokeStyle = "rgba(0,0,0,0.8)"; c2.lineWidth = 1;
      c2.beginPath(); c2.moveTo(hoverPx, PAD_T); c2.lineTo(hoverPx, PAD_T + plotH(cv)); c2.stroke();
    }
  });
}

// before the columns are inflated: the precomputed overview (2048 columns) of a device
function drawOverview(h) {
  var o = h.overview;
  sizeCanvas(canvas, overlay);
  var dpr = window.devicePixelRatio || 1, n = 2048, k, b, ymax = 1, order = bandOrder(), sy;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  if (o) for (k = 0; k < n; k++) { var tot = 0; for (b = 0; b < nC; b++) tot += o.bands[b][k]; if (tot > ymax) ymax = tot; }
  else ymax = Math.max(h.final_bytes, 1);
  sy = plotH() / ymax;
  var w = plotW() / n;
  for (k = 0; k < n; k++) {
    var y = PAD_T + plotH();
    for (var j = 0; j < order.length; j++) {
      var v = o ? o.bands[order[j]][k] * sy : 0;
      if (v <= 0) continue;
      ctx.fillStyle = bandColour(order[j]); ctx.fillRect(PAD_L + k * w, y - v, Math.max(w, 1), v); y -= v;
    }
  }
  ctx.fillStyle = "#333"; ctx.font = (11 * dpr) + "px sans-serif"; ctx.textAlign = "right";
  byteTicks(ymax).forEach(function (t) { ctx.fillText(t.text, PAD_L - 5, PAD_T + plotH() - t.value * sy + 4 * dpr); });
  $("status").textContent = "overview; decoding the events...";
  T.overview = performance.now();
  state.drawn = true;
}
