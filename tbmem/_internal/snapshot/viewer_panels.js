// --- text around the charts: summary, explain lines, legend, stacks, the peak table, the comparison ---
function showStack(a, into) {
  into.textContent = "";
  var free = (dev.flags[a] & FLAG_FREE_SITE) !== 0, pend = sel !== null && pendingAt(dev, a, sel);
  into.appendChild(el("div", fmtBytes(dev.size[a]) + "  " + SH.categories[dev.cat[a]] + (dev.round[a] ? "  (+" +
    fmtBytes(dev.round[a]) + " rounding)" : ""), "head"));
  into.appendChild(el("div", (dev.start[a] < 0 ? "allocated before the trace" : "allocated at " + when(dev.start[a])) +
    (dev.end[a] >= 0 ? ", freed at " + when(dev.end[a]) : (dev.flags[a] & FLAG_PENDING) ? ", free requested, not completed" :
     ", still alive") + (dev.freereq[a] >= 0 && dev.freereq[a] !== dev.end[a] ? "; free requested at " + when(dev.freereq[a]) : "") +
    (pend ? " (pending free at the selected event)" : "")));
  var sid = dev.stack[a];
  if (sid < 0) { into.appendChild(el("div", "(no stack recorded)", "note")); return; }
  var fr = SB.stacks[sid], uf = SB.user_frame[sid], shown = [], cpp = 0, internal = 0, more = 0;
  for (var k = 0; k < fr.length; k++) {
    var g = frame(fr[k]);
    if (g.kind === KIND_INTERNAL) { internal++; continue; }
    if (g.kind === KIND_CPP && !showCpp) { cpp++; continue; }
    if (shown.length >= MAX_FRAMES) { more++; continue; }
    shown.push(el("div", frameText(g) + (g.kind === KIND_GEN ? "  [torch.compile generated code]" : ""),
      fr[k] === uf ? "frame user" : g.kind === KIND_CPP ? "frame cpp" : g.kind === KIND_GEN ? "frame gen" : "frame"));
  }
  if (shown.length) {
    into.appendChild(el("div", free ? "stack recorded at its free (where it was allocated is not known):" :
                                      "stack at the allocation:", "note"));
    shown.forEach(function (n) { into.appendChild(n); });
  }
  var notes = [];
  if (more) notes.push(more + " more frames");
  if (cpp) notes.push(cpp + " C++ frames hidden (show C++ frames to see them)");
  if (internal) notes.push(internal + " frames of the stack capture and the interpreter hidden");
  if (notes.length) into.appendChild(el("div", (shown.length ? "... " : "") + notes.join(", "), "note"));
}

function renderPeak() {
  var body = $("peak").querySelector("tbody");
  body.textContent = "";
  prepare(dev);
  var alive = aliveAt(dev, dev.peakEv, true);
  alive.sort(function (x, y) { return dev.size[y] - dev.size[x]; });
  $("peaktitle").textContent = "Allocations alive at the peak of " + dev.d.device + " (" + fmtBytes(dev.peak) + ", " +
    (dev.peakEv < 0 ? "" : "at ") + when(dev.peakEv) + ", " + plural(alive.length, "allocation") +
    (alive.length > 200 ? ", largest 200" : "") + ")";
  alive.slice(0, 200).forEach(function (a) {
    var tr = document.createElement("tr");
    tr.appendChild(el("td", fmtBytes(dev.size[a])));
    tr.appendChild(el("td", SH.categories[dev.cat[a]]));
    tr.appendChild(el("td", siteText(a)));
    tr.addEventListener("click", function () { showStack(a, details); });
    body.appendChild(tr);
  });
}

function deviceName(h) { return h.device || "no device"; }
function summary() {
  var d = dev.d, parts = [];
  $("title").textContent = "tbmem memory snapshot: " + SH.kind + ", step " + SH.step + ", rank " + SH.rank +
    (HEAD.snapshots.length > 1 ? " (" + SH.name + ")" : "");
  if (!d.device) {
    parts.push("This snapshot holds no memory: no segments and no trace events.");
  } else {
    parts.push(SH.source + " on " + d.device + ": " + (d.reserved_bytes === null ? "no allocator segments (a CPU recording, or a capture without them: " +
      "reserved memory and the allocator's blocks are not known)" : "reserved " +
      fmtBytes(d.reserved_bytes)) + ", allocated " + fmtBytes(d.final_bytes) + " when the snapshot was taken, peak " +
      fmtBytes(d.peak[1]) + " " + (d.peak[0] < 0 ? "" : "at ") + when(d.peak[0]) + " | " + plural(d.n_events, "event") +
      ", " + plural(d.n_allocs, "allocation") + (d.n_events ? ", " + fmtBytes(d.baseline_bytes) + " alive before the first event" : "") +
      (d.dropped ? " | " + d.dropped + " older events dropped" : ""));
  }
  if (SH.t0_unix !== null) parts.push("trace began " + new Date(SH.t0_unix * 1000).toISOString());
  (d.ooms || []).forEach(function (o) {
    parts.push("OUT OF MEMORY at " + when(o.event) + ": requested " + fmtBytes(o.requested_bytes) +
      (o.free_bytes === null ? "" : ", " + fmtBytes(o.free_bytes) + " free on the device"));
    if (o.why) parts.push(o.why);  // issue 38: why, in numbers (tbmem._internal.oom)
  });
  if (SH.meta && SH.meta.exception) parts.push(SH.meta.exception);
  $("summary").textContent = parts.join("\n");
}
// one line per device: where its reserved bytes were when the snapshot was taken
function explainHeader() {
  var box = $("explain");
  box.textContent = "";
  SH.devices.forEach(function (h) {
    if (!h.device) return;
    // without segments the summary says so once (it was said here, on the reserved chart and in the allocator box)
    if (h.explain) box.appendChild(explainNode(explainFromDoc(h.explain), h.device + " when the snapshot was taken: "));
  });
}

function buildLegend() {
  var box = $("categories"), used = new Uint8Array(nC);
  box.textContent = "";
  for (var a = 0; a < dev.nA; a++) used[dev.band[a]] = 1;
  for (var c = 0; c < nC; c++) {
    if (!used[c]) continue;
    (function (c) {
      var lab = document.createElement("label"), b = document.createElement("input");
      b.type = "checkbox"; b.checked = catOn[c] === 1;
      b.addEventListener("change", function () { catOn[c] = b.checked ? 1 : 0; redrawAll(); });
      var sw = el("span", undefined, "swatch"); sw.style.background = bandColour(c);
      lab.appendChild(b); lab.appendChild(sw); lab.appendChild(document.createTextNode(bandName(c)));
      box.appendChild(lab);
    })(c);
  }
}

// --- comparing two snapshots of the page (the twin of tbmem/_internal/snapshot/diff.py) --------------------
function labelIn(sb, dv, a) {
  var sid = dv.stack[a], text;
  if (sid < 0) text = "(no stack recorded)";
  else if (sb.user_frame[sid] < 0) text = "(no user frame)";
  else {
    var f = sb.frames[sb.user_frame[sid]];
    text = sb.strings[f[2]] + " (" + sb.strings[f[0]] + ":" + f[1] + ")";
  }
  return (dv.flags[a] & FLAG_FREE_SITE) ? "(allocated before the trace; stack of its free) " + text : text;
}
function diffRows(sa, da, sb, db) {
  var rows = {}, seen = {}, totals = {a: 0, b: 0, na: 0, nb: 0};
  [["a", sa, da], ["b", sb, db]].forEach(function (side) {
    var dv = side[2], bd = body().snapshots[side[1]], cats = HEAD.snapshots[side[1]].categories;
    if (!dv) return;
    for (var a = 0; a < dv.nA; a++) {
      if (dv.end[a] >= 0) continue;  // alive when the snapshot was taken
      var label = labelIn(bd, dv, a), key = label + "\u0000" + cats[dv.cat[a]], r = rows[key];
      if (!r) r = rows[key] = {label: label, category: cats[dv.cat[a]], a_bytes: 0, b_bytes: 0, a_count: 0, b_count: 0,
                               new_bytes: 0, new_count: 0};
      r[side[0] + "_bytes"] += dv.size[a]; r[side[0] + "_count"]++;
      totals[side[0]] += dv.size[a]; totals["n" + side[0]]++;
      var ident = dv.addr[a] + "/" + dv.size[a] + "/" + label;
      if (side[0] === "a") seen[ident] = (seen[ident] || 0) + 1;
      else if (seen[ident] > 0) seen[ident]--;
      else { r.new_bytes += dv.size[a]; r.new_count++; }
    }
  });
  var out = Object.keys(rows).map(function (k) { var r = rows[k]; r.delta_bytes = r.b_bytes - r.a_bytes; return r; });
  var grew = out.filter(function (r) { return r.delta_bytes > 0; });
  grew.sort(function (x, y) { return y.delta_bytes - x.delta_bytes || y.new_bytes - x.new_bytes || (x.label < y.label ? -1 : 1); });
  // the same bytes as in A, allocated again since (as tbmem snapshot diff: not under "grew")
  var reallocated = out.filter(function (r) { return r.delta_bytes === 0 && r.new_bytes > 0; });
  reallocated.sort(function (x, y) { return y.new_bytes - x.new_bytes || (x.label < y.label ? -1 : 1); });
  var shrank = out.filter(function (r) { return r.delta_bytes < 0; });
  shrank.sort(function (x, y) { return x.delta_bytes - y.delta_bytes || (x.label < y.label ? -1 : 1); });
  return {grew: grew, reallocated: reallocated, shrank: shrank, totals: totals};
}
function setupDiff() {
  var box = $("diffbox"), sel2 = $("diffbase");
  box.hidden = HEAD.snapshots.length < 2;
  if (box.hidden) return;
  sel2.textContent = "";
  HEAD.snapshots.forEach(function (s, i) {
    if (i === snapIndex) return;
    var o = el("option", s.name); o.value = String(i); sel2.appendChild(o);
  });
  sel2.value = String(snapIndex > 0 ? snapIndex - 1 : (snapIndex + 1) % HEAD.snapshots.length);
  renderDiff();
}
function renderDiff() {
  var other = parseInt($("diffbase").value, 10), name = dev.d.device, tbody = $("difftable").querySelector("tbody");
  var di = HEAD.snapshots[other].devices.map(function (h) { return h.device; }).indexOf(name);
  var pending = di >= 0 ? loadDevice(other, di) : Promise.resolve(null);
  return pending.then(function (dvOther) {
    var r = diffRows(other, dvOther, snapIndex, dev), t = r.totals;
    tbody.textContent = "";
    $("diffsummary").textContent = name + ": allocated " + fmtBytes(t.a) + " (" + t.na + ") in " + HEAD.snapshots[other].name +
      " -> " + fmtBytes(t.b) + " (" + t.nb + ") here, " + (t.b >= t.a ? "+" : "-") + fmtBytes(Math.abs(t.b - t.a)) +
      (di < 0 ? " (" + name + " is not in " + HEAD.snapshots[other].name + ")" : "");
    r.grew.slice(0, 50).concat(r.reallocated.slice(0, 20), r.shrank.slice(0, 20)).forEach(function (row) {
      var tr = document.createElement("tr");
      [(row.delta_bytes >= 0 ? "+" : "-") + fmtBytes(Math.abs(row.delta_bytes)), fmtBytes(row.a_bytes), fmtBytes(row.b_bytes),
       fmtBytes(row.new_bytes) + " (" + row.new_count + ")", row.category, row.label].forEach(function (x) { tr.appendChild(el("td", x)); });
      tbody.appendChild(tr);
    });
    state.diff = r;
    return r;
  });
}
