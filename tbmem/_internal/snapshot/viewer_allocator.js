// --- the allocator view: every segment and its blocks at one event, as a map of the reserved bytes ---
var scanvas = $("segments"), sctx = scanvas.getContext("2d"), segtip = $("segtip");
var A = null;  // what the map shows: {ev, st, order, offs, bpr, rows, rowH}
var ROW_H = 16, PENDING = "#d62728", ROUNDING = "#444444";

function streamName(dv, s) {
  if (!s) return "default stream";
  var i = dv.d.streams.indexOf(s);
  return "stream " + (i >= 0 ? i : "?") + " (" + hex(s) + ")";
}
function poolName(p) {
  if (!p) return "pool not known";
  if (p[0] === 0 && p[1] === 0) return "default pool";
  return "private pool (" + p[0] + ", " + p[1] + "): a CUDA graph's or a MemPool's";
}
function segKind(g) {
  return (g.flags & SEG_EXPANDABLE ? "expandable" : g.flags & SEG_SMALL ? "small pool" : g.flags & SEG_LARGE ? "large pool" : "segment");
}
function isPrivate(dv, st, i) { var p = dv.seg.pool[st.first[i]], q = p >= 0 ? dv.d.pools[p] : null; return q && (q[0] || q[1]) ? 1 : 0; }

function renderAllocator(ev) {
  var t0 = performance.now(), box = $("allocbox");
  box.hidden = !dev.seg;  // nothing to show: the summary says why
  if (!dev.seg) {
    $("alloctitle").textContent = "Allocator state";
    $("allocexplain").textContent = "This snapshot has no allocator segments (a CPU recording, or a capture without " +
      "them): the segments and their blocks are not known.";
    scanvas.hidden = true; $("seglegend").textContent = ""; $("segtable").querySelector("tbody").textContent = "";
    state.allocDrawn = true;
    return 0;
  }
  scanvas.hidden = false;
  var st = allocatorState(dev, ev), n = st.n, i;
  T.allocState = performance.now() - t0;
  $("alloctitle").textContent = "Allocator state " + (ev >= 0 ? "after " : "") + when(ev) + ": " +
    plural(n, "segment") + ", " + plural(st.nb, "live block");
  var ex = $("allocexplain");
  ex.textContent = "";
  ex.appendChild(explainNode(explainParts(st), ""));
  // segments grouped by pool (the default pool first), then stream; by address within a group
  var gkey = new Float64Array(n), keys = new Map(), order = new Int32Array(n);
  for (i = 0; i < n; i++) {
    gkey[i] = isPrivate(dev, st, i) * 1e12 + segKey(dev, st, i);
    keys.set(gkey[i], (keys.get(gkey[i]) || 0) + 1);
  }
  if (keys.size === 1) {
    for (i = 0; i < n; i++) order[i] = i;
  } else {  // a stable bucket sort by group
    var at = new Map(), pos = 0;
    Array.from(keys.keys()).sort(function (x, y) { return x - y; }).forEach(function (key) { at.set(key, pos); pos += keys.get(key); });
    for (i = 0; i < n; i++) { var q = at.get(gkey[i]); order[q] = i; at.set(gkey[i], q + 1); }
  }
  var offs = new Float64Array(n + 1);
  for (i = 0; i < n; i++) offs[i + 1] = offs[i] + st.size[order[i]];
  A = {ev: ev, st: st, order: order, offs: offs, gkey: gkey};
  T.allocOrder = performance.now() - t0;
  drawSegments();
  T.allocDraw = performance.now() - t0;
  segLegend(st, order);
  segTable(st);
  state.allocDrawn = true;
  T.allocator = performance.now() - t0;
  return T.allocator;
}

function drawSegments() {
  var rect = scanvas.getBoundingClientRect(), dpr = window.devicePixelRatio || 1;
  scanvas.width = Math.max(300, Math.round(rect.width * dpr));
  scanvas.height = Math.max(80, Math.round(rect.height * dpr));
  var W = scanvas.width - 2 * 6 * dpr, rowH = ROW_H * dpr, rows = Math.max(1, Math.floor((scanvas.height - 4 * dpr) / rowH));
  var n = A.order.length, total = A.offs[n] || 1, bpr = total / rows, x0 = 6 * dpr, st = A.st, k, j;
  A.bpr = bpr; A.rows = rows; A.rowH = rowH; A.W = W; A.x0 = x0;
  sctx.fillStyle = "#fff"; sctx.fillRect(0, 0, scanvas.width, scanvas.height);
  function span(p, len, style) {
    sctx.fillStyle = style;
    while (len > 0) {
      var r = Math.min(rows - 1, Math.floor(p / bpr)), avail = (r + 1) * bpr - p, take = Math.min(len, avail);
      if (take <= 0) take = len;
      sctx.fillRect(x0 + (p - r * bpr) / bpr * W, 2 * dpr + r * rowH, Math.max(take / bpr * W, 0.6), rowH - 3 * dpr);
      p += take; len -= take;
    }
  }
  span(0, total, "#f3f3f3");  // free bytes of the segments: pale
  for (k = 0; k < n; k++) {
    var g = A.order[k], base = A.offs[k];
    for (j = st.bstart[g]; j < st.bstart[g + 1]; j++) {
      var a = st.blocks[j], off = base + dev.addr[a] - st.addr[g];
      span(off, dev.size[a], st.bpend[j] ? PENDING : colour(SH.categories[dev.cat[a]]));
      if (st.bround[j] > 0) span(off + dev.size[a], st.bround[j], ROUNDING);
    }
  }
  // segment boundaries where they are wide enough to see; group boundaries always
  var last = null;
  for (k = 0; k <= n; k++) {
    var gk = k < n ? A.gkey[A.order[k]] : null, wide = k < n && st.size[A.order[k]] / bpr * W >= 3 * dpr, group = gk !== last;
    if (wide || group || k === n) {
      var p = A.offs[k], r = Math.min(rows - 1, Math.floor(p / bpr)), x = x0 + (p - r * bpr) / bpr * W;
      sctx.fillStyle = group ? "#000" : "#666";
      sctx.fillRect(Math.round(x), 2 * dpr + r * rowH - (group ? 2 * dpr : 0), group ? 2 * dpr : 1, rowH - 3 * dpr + (group ? 2 * dpr : 0));
    }
    last = gk;
  }
}

function segLegend(st, order) {
  var box = $("seglegend"), seen = {}, groups = [], j;
  box.textContent = "";
  function item(c, text) {
    var s = el("span"), sw = el("span", undefined, "swatch");
    sw.style.background = c; s.appendChild(sw); s.appendChild(document.createTextNode(text)); box.appendChild(s);
  }
  for (j = 0; j < st.nb; j++) if (!st.bpend[j]) seen[SH.categories[dev.cat[st.blocks[j]]]] = 1;
  Object.keys(seen).sort().forEach(function (c) { item(colour(c), c); });
  item(PENDING, "pending free (a stream still used it)");
  item(ROUNDING, "rounding");
  item("#f3f3f3", "free in a segment");
  for (j = 0; j < order.length; j++) {
    var i = order[j], key = A.gkey[i], last = groups[groups.length - 1];
    if (last && last.key === key) { last.bytes += st.size[i]; last.n++; } else groups.push({key: key, i: i, bytes: st.size[i], n: 1});
  }
  box.appendChild(el("span", "| in order: " + groups.map(function (q) {
    var g = segOf(dev, st, q.i);
    return poolName(g.pool) + ", " + streamName(dev, g.stream) + ": " + plural(q.n, "segment") + ", " + fmtBytes(q.bytes);
  }).join("; ") + " (black lines separate them)", "note"));
}

function blockSites(g, n) {
  var bs = g.blocks.slice().sort(function (x, y) { return dev.size[y.a] - dev.size[x.a]; });
  return bs.slice(0, n).map(function (b) { return fmtBytes(dev.size[b.a]) + " " + siteText(b.a); });
}
// the first 60 of ``list`` in the order ``before`` after adding k (kept sorted; n log 60 for n segments)
function keep60(list, k, before) {
  if (list.length === 60 && !before(k, list[59])) return;
  var lo = 0, hi = list.length;
  while (lo < hi) { var mid = (lo + hi) >> 1; if (before(k, list[mid])) hi = mid; else lo = mid + 1; }
  list.splice(lo, 0, k);
  if (list.length > 60) list.pop();
}
function segTable(st) {
  var tbody = $("segtable").querySelector("tbody"), held = [], spare = [], n_held = 0, k, total = st.n;
  tbody.textContent = "";
  // those that cannot be released, most free bytes held first; then the largest releasable ones
  function heldFirst(x, y) { return st.gFree[x] > st.gFree[y] || (st.gFree[x] === st.gFree[y] && st.size[x] > st.size[y]); }
  function larger(x, y) { return st.size[x] > st.size[y]; }
  for (k = 0; k < total; k++) {
    if (st.bstart[k + 1] > st.bstart[k]) { n_held++; keep60(held, k, heldFirst); } else keep60(spare, k, larger);
  }
  var rows = held.concat(spare);
  rows.slice(0, 60).forEach(function (i) {
    var g = segOf(dev, st, i), tr = document.createElement("tr");
    [hex(g.addr) + " " + segKind(g), fmtBytes(g.size), streamName(dev, g.stream) + " / " + poolName(g.pool).split(":")[0],
     fmtBytes(g.allocated), fmtBytes(g.pending), fmtBytes(g.rounding), fmtBytes(g.free),
     g.blocks.length ? plural(g.blocks.length, "block") + "; largest: " + blockSites(g, 1)[0] : "nothing: releasable"
    ].forEach(function (t) { tr.appendChild(el("td", t)); });
    tr.addEventListener("click", function () { showSegment(g, details); });
    tbody.appendChild(tr);
  });
  if (total > 60) {
    var more = document.createElement("tr");
    more.appendChild(el("td", "... " + (total - Math.min(n_held + spare.length, 60)) + " more segments", "note"));
    tbody.appendChild(more);
  }
}
function showSegment(g, into) {
  into.textContent = "";
  into.appendChild(el("div", "segment " + hex(g.addr) + ", " + fmtBytes(g.size) + " (" + segKind(g) + ")", "head"));
  into.appendChild(el("div", streamName(dev, g.stream) + ", " + poolName(g.pool)));
  into.appendChild(el("div", "allocated " + fmtBytes(g.allocated) + ", pending free " + fmtBytes(g.pending) + ", rounding " +
    fmtBytes(g.rounding) + ", free " + fmtBytes(g.free) + (g.blocks.length ? " (inactive split: kept reserved by " +
    plural(g.blocks.length, "live block") + ")" : " (nothing alive: torch.cuda.empty_cache() would release it)")));
  if (g.blocks.length) {
    into.appendChild(el("div", "blocks keeping it, largest first:", "note"));
    blockSites(g, 20).forEach(function (t) { into.appendChild(el("div", t, "frame")); });
  }
  if (g.stack >= 0) {
    into.appendChild(el("div", "stack of the segment's allocation:", "note"));
    SB.stacks[g.stack].slice(0, MAX_FRAMES).forEach(function (fid) {
      var f = frame(fid);
      if (f.kind !== KIND_INTERNAL && (showCpp || f.kind !== KIND_CPP)) into.appendChild(el("div", frameText(f), "frame"));
    });
  }
}
// the segment and block under a point of the map
function segHit(cx, cy) {
  if (!A || !A.bpr) return null;
  var dpr = window.devicePixelRatio || 1, px = cx * scanvas.width / scanvas.clientWidth, py = cy * scanvas.height / scanvas.clientHeight;
  var r = Math.floor((py - 2 * dpr) / A.rowH), st = A.st;
  if (r < 0 || r >= A.rows || px < A.x0 || px > A.x0 + A.W) return null;
  var p = r * A.bpr + (px - A.x0) / A.W * A.bpr, lo = 0, hi = A.order.length - 1;
  while (lo <= hi) { var mid = (lo + hi) >> 1; if (p < A.offs[mid]) hi = mid - 1; else lo = mid + 1; }
  if (hi < 0 || hi >= A.order.length) return null;
  var i = A.order[hi], addr = st.addr[i] + (p - A.offs[hi]), blk = null;
  for (var j = st.bstart[i]; j < st.bstart[i + 1]; j++) {
    var a = st.blocks[j];
    if (addr >= dev.addr[a] && addr < dev.addr[a] + dev.size[a] + st.bround[j]) blk = {a: a, round: st.bround[j], pending: st.bpend[j] === 1};
  }
  return {seg: segOf(dev, st, i), block: blk};
}
function segHover(ev) {
  var r = scanvas.getBoundingClientRect(), h = segHit(ev.clientX - r.left, ev.clientY - r.top);
  if (!h) { segtip.hidden = true; return; }
  segtip.textContent = "";
  if (h.block) {
    var b = h.block;
    segtip.appendChild(el("div", fmtBytes(dev.size[b.a]) + " " + (b.pending ? "pending free" : SH.categories[dev.cat[b.a]]) +
      " at " + hex(dev.addr[b.a]) + (b.round ? " (+" + fmtBytes(b.round) + " rounding)" : ""), "head"));
    segtip.appendChild(el("div", siteText(b.a)));
  } else {
    segtip.appendChild(el("div", "free bytes of segment " + hex(h.seg.addr), "head"));
  }
  segtip.appendChild(el("div", "segment " + fmtBytes(h.seg.size) + ", " + streamName(dev, h.seg.stream) + ", " + poolName(h.seg.pool)));
  segtip.hidden = false;
  var box = $("allocbox").getBoundingClientRect(), left = ev.clientX - box.left + 14;
  if (left + segtip.offsetWidth > box.width) left = Math.max(0, ev.clientX - box.left - 14 - segtip.offsetWidth);
  segtip.style.left = left + "px"; segtip.style.top = (ev.clientY - box.top + 14) + "px";
}
scanvas.addEventListener("mousemove", segHover);
scanvas.addEventListener("mouseleave", function () { segtip.hidden = true; });
scanvas.addEventListener("click", function (ev) {
  var r = scanvas.getBoundingClientRect(), h = segHit(ev.clientX - r.left, ev.clientY - r.top);
  if (h && h.block) showStack(h.block.a, details); else if (h) showSegment(h.seg, details);
});
