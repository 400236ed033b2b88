// --- interaction: hover, zoom, pan, brush, the selected event, controls; hooks for tests -------------
function redrawAll() { if (!dev) return; draw(); renderPeak(); }

// the allocation under (px, py) of the active chart: bands stacked in category order, allocations in a band by age
function hit(px, py) {
  if (!M || px < PAD_L || px > PAD_L + plotW()) return null;
  var k = Math.min(M.cols - 1, Math.max(0, Math.floor((px - PAD_L) / plotW() * M.cols)));
  var v = (PAD_T + plotH() - py) / plotH() * M.ymax, base = 0, band = -1, order = bandOrder();
  for (var j = 0; j < order.length; j++) {
    var s = M.band[k * M.nBands + order[j]];
    if (s > 0 && v >= base && v < base + s) { band = order[j]; break; }
    base += s;
  }
  var res = {col: k, event: M.ev[k], total: M.top[k], low: M.bot[k], alloc: -1};
  if (band < 0) return res;
  var alive = aliveAt(dev, res.event, true), acc = base;
  for (var i = 0; i < alive.length; i++) {
    var a = alive[i];
    if (dev.band[a] !== band) continue;
    if (v < acc + dev.size[a]) { res.alloc = a; break; }
    acc += dev.size[a];
  }
  return res;
}
function placeTooltip(cx, cy, cv) {
  // inside the viewport, beside the event line (never over it)
  var r = cv.getBoundingClientRect(), pr = $("plot").getBoundingClientRect(), tw = tooltip.offsetWidth, th = tooltip.offsetHeight;
  var vw = document.documentElement.clientWidth, vh = document.documentElement.clientHeight;
  var left = cx + 16;
  if (r.left + left + tw > vw - 4) left = cx - 16 - tw;
  left = Math.max(-r.left + 4, left);
  var top = cy + 16 + (r.top - pr.top);
  if (pr.top + top + th > vh - 4) top = Math.max(-pr.top + 4, vh - 4 - th - pr.top);
  tooltip.style.left = left + "px"; tooltip.style.top = top + "px";
}
function hover(cx, cy, cv) {
  cv = cv || canvas;
  var sx = cv.width / cv.clientWidth, sy = cv.height / cv.clientHeight, px = cx * sx;
  hoverPx = px >= PAD_L && px <= PAD_L + plotW(cv) ? Math.round(px) + 0.5 : null;
  drawOverlays();
  if (hoverPx === null || !M) { tooltip.hidden = true; return null; }
  tooltip.textContent = "";
  var h;
  if (cv === rcanvas) {
    var k = Math.min(M.cols - 1, Math.max(0, Math.floor((px - PAD_L) / plotW(cv) * M.cols)));
    h = {event: M.resEv[k], reserved: M.resTop[k], allocated: M.allTop[k]};
    tooltip.appendChild(el("div", (h.event < 0 ? "" : "at ") + when(h.event) + ": reserved " + fmtBytes(h.reserved) +
      (M.resBot[k] < M.resTop[k] ? " (" + fmtBytes(M.resBot[k]) + " at the lowest in this column)" : ""), "head"));
    tooltip.appendChild(el("div", "allocated up to " + fmtBytes(h.allocated) + "; reserved - allocated " +
      fmtBytes(Math.max(0, h.reserved - h.allocated)) + " (fragmentation and cached free memory)"));
  } else {
    h = hit(px, cy * sy);
    if (!h) { tooltip.hidden = true; return null; }
    tooltip.appendChild(el("div", (h.event < 0 ? "" : "at ") + when(h.event) + ": " + fmtBytes(h.total) + " active" +
      (h.low < h.total ? " (" + fmtBytes(h.low) + " at the lowest in this column)" : ""), "head"));
    if (h.alloc >= 0) { showStack(h.alloc, details); var box = el("div"); showStack(h.alloc, box); tooltip.appendChild(box); }
  }
  tooltip.hidden = false;
  placeTooltip(cx, cy, cv);
  return h;
}

// the selected event: its line on both charts, the allocator's state at it
function select(ev) {
  if (!dev) return 0;
  ev = Math.max(-1, Math.min(dev.nE - 1, ev));
  sel = ev;
  if (dev.nE && ev >= 0) {  // keep it in view
    var x = xOf(ev), span = V.x1 - V.x0;
    if (x < V.x0 || x >= V.x1) { V = clampView({x0: x - span / 2, x1: x + span / 2}); draw(); }
  }
  drawOverlays();
  return renderAllocator(ev);
}
function clampView(v) {
  var f = fullView(), span = Math.min(v.x1 - v.x0, f.x1 - f.x0), minSpan = timeAxis() ? 1 : 4;
  span = Math.max(span, Math.min(minSpan, f.x1 - f.x0));
  var x0 = Math.max(f.x0, Math.min(v.x0, f.x1 - span));
  return {x0: x0, x1: x0 + span};
}
function zoomAt(px, factor, cv) {
  var x = xOfPx(px, cv), v = {x0: x - (x - V.x0) * factor, x1: x + (V.x1 - x) * factor};
  V = clampView(v);
  var t = performance.now(); draw(); T.zoom = performance.now() - t;
}
function pan(dpx, cv) {
  var dx = dpx / plotW(cv) * (V.x1 - V.x0);
  V = clampView({x0: V.x0 - dx, x1: V.x1 - dx});
  draw();
}
function columnEvent(px, cv) {
  var k = Math.min(M.cols - 1, Math.max(0, Math.floor((px - PAD_L) / plotW(cv) * M.cols)));
  return cv === rcanvas ? M.resEv[k] : M.ev[k];
}

var drag = null, pending = null;
[canvas, rcanvas].forEach(function (cv) {
  cv.addEventListener("mousemove", function (ev) {
    var r = cv.getBoundingClientRect(), sx = cv.width / cv.clientWidth, px = (ev.clientX - r.left) * sx;
    if (drag && drag.cv === cv) {
      if (drag.pan) { pan(px - drag.last, cv); drag.last = px; return; }
      brush = {a: drag.px, b: px}; drawOverlays(); return;
    }
    pending = {x: ev.clientX - r.left, y: ev.clientY - r.top, cv: cv};
    window.requestAnimationFrame(function () {
      if (!pending) return;
      var p = pending; pending = null;
      hover(p.x, p.y, p.cv);
    });
  });
  cv.addEventListener("mouseleave", function () { tooltip.hidden = true; hoverPx = null; if (M) drawOverlays(); });
  cv.addEventListener("mousedown", function (ev) {
    if (!dev || !dev.nE) return;
    var r = cv.getBoundingClientRect(), px = (ev.clientX - r.left) * cv.width / cv.clientWidth;
    drag = {cv: cv, px: px, last: px, pan: ev.shiftKey};
    ev.preventDefault();
  });
  cv.addEventListener("dblclick", function () { if (dev) { V = fullView(); draw(); } });
  cv.addEventListener("wheel", function (ev) {
    if (!dev || !dev.nE) return;
    ev.preventDefault();
    var r = cv.getBoundingClientRect(), px = (ev.clientX - r.left) * cv.width / cv.clientWidth;
    if (ev.shiftKey || Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) pan(-(ev.deltaX || ev.deltaY) * 0.5, cv);
    else zoomAt(px, ev.deltaY > 0 ? 1.25 : 0.8, cv);
  }, {passive: false});
});
window.addEventListener("mouseup", function (ev) {
  if (!drag) return;
  var d = drag, r = d.cv.getBoundingClientRect(), px = (ev.clientX - r.left) * d.cv.width / d.cv.clientWidth;
  drag = null; brush = null;
  if (d.pan) return;
  if (Math.abs(px - d.px) > 4) {  // a range brushed: zoom into it
    V = clampView({x0: xOfPx(Math.min(px, d.px), d.cv), x1: xOfPx(Math.max(px, d.px), d.cv)});
    draw();
  } else {
    select(columnEvent(d.px, d.cv));
  }
});
document.addEventListener("keydown", function (ev) {
  var t = ev.target && ev.target.tagName;
  if (!dev || t === "INPUT" || t === "SELECT" || t === "TEXTAREA") return;
  var step = ev.shiftKey ? 100 : 1, cur = sel === null ? dev.peakEv : sel;
  var keys = {ArrowRight: cur + step, ArrowLeft: cur - step, Home: -1, End: dev.nE - 1};
  if (ev.key in keys) { select(keys[ev.key]); ev.preventDefault(); return; }
  if ((ev.key === "+" || ev.key === "=" || ev.key === "-") && dev.nE) {
    var c = sel !== null && sel >= 0 ? pxOfEvent(sel) : PAD_L + plotW() / 2;
    zoomAt(c, ev.key === "-" ? 1.5 : 1 / 1.5, canvas); ev.preventDefault();
  } else if (ev.key === "0") { V = fullView(); draw(); }
});

function selectDevice(i) {
  $("status").textContent = "decoding " + deviceName(SH.devices[i]) + "...";
  return loadDevice(snapIndex, i).then(function (d) {
    dev = d; V = null; sel = null;
    $("device").value = String(i);
    $("status").textContent = "";
    var axis = $("axis"), timed = d.d.has_time && d.nE > 1;
    axis.querySelector("option[value=time]").disabled = !timed;
    axis.value = timed && useTime ? "time" : "event";
    summary(); buildLegend(); draw();
    prepare(dev);
    select(dev.peakEv);  // the allocator's state at the peak
    // the peak table needs the alive-at index (a pass over every event): after the first paint
    setTimeout(function () { var tp = performance.now(); renderPeak(); T.peak = performance.now() - tp; }, 0);
    if (HEAD.snapshots.length > 1) setupDiff();
    return d;
  });
}
function selectSnapshot(i) {
  snapIndex = i; SH = HEAD.snapshots[i]; SB = body().snapshots[i];
  nC = SH.categories.length; catOn = new Uint8Array(nC).fill(1);
  var sel2 = $("device");
  sel2.textContent = "";
  SH.devices.forEach(function (d, k) {
    var o = el("option", deviceName(d) + " (peak " + fmtBytes(d.peak[1]) + (d.ooms.length ? ", OOM" : "") + ")");
    o.value = String(k); sel2.appendChild(o);
  });
  $("snapshot").value = String(i);
  explainHeader();
  return selectDevice(SH.default_device);
}
function buildControls() {
  var snaps = $("snapshot");
  HEAD.snapshots.forEach(function (s, i) { var o = el("option", s.name); o.value = String(i); snaps.appendChild(o); });
  $("snapbox").hidden = HEAD.snapshots.length < 2;
  snaps.addEventListener("change", function () { selectSnapshot(parseInt(snaps.value, 10)); });
  $("device").addEventListener("change", function () { selectDevice(parseInt($("device").value, 10)); });
  var ms = $("minsize");
  ms.addEventListener("change", function () { minSize = Math.max(0, parseFloat(ms.value) || 0) * 1024; redrawAll(); });
  $("reset").addEventListener("click", function () {
    catOn.fill(1); minSize = 0; ms.value = "0"; buildLegend(); V = null; redrawAll();
  });
  $("cpp").addEventListener("change", function () { showCpp = $("cpp").checked; });
  $("axis").addEventListener("change", function () { useTime = $("axis").value === "time"; V = null; draw(); });
  $("diffbase").addEventListener("change", function () { renderDiff(); });
  window.addEventListener("resize", function () { if (dev) { draw(); if (A) renderAllocator(A.ev); } });
}

buildControls();
explainHeader();
SH.devices.length && drawOverview(SH.devices[SH.default_device]);
// the columns come after this script in the page: decode them once the whole document is parsed
var ready = new Promise(function (resolve) {
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", function () { setTimeout(resolve, 0); });
  else setTimeout(resolve, 0);
}).then(function () {
  SB = body().snapshots[0];
  return selectSnapshot(0);
});
// hooks for tests and scripting (coordinates in CSS pixels of the canvas)
window.tbmemViewer = {
  head: HEAD, state: state, timing: T, ready: ready,
  get data() { return body(); },
  get drawn() { return state.drawn; },
  get exact() { return state.exact === true; },
  selectDevice: selectDevice, selectSnapshot: selectSnapshot, select: select,
  device: function () { return dev ? dev.d.device : null; },
  snapshot: function () { return snapIndex; },
  selected: function () { return sel; },
  view: function () { return {x0: V.x0, x1: V.x1, full: fullView(), time: timeAxis()}; },
  setView: function (x0, x1) { V = clampView({x0: x0, x1: x1}); var t = performance.now(); draw(); return performance.now() - t; },
  peakPoint: function () {
    var k = 0;
    for (var j = 0; j < M.cols; j++) if (M.top[j] > M.top[k]) k = j;
    var x = PAD_L + (k + 0.5) * plotW() / M.cols, y = PAD_T + plotH() - M.top[k] / M.ymax * plotH() * 0.5;
    return {x: x * canvas.clientWidth / canvas.width, y: y * canvas.clientHeight / canvas.height};
  },
  pointOfEvent: function (e) {
    return {x: pxOfEvent(e) * canvas.clientWidth / canvas.width, y: canvas.clientHeight / 2};
  },
  timeHover: function (x, y) { var t = performance.now(); hover(x, y); return performance.now() - t; },
  timeAllocator: function (e) { return select(e); },
  stats: function () { prepare(dev); return {peak: dev.peak, peakEvent: dev.peakEv, cols: M.cols, ymax: M.ymax}; },
  columns: function () {
    return {top: Array.from(M.top), bot: Array.from(M.bot), ev: Array.from(M.ev), resTop: Array.from(M.resTop),
            allTop: Array.from(M.allTop)};
  },
  allocator: function () {
    if (!A) return null;
    var p = explainParts(A.st);
    return {event: A.ev, reserved: p.reserved, byCategory: A.st.byCat, pending: p.pending, rounding: p.rounding,
            split: p.split, external: p.external, outside: p.outside, segments: p.segments};
  },
  ticks: function () { return byteTicks(M.ymax).map(function (t) { return t.text; }); },
  xTicks: function () { return xTicks(plotW() / (window.devicePixelRatio || 1)).map(function (t) { return t.text; }); },
  pools: function () { return state.poolLanes || []; },
  diff: function () { return state.diff || null; },
  compare: function (i) { $("diffbase").value = String(i); return renderDiff(); },
  colour: colour
};
