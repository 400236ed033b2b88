// The Memory tab's compare view: runs chosen by the user, side by side, from the plugin's compare route
// (tbmem compare's own rows): their memory on shared axes (the step, or for runs of different lengths the
// share of each run), their census by category at the aligned points as stacked bars in the census
// colours, and the table of every metric with each run's difference from the first, with its sign.
// Runs keep one colour each (tbmem._internal.palette.RUNS). Strings from the logdir are only set as textContent.

import { BYTE_INCRS } from './chart.js';
import { api, el, fmtBytes, fmtByteTicks, setUrlState, table } from './util.js';

const GiB = 2 ** 30;
const MiB = 2 ** 20;
const LETTERS = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ';
const SEP = '|';  // between run names in the address (p.tbmem.compare=a|b); TensorBoard run names have none

function fmtMs(ms) { return Math.abs(ms) >= 1000 ? `${(ms / 1000).toPrecision(3)} s` : `${ms.toPrecision(3)} ms`; }

// One cell, as the kind of its row says (memory in the tags' units: GB, MB).
export function fmtCell(v, kind) {
  if (v == null) return 'n/a';
  if (kind === 'text') return String(v);
  if (!isFinite(v)) return String(v);
  if (kind === 'gb') return fmtBytes(v * GiB);
  if (kind === 'mb') return fmtBytes(v * MiB);
  if (kind === 'ms') return fmtMs(v);
  if (kind === 'pct') return `${v.toFixed(1)}%`;
  if (kind === 'count') return String(Math.round(v));
  return v.toPrecision(4);
}

export function fmtDiff(d, kind) {
  if (d == null || kind === 'text') return '';
  const s = fmtCell(d, kind);
  return d > 0 ? `+${s}` : d === 0 ? `±${s}` : s;
}

export function compareRuns(value) { return (value || '').split(SEP).filter((r) => r); }

// The view inside ``box``: ``runs`` is every run the tab lists ({run, memory}); ``palette`` tbmem._internal.palette.
export function createCompare(box, { palette, runs }) {
  const view = { doc: null, chart: null, selected: [], order: [] };  // order: as chosen (A is the first)
  const choices = el('div', { id: 'compare-runs', class: 'compare-runs' });
  const align = el('select', { id: 'compare-align' }, ...['auto', 'step', 'phase'].map((a) => el('option', { value: a, text: a })));
  const result = el('div', { id: 'compare-result' });
  box.replaceChildren(
    el('h2', { text: 'Compare runs' }),
    el('p', { class: 'hint', text: 'Choose two or more runs: their memory on shared axes, their census at aligned points and every metric of `tbmem compare` side by side, each run against the first chosen (A).' }),
    choices,
    el('div', { class: 'compare-controls' },
      el('label', {}, 'Align ', align),
      el('button', { id: 'compare-go', type: 'button', text: 'Compare', onclick: () => run() })),
    result);
  const known = runs.filter((m) => m.memory).map((m) => m.run);
  for (const r of known) {
    const box = el('input', { type: 'checkbox', value: r, 'data-run': r });
    box.addEventListener('change', () => {
      view.order = view.order.filter((x) => x !== r).concat(box.checked ? [r] : []);
    });
    choices.append(el('label', { class: 'compare-choice' }, box, ` ${r}`));
  }

  async function run(selected) {
    if (selected) {
      view.order = selected.filter((r, i) => known.includes(r) && selected.indexOf(r) === i);
      for (const i of choices.querySelectorAll('input')) i.checked = view.order.includes(i.value);
    }
    const chosen = view.order.slice();
    view.selected = chosen;
    setUrlState({ compare: chosen.join(SEP) || null, align: align.value === 'auto' ? null : align.value });
    if (chosen.length < 2) { result.replaceChildren(el('p', { class: 'empty', text: 'Choose at least two runs.' })); return; }
    result.replaceChildren(el('p', { class: 'hint', text: 'comparing…' }));
    const params = [...chosen.map((r) => ['run', r]), ['align', align.value], ['points', String(Math.max(100, Math.round(box.clientWidth || 1000)))]];
    let doc;
    try { doc = await api('compare', params); } catch (e) { result.replaceChildren(el('p', { class: 'error', text: String(e.message) })); return; }
    if (chosen.join(SEP) !== view.selected.join(SEP)) return;
    view.doc = doc;
    show(doc);
  }

  function show(doc) {
    if (view.chart) { view.chart.destroy(); view.chart = null; }
    if (doc.error) { result.replaceChildren(el('p', { class: 'error', text: doc.error })); return; }
    const c = doc.comparison;
    const colors = c.runs.map((_, i) => palette.runs[i % palette.runs.length]);
    const legend = el('ul', { class: 'compare-legend' }, ...c.runs.map((r, i) => {
      const sw = el('span', { class: 'swatch' });
      sw.style.background = colors[i];
      return el('li', {}, sw, el('b', { text: `${LETTERS[i]} ` }), r.run);
    }));
    const how = c.align === 'phase'
      ? 'Aligned by phase: the runs\' lengths differ, so the x axis is the share of each run and the census is each run\'s nearest to its start, middle and end.'
      : 'Aligned by step: the runs recorded the same steps; the census is compared at the first, middle and last census step they share.';
    const chartBox = el('div', { id: 'compare-chart' });
    result.replaceChildren(legend, el('p', { class: 'hint', text: how }),
      el('h3', { text: `${doc.lines.tag.includes('vram') ? 'Allocated VRAM' : 'Process RSS'} of each run` }), chartBox,
      el('div', { id: 'compare-bars' }), el('div', { id: 'compare-table' }));
    view.chart = drawLines(chartBox, doc.lines, c, colors, box.clientWidth || 1000);
    drawBars(document.getElementById('compare-bars'), c, palette);
    drawTable(document.getElementById('compare-table'), c);
  }

  return { run, view, setAlign: (a) => { if (a) align.value = a; } };
}

// One line per run on one x axis (the union of the runs' x; each line drawn through its own points).
function drawLines(box, lines, c, colors, width) {
  const xs = [...new Set(c.runs.flatMap((r) => (lines.runs[r.run] || { x: [] }).x))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const data = [xs];
  const series = [{ label: lines.axis }];
  c.runs.forEach((r, i) => {
    const col = xs.map(() => null);
    const line = lines.runs[r.run];
    if (line) line.x.forEach((x, j) => { col[at.get(x)] = line.y[j]; });
    data.push(col);
    series.push({ label: LETTERS[i], stroke: colors[i], width: 2, spanGaps: true, points: { show: xs.length <= 40 },
      value: (u, v) => (v == null ? '–' : fmtBytes(v)) });
  });
  const opts = { width, height: 260, series, cursor: { y: false },
    scales: { x: { time: false }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.05 : 1] } },
    axes: [{ label: lines.axis }, { size: 80, incrs: BYTE_INCRS, values: (u, ticks) => fmtByteTicks(ticks) }] };
  return new window.uPlot(opts, data, box);
}

// The census by category at each aligned point: a stacked bar per run, its width the run's total.
function drawBars(box, c, palette) {
  const cats = Object.keys(palette.categories);
  const points = c.points.map((p) => p.name);
  if (!points.length) { box.append(el('p', { class: 'hint', text: 'None of these runs has a census (MemoryWriter census_every > 0 takes one).' })); return; }
  box.append(el('h3', { text: 'Census by category at the aligned points' }));
  const rows = c.rows.filter((r) => r.section.startsWith('census at ') && r.kind === 'mb' && cats.includes(r.metric));
  const totals = c.rows.filter((r) => r.section.startsWith('census at ') && r.metric === 'total');
  const largest = Math.max(1e-12, ...totals.flatMap((r) => r.values.filter((v) => v != null)));
  for (const p of c.points) {
    const section = `census at ${p.name}`;
    const group = el('div', { class: 'compare-point' }, el('div', { class: 'hint', text: p.name }));
    c.runs.forEach((r, i) => {
      const step = p.steps[r.run];
      const total = (totals.find((t) => t.section === section) || { values: [] }).values[i];
      const bar = el('div', { class: 'stackbar' });
      bar.style.width = `${total == null ? 0 : (100 * total / largest).toFixed(2)}%`;
      for (const row of rows.filter((x) => x.section === section)) {
        const v = row.values[i];
        if (!v || !total) continue;
        const seg = el('div', { class: 'seg', title: `${row.metric}: ${fmtCell(v, 'mb')}` });
        seg.style.width = `${(100 * v / total).toFixed(2)}%`;
        seg.style.background = palette.categories[row.metric];
        seg.dataset.category = row.metric;
        bar.append(seg);
      }
      const text = step == null ? 'no census' : `step ${step}: ${fmtCell(total, 'mb')}`;
      group.append(el('div', { class: 'barrow' }, el('b', { text: LETTERS[i] }), el('div', { class: 'bartrack' }, bar), el('span', { text })));
    });
    box.append(group);
  }
  const key = el('div', { class: 'compare-key' }, ...cats.filter((k) => rows.some((r) => r.metric === k)).map((k) => {
    const sw = el('span', { class: 'swatch' });
    sw.style.background = palette.categories[k];
    return el('span', {}, sw, k);
  }));
  box.append(key);
}

function drawTable(box, c) {
  const letters = c.runs.map((_, i) => LETTERS[i]);
  const head = ['metric', ...letters, ...letters.slice(1).map((l) => `${l}−A`)];
  const body = [];
  let section = null;
  for (const row of c.rows) {
    if (row.section !== section) { section = row.section; body.push([el('b', { text: section }), ...head.slice(1).map(() => '')]); }
    const diffs = row.diffs.map((d) => {
      const span = el('span', { text: fmtDiff(d, row.kind) });
      if (d) span.className = d > 0 ? 'more' : 'less';
      return span;
    });
    body.push([row.metric, ...row.values.map((v) => fmtCell(v, row.kind)), ...diffs]);
  }
  box.append(el('h3', { text: 'Side by side (tbmem compare)' }), table(head, body, 'compare-table'));
}
