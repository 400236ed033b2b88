// The Memory tab's view of a compact job (docs/distributed.md): a rank x step heat map of VRAM (RSS
// for a job without VRAM) from the job's Parquet rank tables, and the drill-down of one rank: its
// memory lines, whether or not it kept a TensorBoard run. Routes: heatmap, rank_series.

import { BYTE_INCRS } from './chart.js';
import { api, el, fmtBytes, fmtByteTicks } from './util.js';

// a perceptual ramp (viridis, 9 stops): low is dark blue, high is yellow
const RAMP = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141], [39, 173, 129],
  [92, 200, 99], [170, 220, 50], [253, 231, 37]];

function color(t) {
  const x = Math.min(Math.max(t, 0), 1) * (RAMP.length - 1);
  const i = Math.min(Math.floor(x), RAMP.length - 2);
  const f = x - i;
  return RAMP[i].map((c, k) => Math.round(c + f * (RAMP[i + 1][k] - c)));
}

function drawHeat(canvas, doc, lo, hi) {
  const rows = doc.ranks.length;
  const cols = doc.steps.length;
  canvas.width = cols;
  canvas.height = rows;
  const ctx = canvas.getContext('2d');
  const img = ctx.createImageData(cols, rows);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const v = doc.values[r][c];
      const at = 4 * (r * cols + c);
      const [red, green, blue] = v == null ? [235, 235, 235] : color(hi > lo ? (v - lo) / (hi - lo) : 1);
      img.data[at] = red; img.data[at + 1] = green; img.data[at + 2] = blue; img.data[at + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
}

// The heat map and, below it, the drill-down of the rank clicked (or chosen in the box).
export async function showJob(box, group, peaks) {
  const heat = await api('heatmap', { group });
  box.replaceChildren();
  if (!heat.tag) { box.append(el('p', { class: 'hint', text: 'No VRAM or RSS in the rank tables yet.' })); return; }
  const flat = heat.values.flat().filter((v) => v != null);
  const lo = Math.min(...flat);
  const hi = Math.max(...flat);
  const canvas = el('canvas', { id: 'heatmap', class: 'heatmap' });
  canvas.style.height = `${Math.min(Math.max(heat.ranks.length * 3, 120), 480)}px`;
  const pick = el('input', { id: 'drill-rank', type: 'number', min: String(heat.ranks[0]), max: String(heat.ranks[heat.ranks.length - 1]) });
  const drill = el('div', { id: 'drill' });
  const legend = el('div', { class: 'heat-legend' }, el('span', { text: fmtBytes(lo) }), el('span', { class: 'heat-ramp' }),
    el('span', { text: fmtBytes(hi) }));
  const top = peaks.filter((r) => r.rank != null).sort((a, b) => (b.peak_vram_allocated ?? b.peak_rss ?? 0) - (a.peak_vram_allocated ?? a.peak_rss ?? 0))[0];
  box.append(
    el('h3', { text: `${heat.tag}: ${heat.ranks.length} ranks x ${heat.steps.length} step bins (each bin its highest value)` }),
    el('div', { class: 'heat-axes' }, el('span', { class: 'hint', text: `rank ${heat.ranks[0]} (top) .. rank ${heat.ranks[heat.ranks.length - 1]} (bottom); steps ${heat.steps[0]} .. ${heat.steps[heat.steps.length - 1]} (left to right)` })),
    canvas, legend,
    el('label', { class: 'drill-label' }, 'Rank ', pick,
      el('button', { type: 'button', text: 'Show', onclick: () => drillDown(drill, group, Number(pick.value)) })),
    drill);
  drawHeat(canvas, heat, lo, hi);
  canvas.addEventListener('click', (ev) => {
    const box2 = canvas.getBoundingClientRect();
    const row = Math.min(heat.ranks.length - 1, Math.floor((ev.clientY - box2.top) / box2.height * heat.ranks.length));
    pick.value = String(heat.ranks[row]);
    drillDown(drill, group, heat.ranks[row]);
  });
  if (top) { pick.value = String(top.rank); await drillDown(drill, group, top.rank); }
}

async function drillDown(box, group, rank) {
  const doc = await api('rank_series', { group, rank });
  const tags = Object.keys(doc.series);
  box.replaceChildren(el('h3', { id: 'drill-title', text: `rank ${rank}: ${tags.length ? tags.join(', ') : 'no memory records'}` }));
  if (!tags.length || typeof uPlot === 'undefined') return;
  const steps = [...new Set(tags.flatMap((t) => doc.series[t].steps))].sort((a, b) => a - b);
  const index = new Map(steps.map((s, i) => [s, i]));
  const data = [steps, ...tags.map((t) => {
    const col = new Array(steps.length).fill(null);
    doc.series[t].steps.forEach((s, i) => { col[index.get(s)] = doc.series[t].values[i]; });
    return col;
  })];
  const strokes = ['#4e79a7', '#f28e2b', '#e15759', '#59a14f', '#b07aa1'];
  const chart = el('div', { id: 'drill-chart' });
  box.append(chart);
  // eslint-disable-next-line no-undef
  new uPlot({ width: Math.max(chart.clientWidth || 600, 300), height: 220, scales: { x: { time: false } },
    axes: [{}, { incrs: BYTE_INCRS, values: (u, vals) => fmtByteTicks(vals), size: 70 }],
    series: [{ label: 'step' }, ...tags.map((t, i) => ({ label: t, stroke: strokes[i % strokes.length], value: (u, v) => fmtBytes(v) }))] },
  data, chart);
}
