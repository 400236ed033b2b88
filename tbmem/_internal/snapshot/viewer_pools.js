// --- the reserved timeline per memory pool: one lane each (default, CUDA graphs', MemPools') ---
// a lane per pool the device's segments name, drawn only when one of them is a private pool (a
// default-pool-only trace would repeat the reserved chart); each lane scaled to the chart's maximum
// so lanes compare by height, and labelled with the pool's most reserved bytes in view
function poolSeries(dv) {
  if (dv.poolSeries !== undefined) return dv.poolSeries;
  var out = null, S = dv.seg;
  if (S) {
    var by = {}, k, p, any = false;
    for (k = 0; k < S.n; k++) {
      p = S.pool[k];
      if (!by[p]) by[p] = {pool: p, base: 0, ev: [], dl: []};
      var q = by[p];
      if (S.start[k] < 0) q.base += S.size[k]; else { q.ev.push(S.start[k]); q.dl.push(S.size[k]); }
      if (S.end[k] >= 0) { q.ev.push(S.end[k]); q.dl.push(-S.size[k]); }
      var id = p >= 0 ? dv.d.pools[p] : null;
      if (id && (id[0] || id[1])) any = true;
    }
    if (any) {
      out = Object.keys(by).map(function (key) {
        var q = by[key], order = q.ev.map(function (_e, i) { return i; }).sort(function (x, y) { return q.ev[x] - q.ev[y]; });
        return {pool: q.pool, id: q.pool >= 0 ? dv.d.pools[q.pool] : null, base: q.base,
                ev: Int32Array.from(order.map(function (i) { return q.ev[i]; })),
                dl: Float64Array.from(order.map(function (i) { return q.dl[i]; }))};
      }).sort(function (a, b) {  // not known first, then by id: the default pool (0, 0) before the private ones
        if (!a.id || !b.id) return (a.id ? 1 : 0) - (b.id ? 1 : 0);
        return a.id[0] - b.id[0] || a.id[1] - b.id[1];
      });
    }
  }
  dv.poolSeries = out;
  return out;
}
// per column: the most bytes the pool reserved across it (the state carried in, then its events)
function poolColumns(q, cols) {
  var x0 = V.x0, span = V.x1 - V.x0, e0 = firstAtOrAfter(V.x0), timed = timeAxis(), res = q.base, i = 0, n = q.ev.length;
  while (i < n && q.ev[i] < e0) res += q.dl[i++];
  var top = new Float64Array(cols).fill(-1), col = 0;
  for (; i < n; i++) {
    var x = timed ? dev.tmono[q.ev[i]] : q.ev[i];
    if (x >= V.x1) break;
    var k = Math.min(cols - 1, Math.floor((x - x0) / span * cols));
    for (; col < k; col++) top[col] = Math.max(top[col], res);
    top[k] = Math.max(top[k], res);
    res += q.dl[i];
    top[k] = Math.max(top[k], res);
  }
  for (; col < cols; col++) top[col] = Math.max(top[col], res);
  return top;
}
function drawPoolLanes() {
  var box = $("poollanes"), lanes = poolSeries(dev), dpr = window.devicePixelRatio || 1;
  box.textContent = "";
  state.poolLanes = [];
  if (!lanes) { box.hidden = true; return; }
  box.hidden = false;
  lanes.forEach(function (q) {
    var top = poolColumns(q, M.cols), most = 0;
    for (var k = 0; k < M.cols; k++) most = Math.max(most, top[k]);
    var lane = el("div", ""), cv = document.createElement("canvas");
    lane.className = "pool-lane";
    lane.setAttribute("data-pool", q.id ? q.id.join(",") : "unknown");
    lane.appendChild(el("div", poolName(q.id) + ": at most " + fmtBytes(most) + " reserved in view"));
    cv.width = rcanvas.width; cv.height = Math.round(28 * dpr);
    lane.appendChild(cv);
    box.appendChild(lane);
    var c2 = cv.getContext("2d"), w = plotW(rcanvas) / M.cols, h = cv.height - 2, sy = h / Math.max(M.rmax, 1);
    c2.fillStyle = q.id && (q.id[0] || q.id[1]) ? "#2a9d8f" : "#f4a261";
    for (k = 0; k < M.cols; k++) if (top[k] > 0) c2.fillRect(PAD_L + k * w, 1 + h - top[k] * sy, Math.max(w, 1), top[k] * sy);
    state.poolLanes.push({pool: q.id, most: most});
  });
}
