/* tbmem offline snapshot viewer: shared state, formatting and decoding. No network access, no
 * third-party code. Every string from a snapshot reaches the page through textContent only.
 * The page runs viewer_base, viewer_alive, viewer_timeline, viewer_allocator, viewer_panels and
 * viewer_main in this order, inside one function: they share its variables. */
var T = {start: performance.now()};
var HEAD = JSON.parse(document.getElementById("tbmem-head").textContent);
var BODY = null;  // the columns: parsed after the first paint
T.parsed = performance.now();
var COLOURS = HEAD.colours;
var FLAG_FREE_SITE = 1, FLAG_PENDING = 2, SEG_EXPANDABLE = 1, SEG_SMALL = 2, SEG_LARGE = 4, MAX_FRAMES = 14;
var KIND_USER = 0, KIND_CPP = 2, KIND_GEN = 3, KIND_INTERNAL = 4;
var snapIndex = HEAD.snapshots.length ? 0 : -1;  // the snapshot shown
var SH = HEAD.snapshots[0];                      // its head document
var SB = null;                                   // its columns document (strings, frames, stacks)
var nC = SH.categories.length;                   // one band per category
var dev = null;                                  // the decoded device shown
var catOn = new Uint8Array(nC).fill(1), minSize = 0, showCpp = false, useTime = true;
var state = {drawn: false, exact: false};

function $(id) { return document.getElementById(id); }
function el(tag, text, cls) {
  var e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
function colour(name) {
  if (COLOURS[name]) return COLOURS[name];
  var h = 0;
  for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
  return "hsl(" + (h % 360) + ",55%,55%)";
}
function bandColour(c) { return colour(SH.categories[c]); }
function bandName(c) { return SH.categories[c]; }
function bandOrder() { var o = []; for (var c = 0; c < nC; c++) o.push(c); return o; }

var UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
function fmtBytes(n) {
  var k = 0, neg = n < 0;
  n = Math.abs(n);
  while (n >= 1024 && k < UNITS.length - 1) { n /= 1024; k++; }
  return (neg ? "-" : "") + (k === 0 ? n.toFixed(0) : n.toFixed(2)) + " " + UNITS[k];
}
// one unit for a whole axis: the one its tick step reads best in, with the decimals the step needs
var TIME_UNITS = [{name: "us", us: 1}, {name: "ms", us: 1e3}, {name: "s", us: 1e6}, {name: "min", us: 6e7}];
function timeUnit(step) {
  var u = TIME_UNITS[0];
  for (var i = 0; i < TIME_UNITS.length; i++) if (step >= TIME_UNITS[i].us * 0.999) u = TIME_UNITS[i];
  var digits = Math.max(0, Math.min(6, Math.ceil(-Math.log10(step / u.us) - 1e-9)));
  return {name: u.name, us: u.us, digits: digits};
}
function fmtTime(us, unit) {
  var u = unit || timeUnit(Math.max(Math.abs(us) / 10, 1));
  if (!unit) u.digits = Math.max(u.digits, 3);
  return (us / u.us).toFixed(u.digits) + " " + u.name;
}
function hex(n) { return "0x" + Math.round(n).toString(16); }
function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }

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
function body() {
  if (!BODY) { BODY = JSON.parse($("tbmem-data").textContent); T.bodyParsed = performance.now(); }
  return BODY;
}

var cache = {};
var ALLOC_COLS = ["start", "end", "size", "category", "stack", "flags", "freereq", "round", "addr"];
var SEG_COLS = ["addr", "size", "start", "end", "stream", "pool", "stack", "flags"];
// one device of one snapshot, decoded: allocations, per-event deltas, segment pieces
function loadDevice(si, di) {
  var key = si + ":" + di;
  if (cache[key]) return Promise.resolve(cache[key]);
  var h = HEAD.snapshots[si].devices[di], b = body().snapshots[si].devices[di];
  var parts = [column(b.time_us)].concat(ALLOC_COLS.map(function (n) { return column(b.cols[n]); }));
  if (b.segs) parts = parts.concat(SEG_COLS.map(function (n) { return column(b.segs[n]); }));
  return Promise.all(parts).then(function (arr) {
    T.inflated = performance.now();
    var nE = h.n_events, nA = h.n_allocs, k, nCat = HEAD.snapshots[si].categories.length;
    // times arrive as differences; the axis uses their running maximum (clocks may step back)
    var dt = arr[0], tm = new Float64Array(nE), acc = 0, mx = -Infinity;
    for (k = 0; k < nE; k++) { acc += dt[k]; if (acc > mx) mx = acc; tm[k] = mx; }
    var ds = arr[1], start = new Int32Array(nA), sacc = 0;
    for (k = 0; k < nA; k++) { sacc += ds[k]; start[k] = sacc - 1; }
    var dl = arr[2], end = new Int32Array(nA), fr = arr[7], freereq = new Int32Array(nA);
    var addr = new Float64Array(nA), off = arr[9], base = h.addr_base, align = h.addr_align;
    for (k = 0; k < nA; k++) {
      var from = start[k] < 0 ? -1 : start[k];
      end[k] = dl[k] === 0 ? -1 : from + dl[k];            // lifetimes: end - start, 0 = still alive
      // free requests back from the end (from the start while alive), 0 = none
      freereq[k] = fr[k] === 0 ? -1 : end[k] >= 0 ? end[k] - fr[k] + 1 : Math.max(from, 0) + fr[k] - 1;
      addr[k] = base + off[k] * align;
    }
    // rounding: the allocator's least (to 512 bytes) plus what the page says beyond it
    var sz = arr[3], rd = new Float64Array(nA);
    for (k = 0; k < nA; k++) rd[k] = Math.max(512, Math.ceil(sz[k] / 512) * 512) - sz[k] + arr[8][k];
    var out = {si: si, di: di, d: h, nE: nE, nA: nA, tmono: tm, start: start, end: end, size: arr[3], cat: arr[4],
               stack: arr[5], flags: arr[6], freereq: freereq, round: rd, addr: addr, nCat: nCat};
    // per event: the allocation it starts or ends, the signed size, its band
    var evAlloc = new Int32Array(nE).fill(-1), evDelta = new Float64Array(nE), band = new Uint8Array(nA);
    var evBand = new Uint8Array(nE), size = out.size, cat = out.cat;
    for (k = 0; k < nA; k++) {
      var bnd = cat[k];  // by category, what was alive before the trace too (its tooltip says so)
      band[k] = bnd;
      if (start[k] >= 0) { evAlloc[start[k]] = k; evDelta[start[k]] = size[k]; evBand[start[k]] = bnd; }
      if (end[k] >= 0) { evAlloc[end[k]] = k; evDelta[end[k]] = -size[k]; evBand[end[k]] = bnd; }
    }
    out.band = band; out.evAlloc = evAlloc; out.evDelta = evDelta; out.evBand = evBand;
    if (b.segs) decodeSegments(out, arr.slice(10), h);
    cache[key] = out;
    T.decoded = performance.now();
    return out;
  });
}
// segment pieces (sorted by address), and the reserved bytes each event adds or frees (sparse)
function decodeSegments(out, a, h) {
  var n = a[1].length, k, addr = new Float64Array(n);
  for (k = 0; k < n; k++) addr[k] = h.addr_base + a[0][k] * h.addr_align;
  out.seg = {n: n, addr: addr, size: a[1], start: a[2], end: a[3], stream: a[4], pool: a[5], stack: a[6], flags: a[7]};
  var ev = [], dl = [];
  for (k = 0; k < n; k++) {
    if (a[2][k] >= 0) { ev.push(a[2][k]); dl.push(a[1][k]); }
    if (a[3][k] >= 0) { ev.push(a[3][k]); dl.push(-a[1][k]); }
  }
  var order = ev.map(function (_e, i) { return i; }).sort(function (x, y) { return ev[x] - ev[y]; });
  out.resEv = new Int32Array(order.length); out.resDelta = new Float64Array(order.length);
  order.forEach(function (o, i) { out.resEv[i] = ev[o]; out.resDelta[i] = dl[o]; });
}

// --- frames and sites ---------------------------------------------------------------------------
function frame(fid) {
  var f = SB.frames[fid];
  return {file: SB.strings[f[0]], line: f[1], name: SB.strings[f[2]], kind: SB.frame_kinds[fid]};
}
function frameText(f) { return f ? f.name + " (" + f.file + ":" + f.line + ")" : "(no user frame)"; }
function userFrame(sid) { return sid < 0 || SB.user_frame[sid] < 0 ? null : frame(SB.user_frame[sid]); }
function siteOf(dv, a) {
  var sid = dv.stack[a];
  if (sid < 0) return "(no stack recorded)";
  var text = frameText(userFrame(sid));
  return (dv.flags[a] & FLAG_FREE_SITE) ? "(allocated before the trace; stack of its free) " + text : text;
}
function siteText(a) {
  var text = siteOf(dev, a), sid = dev.stack[a];
  if (sid >= 0 && SB.gen_frame[sid] >= 0 && SB.user_frame[sid] >= 0) text += " [torch.compile generated code]";
  return text;
}
function when(e) {
  if (e < 0) return dev && dev.nE ? "before the first event" : "when the snapshot was taken";
  return "event " + e + (dev.d.has_time ? " (+" + fmtTime(dev.tmono[e]) + ")" : "");
}
