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

// --- the allocator's state at an event (the twin of tbmem/_internal/snapshot/allocator.py) -------------------
// reserved = allocated by category + pending free + rounding + inactive split + free segments.
// Segments and their blocks as typed arrays (a trace may hold hundreds of thousands of segments):
// per segment i (by address) its first piece first[i], addr, size and the bytes gAlloc, gPend, gRound,
// gFree; its blocks blocks[bstart[i] .. bstart[i + 1]) (allocation indices, by address) with their
// rounding bround and pending flag bpend. segOf() makes the object of one segment where one is shown.
function rawStream(dv, k) { var s = dv.seg.stream[k]; return s >= 0 ? dv.d.streams[s] : 0; }
function allocatorState(dv, ev) {
  var S = dv.seg, n = 0, k, j;
  var first = new Int32Array(S ? S.n : 0), addr = new Float64Array(S ? S.n : 0), size = new Float64Array(S ? S.n : 0);
  for (k = 0; S && k < S.n; k++) {  // sorted by address; contiguous mapped ranges of an expandable segment merge
    if (!(S.start[k] <= ev && (S.end[k] < 0 || S.end[k] > ev))) continue;
    if (n && (S.flags[k] & SEG_EXPANDABLE) && (S.flags[first[n - 1]] & SEG_EXPANDABLE) &&
        addr[n - 1] + size[n - 1] === S.addr[k] && rawStream(dv, first[n - 1]) === rawStream(dv, k)) {
      size[n - 1] += S.size[k];
      continue;
    }
    first[n] = k; addr[n] = S.addr[k]; size[n] = S.size[k]; n++;
  }
  var alive = aliveAt(dv, ev, false), m = alive.length, ord = Int32Array.from(alive);
  ord.sort(function (x, y) { return dv.addr[x] - dv.addr[y] || x - y; });  // by address: by segment, in order
  var st = {event: ev, n: n, first: first, addr: addr, size: size, gAlloc: new Float64Array(n),
    gPend: new Float64Array(n), gRound: new Float64Array(n), gFree: new Float64Array(n), bstart: new Int32Array(n + 1),
    blocks: new Int32Array(m), bround: new Float64Array(m), bpend: new Uint8Array(m), nb: 0, byCat: {}, pending: 0,
    rounding: 0, split: 0, freeSegs: 0, outside: 0, reserved: 0, allocated: 0, releasable: 0};
  var g = 0, nb = 0, count = new Int32Array(n);
  for (j = 0; j < m; j++) {
    var a = ord[j], x = dv.addr[a];
    while (g < n && addr[g] + size[g] <= x) g++;
    if (g >= n || x < addr[g]) { st.outside += dv.size[a]; continue; }
    var end = addr[g] + size[g], nxt = j + 1 < m && dv.addr[ord[j + 1]] < end ? dv.addr[ord[j + 1]] : end;
    var r = Math.max(0, Math.min(dv.round[a], nxt - x - dv.size[a])), pend = pendingAt(dv, a, ev);
    st.blocks[nb] = a; st.bround[nb] = r; st.bpend[nb] = pend ? 1 : 0; nb++; count[g]++;
    st.gRound[g] += r;
    if (pend) st.gPend[g] += dv.size[a];
    else {
      st.gAlloc[g] += dv.size[a];
      var name = SH.categories[dv.cat[a]];
      st.byCat[name] = (st.byCat[name] || 0) + dv.size[a];
    }
  }
  st.nb = nb;
  for (g = 0; g < n; g++) {
    st.bstart[g + 1] = st.bstart[g] + count[g];
    var free = st.gFree[g] = size[g] - st.gAlloc[g] - st.gPend[g] - st.gRound[g];
    if (count[g]) st.split += free; else { st.freeSegs += free; st.releasable++; }
    st.reserved += size[g]; st.allocated += st.gAlloc[g]; st.pending += st.gPend[g]; st.rounding += st.gRound[g];
  }
  return st;
}
// segment i of an allocator state as an object (for the table, the details and the tooltip)
function segOf(dv, st, i) {
  var k = st.first[i], S = dv.seg, blocks = [];
  for (var j = st.bstart[i]; j < st.bstart[i + 1]; j++) blocks.push({a: st.blocks[j], round: st.bround[j], pending: st.bpend[j] === 1});
  return {i: i, addr: st.addr[i], size: st.size[i], stream: rawStream(dv, k), pool: S.pool[k] >= 0 ? dv.d.pools[S.pool[k]] : null,
          flags: S.flags[k], stack: S.stack[k], key: segKey(dv, st, i), allocated: st.gAlloc[i], pending: st.gPend[i],
          rounding: st.gRound[i], free: st.gFree[i], blocks: blocks};
}
// the group of segment i: its memory pool, then its stream
function segKey(dv, st, i) { var k = st.first[i]; return (dv.seg.pool[k] + 1) * 1048576 + dv.seg.stream[k]; }
function explainParts(st) {
  // [label, bytes, note] in the order of the identity
  var cats = Object.keys(st.byCat).sort(function (x, y) { return st.byCat[y] - st.byCat[x]; });
  return {reserved: st.reserved, cats: cats.map(function (c) { return [c, st.byCat[c]]; }), pending: st.pending,
          internal: st.rounding + st.split, rounding: st.rounding, split: st.split, external: st.freeSegs,
          releasable: st.releasable, segments: st.n, outside: st.outside};
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
