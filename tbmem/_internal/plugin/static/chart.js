// The Memory tab's chart: the census stacked in one panel and the memory lines (RSS, or VRAM) in a
// panel of their own under it, on the same steps, as report.png draws them. RSS also holds the
// interpreter and its libraries (hundreds of MiB): on one axis with a census of KiB it would sit on
// the stack as if it were its top. The run's per-step losses (Loss/batch, Loss/evaluation) get a third
// panel on the same steps (a log scale when they span more than two decades), so a loss spike lines up
// with the memory around it. Steps are integers, ticks too. Snapshot, out-of-memory and spike steps are
// lines across every panel, labelled in a strip above the first one, where a label can never cover a
// line or an axis label, and a label that would overlap another goes to the next row or is left out
// (its line stays; hovering it names it).

import { el, fmtBytes, fmtByteTicks } from './util.js';

// tick steps of the byte axes: powers of two from 1 B to 512 TiB, exact in every binary unit (a step of
// 500 KiB put 1000 KiB and 1.46 MiB on one axis); fmtByteTicks labels them in one unit
export const BYTE_INCRS = Array.from({ length: 50 }, (_, i) => 2 ** i);
// tick steps of the step axis: whole steps only
const STEP_INCRS = [0, 1, 2, 3, 4, 5, 6, 7, 8].flatMap((p) => [1, 2, 5].map((m) => m * 10 ** p));
const AXIS_SIZE = 80;  // the same y-axis width in both panels, so their x pixels line up
const LABEL_ROW = 14;  // CSS px per row of mark labels
const LABEL_ROWS = 2;
const LABEL_GAP = 6;   // CSS px kept between two labels of a row
const LABELS = { oom: 'OOM', snapshot: 'snapshot', spike: 'spike' };

// For each x index, the index of the nearest non-null value of a column: the legend and the hover
// of a census series show the census nearest to the cursor, not a gap between two censuses.
function nearestNonNull(col) {
  const n = col.length;
  const prev = new Int32Array(n);
  const out = new Int32Array(n);
  let last = -1;
  for (let i = 0; i < n; i++) { if (col[i] != null) last = i; prev[i] = last; }
  let next = -1;
  for (let i = n - 1; i >= 0; i--) {
    if (col[i] != null) next = i;
    const p = prev[i];
    out[i] = p < 0 ? next : next < 0 ? p : (i - p <= next - i ? p : next);
  }
  return out;
}

// Labels of the marks, left to right, each in the first row where it overlaps nothing; CSS px.
export function placeLabels(marks, measure, plotLeft, plotRight) {
  const rows = Array.from({ length: LABEL_ROWS }, () => []);
  const placed = [];
  let hidden = 0;
  for (const m of [...marks].sort((a, b) => a.px - b.px)) {
    const w = measure(m.text);
    let left = m.px + 3;
    if (left + w > plotRight) left = m.px - 3 - w;  // at the right edge: to the left of its line
    left = Math.max(plotLeft, left);
    const right = left + w;
    const row = rows.findIndex((r) => r.every((b) => right + LABEL_GAP <= b.left || left >= b.right + LABEL_GAP));
    if (row < 0) { hidden++; continue; }
    const box = { text: m.text, kind: m.kind, step: m.step, left, right, row };
    rows[row].push(box);
    placed.push(box);
  }
  return { placed, hidden };
}

function markColor(kind, palette) { return palette.marks[kind] || palette.marks.snapshot; }

function marksPlugin(chart, withLabels) {
  return {
    hooks: {
      draw: [(u) => {
        const { ctx, bbox } = u;
        const dpr = devicePixelRatio;
        const marks = [...chart.marks];
        if (chart.selected() != null) marks.push({ step: chart.selected(), kind: 'selected' });
        ctx.save();
        const drawn = [];
        for (const m of marks) {
          const px = Math.round(u.valToPos(m.step, 'x', true));
          if (px < bbox.left || px > bbox.left + bbox.width) continue;
          ctx.strokeStyle = markColor(m.kind, chart.palette);
          ctx.lineWidth = (m.kind === 'oom' || m.kind === 'spike' ? 2 : 1) * dpr;
          ctx.setLineDash(m.kind === 'snapshot' ? [4 * dpr, 3 * dpr] : m.kind === 'spike' ? [2 * dpr, 2 * dpr] : []);
          ctx.beginPath(); ctx.moveTo(px, bbox.top); ctx.lineTo(px, bbox.top + bbox.height); ctx.stroke();
          if (m.kind !== 'selected') drawn.push({ px: px / dpr, text: LABELS[m.kind] || m.kind, kind: m.kind, step: m.step });
        }
        if (withLabels) {
          ctx.setLineDash([]);
          ctx.font = `${11 * dpr}px sans-serif`;
          ctx.textBaseline = 'bottom';
          const plotTop = bbox.top / dpr;
          const { placed, hidden } = placeLabels(drawn, (t) => ctx.measureText(t).width / dpr,
            bbox.left / dpr, (bbox.left + bbox.width) / dpr);
          for (const b of placed) {
            b.bottom = plotTop - 2 - b.row * LABEL_ROW;
            b.top = b.bottom - LABEL_ROW + 2;
            ctx.fillStyle = markColor(b.kind, chart.palette);
            ctx.fillText(b.text, b.left * dpr, b.bottom * dpr);
          }
          chart.labels = { placed, hidden, plot: { left: bbox.left / dpr, top: plotTop, right: (bbox.left + bbox.width) / dpr } };
        }
        ctx.restore();
      }],
    },
  };
}

function stepAxis(chart, panel, label) {
  return { scale: 'x', label, incrs: STEP_INCRS, space: 60,
    values: (u, ticks) => { chart.xTicks[panel] = ticks.slice(); return ticks.map((t) => String(t)); } };
}

function bytesAxis(label) {
  return { values: (u, ticks) => fmtByteTicks(ticks), size: AXIS_SIZE, incrs: BYTE_INCRS, label };
}

// Draw the chart of an overview document into ``box``. ``opts``: palette, lines (the line group),
// stackColor(label, i), selected() (the clicked step), onClick(step, mark), width.
export function drawChart(box, doc, opts) {
  const chart = { plots: [], census: null, lines: null, labels: null, xTicks: {}, marks: doc.marks || [],
    palette: opts.palette, selected: opts.selected };
  const x = doc.x;
  const lo = x[0];
  const hi = x.length > 1 ? x[x.length - 1] : x[0] + 1;
  const xRange = () => [lo, hi];
  const lines = doc.lines[opts.lines] || [];
  const hasCensus = doc.stack.length > 0 && doc.census_steps.length > 0;
  const common = (panel, height, top, label) => ({
    width: opts.width, height, padding: [top, 16, 0, 0],
    // one step cursor across both panels; no horizontal line (its height means nothing in the other panel)
    cursor: { y: false, points: { show: false }, sync: { key: 'tbmem-steps' } },
    legend: { live: true }, scales: { x: { time: false, range: xRange }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.05 : 1] } },
    plugins: [marksPlugin(chart, top > 8)],
    axes: [stepAxis(chart, panel, label), null],
  });
  const strip = LABEL_ROWS * LABEL_ROW + 4;
  if (hasCensus) {
    const raw = doc.stack.map((s) => doc.columns[s.tag]);
    const acc = x.map(() => 0);
    const stacked = raw.map((col) => col.map((v, j) => (v == null ? null : (acc[j] += v))));
    const series = [{ label: 'step' }];
    doc.stack.forEach((s, i) => {
      const c = opts.stackColor(s.label, i);
      series.push({ label: s.label, stroke: c, fill: c + 'b0', width: 1, spanGaps: true, points: { show: false },
        value: (u, v, si, idx) => (idx == null ? '–' : fmtBytes(raw[si - 1][idx])) });
    });
    const data = [x, ...stacked];
    const nearest = data.map((col, i) => (i === 0 ? null : nearestNonNull(col)));
    const bands = [];
    for (let i = 2; i <= doc.stack.length; i++) bands.push({ series: [i, i - 1] });
    const o = common('census', lines.length ? 260 : 340, strip, lines.length ? undefined : 'step');
    o.series = series;
    o.bands = bands;
    o.axes[1] = bytesAxis('tensors (census, stacked)');
    o.cursor.dataIdx = (u, si, closest) => (nearest[si] ? nearest[si][closest] : closest);
    chart.census = new window.uPlot(o, data, box.appendChild(el('div', { class: 'panel', id: 'census-panel' })));
    chart.plots.push(chart.census);
  } else {
    box.append(el('p', { class: 'hint', id: 'no-census', text: 'No census in this run (MemoryWriter census_every > 0 takes one): memory lines only.' }));
  }
  if (lines.length) {
    const series = [{ label: 'step' }];
    lines.forEach((l, i) => series.push({ label: l.label, stroke: opts.palette.lines[i % opts.palette.lines.length], width: 2,
      dash: l.label.includes('peak') ? [6, 4] : undefined, spanGaps: true, points: { show: false }, value: (u, v) => fmtBytes(v) }));
    const data = [x, ...lines.map((l) => doc.columns[l.tag])];
    const nearest = data.map((col, i) => (i === 0 ? null : nearestNonNull(col)));
    const o = common('lines', hasCensus ? 200 : 340, hasCensus ? 8 : strip, 'step');
    o.series = series;
    o.axes[1] = bytesAxis(opts.lines === 'device' ? 'device memory' : 'process memory');
    o.cursor.dataIdx = (u, si, closest) => (nearest[si] ? nearest[si][closest] : closest);
    chart.lines = new window.uPlot(o, data, box.appendChild(el('div', { class: 'panel', id: 'lines-panel' })));
    chart.plots.push(chart.lines);
  }
  const losses = doc.loss || [];
  if (losses.length) drawLosses(chart, box, doc, losses, common, opts);
  for (const u of chart.plots) {
    u.over.addEventListener('click', () => {
      const idx = u.cursor.idx;
      if (idx == null) return;
      const left = u.cursor.left;
      const near = chart.marks.find((m) => m.id && Math.abs(u.valToPos(m.step, 'x') - left) <= 5);
      opts.onClick(u.data[0][idx], near);
    });
  }
  chart.redraw = () => chart.plots.forEach((u) => u.redraw(false));
  chart.setWidth = (width) => chart.plots.forEach((u) => u.setSize({ width, height: u.height }));
  chart.destroy = () => chart.plots.forEach((u) => u.destroy());
  return chart;
}

// The per-step losses in a panel of their own under the memory lines, on the same steps: a log scale when
// every value is positive and they span more than two decades (a falling loss stays readable).
function drawLosses(chart, box, doc, losses, common, opts) {
  const x = doc.x;
  const cols = losses.map((l) => doc.columns[l.tag]);
  const values = cols.flat().filter((v) => v != null);
  const positive = values.length && values.every((v) => v > 0);
  const log = positive && Math.max(...values) / Math.min(...values) > 100;
  const series = [{ label: 'step' }];
  losses.forEach((l, i) => series.push({ label: l.label, stroke: opts.palette.losses[i % opts.palette.losses.length],
    width: 1.5, spanGaps: true, points: { show: false }, value: (u, v) => (v == null ? '–' : v.toPrecision(4)) }));
  const data = [x, ...cols];
  const nearest = data.map((col, i) => (i === 0 ? null : nearestNonNull(col)));
  const o = common('loss', 150, 8, 'step');
  o.series = series;
  o.scales.y = log ? { distr: 3 } : { range: (u, min, max) => [Math.min(0, min), max > 0 ? max * 1.05 : 1] };
  o.axes[1] = { size: AXIS_SIZE, space: 18, label: log ? 'loss (log)' : 'loss', values: (u, ticks) => ticks.map((t) => (t == null ? '' : Number(t).toPrecision(2))) };
  o.cursor.dataIdx = (u, si, closest) => (nearest[si] ? nearest[si][closest] : closest);
  chart.loss = new window.uPlot(o, data, box.appendChild(el('div', { class: 'panel', id: 'loss-panel' })));
  chart.plots.push(chart.loss);
}
