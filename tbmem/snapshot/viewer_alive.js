// --- which allocations are alive at an event: checkpoints every K events, then the events since ---
var K = 8192;
function buildAlive(dv) {
  var nA = dv.nA, pos = new Int32Array(nA).fill(-1), list = new Int32Array(nA), n = 0, cps = [];
  for (var a = 0; a < nA; a++) if (dv.start[a] < 0) { pos[a] = n; list[n++] = a; }
  dv.before = list.slice(0, n);  // alive before the first event
  for (var e = 0; e < dv.nE; e++) {
    if (e % K === 0) cps.push(list.slice(0, n));
    var al = dv.evAlloc[e];
    if (al < 0) continue;
    if (dv.evDelta[e] > 0) { pos[al] = n; list[n++] = al; }
    else if (pos[al] >= 0) { var last = list[--n]; list[pos[al]] = last; pos[last] = pos[al]; pos[al] = -1; }
  }
  dv.checkpoints = cps;
}
// the allocations alive right after event ev (-1: before the first), sorted by index;
// ``filtered``: only those the category and size filters show
function aliveAt(dv, ev, filtered) {
  if (!dv.checkpoints) buildAlive(dv);
  var out = [], seen = new Set(), e, i;
  function consider(a) {
    if (seen.has(a)) return;
    seen.add(a);
    if (dv.start[a] <= ev && (dv.end[a] < 0 || dv.end[a] > ev) && (!filtered || included(dv, a))) out.push(a);
  }
  if (ev < 0 || !dv.checkpoints.length) {
    for (i = 0; i < dv.before.length; i++) consider(dv.before[i]);
  } else {
    var c = Math.min(dv.checkpoints.length - 1, Math.floor(ev / K)), cp = dv.checkpoints[c];
    for (i = 0; i < cp.length; i++) consider(cp[i]);
    for (e = c * K; e <= ev && e < dv.nE; e++) if (dv.evAlloc[e] >= 0 && dv.evDelta[e] > 0) consider(dv.evAlloc[e]);
  }
  return out.sort(function (x, y) { return x - y; });
}
function included(dv, a) { return catOn[dv.band[a]] === 1 && dv.size[a] >= minSize; }

// a free requested but not completed at ev: its free_requested came before, or (known only from the
// final state) it was pending when the snapshot was taken and ev is the last event
function pendingAt(dv, a, ev) {
  var r = dv.freereq[a];
  if (r >= 0) return r <= ev;
  return (dv.flags[a] & FLAG_PENDING) !== 0 && dv.end[a] < 0 && ev >= dv.nE - 1;
}

// --- the allocator's state at an event (the twin of tbmem/snapshot/allocator.py) -------------------
// reserved = allocated by category + pending free + rounding + inactive split + free segments
var NO_BLOCKS = [];  // shared by every segment without a live block (most, in some traces)
function allocatorState(dv, ev) {
  var S = dv.seg, segs = [], k, j;
  if (S) {
    for (k = 0; k < S.n; k++) {  // sorted by address; contiguous mapped ranges of an expandable segment merge
      if (!(S.start[k] <= ev && (S.end[k] < 0 || S.end[k] > ev))) continue;
      var stream = S.stream[k] >= 0 ? dv.d.streams[S.stream[k]] : 0, prev = segs[segs.length - 1];
      if (prev && (S.flags[k] & SEG_EXPANDABLE) && (prev.flags & SEG_EXPANDABLE) && prev.addr + prev.size === S.addr[k] &&
          prev.stream === stream) { prev.size += S.size[k]; continue; }
      segs.push({addr: S.addr[k], size: S.size[k], stream: stream, pool: S.pool[k] >= 0 ? dv.d.pools[S.pool[k]] : null,
                 flags: S.flags[k], stack: S.stack[k], key: (S.pool[k] + 1) * 1048576 + S.stream[k],
                 allocated: 0, pending: 0, rounding: 0, free: 0, blocks: NO_BLOCKS});
    }
  }
  var alive = aliveAt(dv, ev, false), st = {event: ev, segments: segs, byCat: {}, pending: 0, rounding: 0,
    split: 0, freeSegs: 0, outside: 0, reserved: 0, allocated: 0};
  // each block in its segment, by address (binary search over the segment starts)
  var where = alive.map(function (a) {
    var lo = 0, hi = segs.length - 1, x = dv.addr[a];
    while (lo <= hi) { var mid = (lo + hi) >> 1; if (x < segs[mid].addr) hi = mid - 1; else lo = mid + 1; }
    return hi >= 0 && x < segs[hi].addr + segs[hi].size ? hi : -1;
  });
  var order = alive.map(function (_a, i) { return i; });
  order.sort(function (x, y) { return where[x] - where[y] || dv.addr[alive[x]] - dv.addr[alive[y]]; });
  for (j = 0; j < order.length; j++) {
    var i = order[j], a = alive[i], s = where[i];
    if (s < 0) { st.outside += dv.size[a]; continue; }
    var seg = segs[s], nxt = j + 1 < order.length && where[order[j + 1]] === s ? dv.addr[alive[order[j + 1]]]
      : seg.addr + seg.size;
    var r = Math.max(0, Math.min(dv.round[a], nxt - dv.addr[a] - dv.size[a])), pend = pendingAt(dv, a, ev);
    if (seg.blocks === NO_BLOCKS) seg.blocks = [];
    seg.blocks.push({a: a, round: r, pending: pend});
    seg.rounding += r;
    if (pend) seg.pending += dv.size[a];
    else {
      seg.allocated += dv.size[a];
      var name = SH.categories[dv.cat[a]];
      st.byCat[name] = (st.byCat[name] || 0) + dv.size[a];
    }
  }
  for (k = 0; k < segs.length; k++) {
    var g = segs[k];
    g.free = g.size - g.allocated - g.pending - g.rounding;
    if (g.blocks.length) st.split += g.free; else st.freeSegs += g.free;
    st.reserved += g.size; st.allocated += g.allocated; st.pending += g.pending; st.rounding += g.rounding;
  }
  return st;
}
function explainParts(st) {
  // [label, bytes, note] in the order of the identity
  var cats = Object.keys(st.byCat).sort(function (x, y) { return st.byCat[y] - st.byCat[x]; });
  return {reserved: st.reserved, cats: cats.map(function (c) { return [c, st.byCat[c]]; }), pending: st.pending,
          internal: st.rounding + st.split, rounding: st.rounding, split: st.split, external: st.freeSegs,
          releasable: st.segments.reduce(function (n, g) { return n + (g.blocks.length ? 0 : 1); }, 0),
          segments: st.segments.length, outside: st.outside};
}
// the explain line from Python's document (stats --json "explain") or from allocatorState
function explainFromDoc(x) {
  var cats = Object.keys(x.allocated_by_category).sort(function (p, q) {
    return x.allocated_by_category[q] - x.allocated_by_category[p]; });
  return {reserved: x.reserved_bytes, cats: cats.map(function (c) { return [c, x.allocated_by_category[c]]; }),
          pending: x.pending_free_bytes, internal: x.rounding_bytes + x.inactive_split_bytes, rounding: x.rounding_bytes,
          split: x.inactive_split_bytes, external: x.free_segment_bytes, releasable: x.releasable_segments,
          segments: x.segments, outside: x.outside_segments_bytes};
}
function explainNode(p, prefix) {
  var box = el("div", undefined, "explain"), allocated = 0;
  p.cats.forEach(function (c) { allocated += c[1]; });
  box.appendChild(el("span", prefix));
  box.appendChild(el("b", "reserved " + fmtBytes(p.reserved)));
  box.appendChild(el("span", " = allocated " + fmtBytes(allocated) + " ("));
  p.cats.forEach(function (c, i) {
    var sw = el("span", undefined, "swatch"); sw.style.background = colour(c[0]);
    box.appendChild(sw);
    box.appendChild(el("span", c[0] + " " + fmtBytes(c[1]) + (i + 1 < p.cats.length ? ", " : "")));
  });
  box.appendChild(el("span", (p.cats.length ? "" : "nothing") + ") + pending free " + fmtBytes(p.pending) +
    " + internal fragmentation " + fmtBytes(p.internal) + " (rounding " + fmtBytes(p.rounding) + ", inactive split " +
    fmtBytes(p.split) + ") + external free " + fmtBytes(p.external) + " (" + p.releasable + " of " +
    plural(p.segments, "segment") + " hold nothing: torch.cuda.empty_cache() returns them)" +
    (p.outside ? "; " + fmtBytes(p.outside) + " allocated outside every segment of the file" : "")));
  return box;
}
